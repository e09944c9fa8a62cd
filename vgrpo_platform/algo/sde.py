"""The reverse-time SDE step of Flow-GRPO for rectified flow, and its Gaussian step log-probability.

Pure tensor math (docs/method.md section 6, ``flow_grpo``'s ``sde_step_with_logprob``). For
``z_t = (1 - t) x0 + t eps`` and a velocity ``v ~ eps - x0``, the score is
``-(z + (1 - t) v) / t``; the SDE with diffusion ``s(t)`` that keeps the ODE's marginals is
``dz = [v + s^2 / (2 t) (z + (1 - t) v)] dt + s dW``, integrated backwards (``dt = t_next - t < 0``):

- mean ``mu = z + [v + s^2 / (2 t) (z + (1 - t) v)] dt``;
- ``s = a sqrt(t / (1 - t))`` with ``a = 0.7``; at ``t = 1`` the ``1 - t`` is replaced by
  ``1 - t_cap`` (Flow-GRPO uses the second grid point) so the first step stays finite;
- ``z_next = mu + s sqrt(-dt) eps``, so one step is the Gaussian ``N(mu, s^2 |dt| I)``.

DanceGRPO's step is the same SDE with a constant diffusion ``s(t) = eta`` (``constant_diffusion``,
``eta = 0.3``): its ``flux_step`` writes the drift through the score of ``x0_hat = z - t v``, which
is ``-(z + (1 - t) v) / t`` again, and its step std is ``eta sqrt(t - t_next)``.

CPS (Wang & Yu, "Coefficients-Preserving Sampling for Reinforcement Learning with Flow Matching") is
a DDIM-like step instead (``cps_step``): from the predictions ``x0_hat = z - t v`` and
``eps_hat = z + (1 - t) v`` it rebuilds ``z_next`` with the coefficients of the noising law at
``t_next``, ``(1 - t_next) x0_hat + t_next [cos(a pi / 2) eps_hat + sin(a pi / 2) noise]``, so the
signal and noise coefficients stay those of ``z_t = (1 - t) x0 + t eps`` and no excess noise is left
in the sample. One step is ``N(mu, (t_next sin(a pi / 2))^2 I)``; the step to ``t_next = 0`` is
deterministic.

Log-probabilities are *averaged* over the latent dimensions, as every peer does, so their scale
does not depend on the resolution.
"""

from __future__ import annotations

import math

import torch

from vgrpo_platform.noise_schedules import expand_like

DEFAULT_NOISE_LEVEL = 0.7


def sde_diffusion(
    t: torch.Tensor, noise_level: float = DEFAULT_NOISE_LEVEL, t_cap: float | torch.Tensor | None = None
) -> torch.Tensor:
    """``s(t) = a sqrt(t / (1 - min(t, t_cap)))`` ``[B]``; ``t_cap=None`` = no cap (``t < 1`` required)."""
    denom_t = t if t_cap is None else t.clamp_max(t_cap)
    return noise_level * torch.sqrt(t / (1 - denom_t))


def constant_diffusion(t: torch.Tensor, eta: float) -> torch.Tensor:
    """DanceGRPO's ``s(t) = eta`` ``[B]``: finite at ``t = 1``, so it needs no cap."""
    return torch.full_like(t, eta)


def sde_step_mean(
    z: torch.Tensor, v: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    """``mu = z + [v + s^2 / (2 t) (z + (1 - t) v)] dt`` ``[B, *L]``; ``t``, ``t_next``, ``s`` ``[B]``."""
    tb, dt, sb = expand_like(t, z), expand_like(t_next - t, z), expand_like(s, z)
    return z + (v + sb.square() / (2 * tb) * (z + (1 - tb) * v)) * dt


def cps_step(
    z: torch.Tensor, v: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, noise_level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPS's step: ``(mean [B, *L], std [B])``; ``t``, ``t_next`` ``[B]``, ``a = noise_level`` in (0, 1].

    ``std = t_next sin(a pi / 2)`` and ``mu = (1 - t_next) x0_hat + sqrt(t_next^2 - std^2) eps_hat``
    with ``x0_hat = z - t v`` and ``eps_hat = z + (1 - t) v``: the mean's noise coefficient and the
    std add in quadrature to ``t_next``, the noise coefficient of the marginal at ``t_next``.
    """
    angle = noise_level * math.pi / 2
    std = t_next * math.sin(angle)  # [B]
    tb, tn = expand_like(t, z), expand_like(t_next, z)
    x0_hat, eps_hat = z - tb * v, z + (1 - tb) * v
    mean = (1 - tn) * x0_hat + tn * math.cos(angle) * eps_hat  # t_next cos = sqrt(t_next^2 - std^2)
    return mean, std


def constant_free_log_prob(x: torch.Tensor, mean: torch.Tensor, latent_ndim: int) -> torch.Tensor:
    """``-mean_d (x_d - mean_d)^2`` ``[...]``: the CPS authors' step "log-prob", all constants (the
    ``1 / (2 std^2)`` too) dropped, so its log-ratios are ``2 std^2`` times the Gaussian's."""
    dtype = torch.promote_types(torch.promote_types(x.dtype, mean.dtype), torch.float32)
    dims = tuple(range(-latent_ndim, 0))
    return -(x.to(dtype) - mean.to(dtype)).square().mean(dim=dims)


def std_kl(mean_a: torch.Tensor, mean_b: torch.Tensor, std: torch.Tensor, latent_ndim: int) -> torch.Tensor:
    """``mean_d (mean_a - mean_b)^2 / (2 std^2)`` ``[...]``: the KL of two steps of std ``std`` ``[...]``,
    per latent element (CPS steps, whose std is not ``s sqrt(|dt|)``)."""
    dtype = torch.promote_types(torch.promote_types(mean_a.dtype, mean_b.dtype), torch.float32)
    dims = tuple(range(-latent_ndim, 0))
    sq = (mean_a.to(dtype) - mean_b.to(dtype)).square().mean(dim=dims)
    return sq / (2 * std.to(dtype).square())


def ode_step(z: torch.Tensor, v: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor) -> torch.Tensor:
    """Deterministic Euler step ``z + v dt`` (the ``s = 0`` limit): MixGRPO's steps outside its window."""
    return z + v * expand_like(t_next - t, z)


def step_std(s: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor) -> torch.Tensor:
    """Standard deviation of one step, ``s sqrt(|dt|)`` ``[B]``."""
    return s * torch.sqrt((t - t_next).abs())


def gaussian_log_prob(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, latent_ndim: int
) -> torch.Tensor:
    """``mean_d log N(x_d; mean_d, std^2)`` ``[...]`` with one ``std`` per sample ``[...]``.

    Computed in at least float32: ratios exponentiate differences of these.
    """
    dtype = torch.promote_types(torch.promote_types(x.dtype, mean.dtype), torch.float32)
    dims = tuple(range(-latent_ndim, 0))
    stdb = std.to(dtype).reshape(std.shape + (1,) * latent_ndim)
    per_dim = -(x.to(dtype) - mean.to(dtype)).square() / (2 * stdb.square()) - torch.log(stdb)
    return per_dim.mean(dim=dims) - 0.5 * math.log(2 * math.pi)


def mean_kl(
    mean_a: torch.Tensor,
    mean_b: torch.Tensor,
    s: torch.Tensor,
    t: torch.Tensor,
    t_next: torch.Tensor,
    latent_ndim: int,
    *,
    include_dt: bool = True,
) -> torch.Tensor:
    """``mean_d (mean_a - mean_b)^2 / (2 var)`` ``[...]``: the KL between two steps of equal variance.

    ``include_dt=True``: ``var = s^2 |dt|``, the true ``KL(N(mean_a, var) || N(mean_b, var))`` divided
    by the number of latent elements. ``False``: ``var = s^2`` as Flow-GRPO writes it (its KL is then
    ``1 / |dt|`` times smaller; the difference is absorbed into its ``beta``).
    """
    dtype = torch.promote_types(torch.promote_types(mean_a.dtype, mean_b.dtype), torch.float32)
    var = s.to(dtype).square()
    if include_dt:
        var = var * (t - t_next).abs().to(dtype)
    dims = tuple(range(-latent_ndim, 0))
    sq = (mean_a.to(dtype) - mean_b.to(dtype)).square().mean(dim=dims)
    return sq / (2 * var)
