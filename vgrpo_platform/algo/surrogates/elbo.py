"""The ELBO surrogate of ``log pi_theta(o | c)`` and the PPO-style objective on it (pure functions).

docs/method.md sections 2 and 4. ``latent_ndim`` always says how many trailing dimensions form one
sample's latent (``len(L)``), so the same functions serve ``[B, *L]`` and ``[B, K, *L]`` tensors.
Everything here works in x-space (the paper's best variant); an epsilon- or velocity-space loss
would only change what the caller passes as ``x_hat`` and ``x0``.
"""

from __future__ import annotations

import torch

DEFAULT_MIN_DENOMINATOR = 1e-5
"""Floor of the adaptive weight's denominator (as DiffusionNFT): guards an exact fit, ``0 / 0``."""


def _latent_dims(latent_ndim: int) -> tuple[int, ...]:
    if latent_ndim < 1:
        raise ValueError(f"latent_ndim must be >= 1, got {latent_ndim}")
    return tuple(range(-latent_ndim, 0))


def pair_loss(
    x_hat: torch.Tensor,
    x0: torch.Tensor,
    latent_ndim: int,
    *,
    adaptive_weighting: bool = True,
    min_denominator: float = DEFAULT_MIN_DENOMINATOR,
) -> torch.Tensor:
    """Per-pair x-space denoising loss ``[...]`` from ``x_hat``, ``x0`` ``[..., *L]`` (broadcastable).

    Adaptive weighting: ``mean_d((x_hat - x0)^2) / sg(mean_d |x_hat - x0|)``. The stop-gradient makes
    the gradient ``grad(MSE) / L1``: it equalises gradient magnitudes across ``t`` (their raw scale
    spans orders of magnitude) without changing their direction. Off: the plain mean squared error.
    Computed in at least float32 whatever the model's dtype, since ratios exponentiate differences.
    """
    dims = _latent_dims(latent_ndim)
    dtype = torch.promote_types(torch.promote_types(x_hat.dtype, x0.dtype), torch.float32)
    diff = x_hat.to(dtype) - x0.to(dtype)  # [..., *L]
    mse = diff.square().mean(dim=dims)  # [...]
    if not adaptive_weighting:
        return mse
    weight = diff.detach().abs().mean(dim=dims).clamp_min(min_denominator)  # [...], no gradient
    return mse / weight


def surrogate_loss(pair_losses: torch.Tensor) -> torch.Tensor:
    """``L_hat = mean_j l_j``: ``[B, K]`` -> ``[B]``; ``log pi ~ -L_hat``."""
    return pair_losses.mean(dim=-1)


def log_ratio(old_loss: torch.Tensor, new_loss: torch.Tensor) -> torch.Tensor:
    """``log rho = L_hat(theta_old) - L_hat(theta)`` ``[B]`` (a lower loss = a likelier sample)."""
    return old_loss - new_loss


def ratio(old_loss: torch.Tensor, new_loss: torch.Tensor) -> torch.Tensor:
    """``rho = exp(L_old - L_new)`` ``[B]``: the mean over pairs sits inside one exp."""
    return torch.exp(log_ratio(old_loss, new_loss))


def ppo_clip_terms(rho: torch.Tensor, advantages: torch.Tensor, clip_range: float | None) -> torch.Tensor:
    """Per-sample ``min(rho A, clip(rho, 1 - e, 1 + e) A)`` ``[B]``; ``clip_range=None`` gives ``rho A``."""
    unclipped = rho * advantages
    if clip_range is None:
        return unclipped
    clipped = rho.clamp(1.0 - clip_range, 1.0 + clip_range) * advantages
    return torch.minimum(unclipped, clipped)


def ppo_clip_objective(rho: torch.Tensor, advantages: torch.Tensor, clip_range: float | None) -> torch.Tensor:
    """``J = mean_i min(rho_i A_i, clip(rho_i) A_i)``: the quantity to *maximise*."""
    return ppo_clip_terms(rho, advantages, clip_range).mean()


def clipped_mask(rho: torch.Tensor, advantages: torch.Tensor, clip_range: float | None) -> torch.Tensor:
    """``[B]`` bool: samples whose gradient the clip zeroes (the ratio left the trust region in the
    direction the advantage pushes it). ``clip_range=None`` clips nothing."""
    if clip_range is None:
        return torch.zeros_like(rho, dtype=torch.bool)
    return ((advantages > 0) & (rho > 1.0 + clip_range)) | ((advantages < 0) & (rho < 1.0 - clip_range))


def kl_penalty(x_new: torch.Tensor, x_anchor: torch.Tensor, latent_ndim: int) -> torch.Tensor:
    """``mean_j mean_d (x_new - x_anchor)^2`` per sample: ``[B, K, *L]`` -> ``[B]``.

    A squared distance between x-predictions on the stored pairs: zero when the policy equals the
    anchor (the old policy, or the frozen reference).
    """
    dims = _latent_dims(latent_ndim)
    dtype = torch.promote_types(torch.promote_types(x_new.dtype, x_anchor.dtype), torch.float32)
    per_pair = (x_new.to(dtype) - x_anchor.to(dtype)).square().mean(dim=dims)  # [B, K]
    return per_pair.mean(dim=-1)  # [B]
