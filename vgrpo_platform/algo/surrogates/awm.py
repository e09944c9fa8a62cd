"""AWM (advantage-weighted matching): a flow-matching loss on the clean samples, weighted by advantages.

``log pi ~ -l`` with ``l`` the plain (not self-normalised) flow-matching error on pairs ``(t, eps)``:
timesteps stratified and shared as V-GRPO's (``pair_scope``), noise drawn independently per sample.
It is V-GRPO minus the shared noise and the adaptive weighting (docs/method.md section 6). Fully
on-policy its gradient is that of ``mean_i A_i mean_j l_ij``: advantage-weighted flow matching.

Velocity space (default): ``l = mean_d (v - (eps - x0))^2``, computed as ``|x_hat - x0|^2 / t^2``
(the same number for rectified flow, where ``x_hat - x0 = t (eps - x0 - v)``), so it works through
the schedule's ``predict_x0`` like the other surrogates.

The options of ``awm_authors`` reproduce the authors' training script (scxue/advantage_weighted_matching,
``scripts/train_sd3_awm.py`` with ``config/dgx_awm.py``): the generalised-Huber per-pair loss
``t ((l + 1e-10)^p - 1e-10^p) / p`` (``weighting = "ghuber"``, ``p = 0.25``), a penalty
``ema_beta mean_d |v - v_ema|^2`` toward an EMA copy of the policy whose decay is
``min(0.3, 0.001 step)``, timesteps drawn one per stratum of the first 90% of diffusers' 14-point
flow-matching grid (``timestep_grid``), advantages clamped to +-5 and scaled by 1/5, and a small
velocity KL to the reference. The EMA moves once per iteration, at ``prepare``, with the weights the
previous iteration ended on, as the authors' does after each epoch; it is not checkpointed (a resumed
run restarts it from the resumed weights).

``prepare`` writes an ``AWMState`` to ``batch.state``: ``t`` ``[B, K]``, ``eps`` ``[B, K, *L]``,
``old_pair_loss`` ``[B, K]``, ``old_loss`` ``[B]`` (the per-sample surrogate, read by the diagnostics),
with ``kl_beta > 0`` ``ref_x0`` and with ``ema_beta > 0`` ``ema_x0`` ``[B, K, *L]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from vgrpo_platform.algo.surrogates import elbo
from vgrpo_platform.algo.surrogates.configs import AWMConfig
from vgrpo_platform.algo.surrogates.ema_policy import EMAPolicy
from vgrpo_platform.algo.surrogates.pairs import draw_batch_pairs, predict_x0_on_pairs
from vgrpo_platform.algo.timesteps import pair_set_index
from vgrpo_platform.finetune import reference_mode
from vgrpo_platform.protocols import Adapter, BatchState, RolloutBatch, SurrogateBase

GHUBER_EPS = 1e-10
"""Added inside the power, and its power subtracted, so that ``l = 0`` gives 0 (AWM's constant)."""
DIFFUSERS_TRAIN_STEPS = 1000
"""``num_train_timesteps`` of diffusers' flow-matching scheduler: its grid ends at ``warp(1 / 1000)``."""


def fm_pair_losses(x_hat: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, space: str) -> torch.Tensor:
    """``[B, K]`` plain squared errors from ``x_hat`` ``[B, K, *L]``, ``x0`` ``[B, *L]``, ``t`` ``[B, K]``."""
    mse = elbo.pair_loss(x_hat, x0.unsqueeze(1), x0.ndim - 1, adaptive_weighting=False)  # [B, K]
    return mse / t.to(mse.dtype).square() if space == "velocity" else mse


def ghuber(loss: torch.Tensor, t: torch.Tensor, power: float) -> torch.Tensor:
    """AWM's generalised Huber ``t ((l + 1e-10)^p - 1e-10^p) / p`` ``[...]``.

    Its gradient in ``l`` is ``t (l + 1e-10)^(p - 1)``: pairs with a large error count less, and
    ``p = 1`` gives back ``t l``.
    """
    return t.to(loss.dtype) * ((loss + GHUBER_EPS).pow(power) - GHUBER_EPS**power) / power


def diffusers_flow_grid(steps: int, warp: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``[steps]`` sigmas of diffusers' ``FlowMatchEulerDiscreteScheduler.set_timesteps(steps)``.

    The scheduler spaces its timesteps linearly from 1 down to its (already shifted) smallest training
    sigma ``warp(1 / 1000)`` and shifts them again: ``warp(linspace(1, warp(1e-3), steps))``. AWM draws
    its training timesteps from these points (SD3.5, 14 steps, shift 3: ``1.0 .. 0.357`` for 0..11).
    """
    low = warp(torch.tensor(1.0 / DIFFUSERS_TRAIN_STEPS, dtype=torch.float64))
    u = torch.from_numpy(np.linspace(1.0, float(low), steps))
    return warp(u)


def stratified_grid_indices(
    n_sets: int, k: int, low: int, high: int, generator: torch.Generator | None
) -> torch.Tensor:
    """``[n_sets, k]`` grid indices, one uniform draw in each of ``k`` strata of ``[low, high)``.

    AWM's rule: boundaries ``linspace(low, high, k + 1)`` truncated to integers, index
    ``lower + floor(u (upper - lower))``; a stratum narrower than one index gives its lower bound.
    """
    bounds = torch.linspace(low, high, k + 1, dtype=torch.float64).long()
    lower, upper = bounds[:-1], bounds[1:]  # [k]
    device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(n_sets, k, generator=generator, device=device, dtype=torch.float64).cpu()
    return lower + (u * (upper - lower)).long()  # [n_sets, k]


@dataclass
class AWMState(BatchState):
    """What ``prepare`` hands ``loss``: the pairs, the old policy's losses on them and the anchors."""

    t: torch.Tensor  # [B, K]
    eps: torch.Tensor  # [B, K, *L]
    old_pair_loss: torch.Tensor  # [B, K]
    old_loss: torch.Tensor  # [B], the per-sample surrogate (read by the diagnostics)
    ref_x0: torch.Tensor | None = None  # [B, K, *L], kl_beta > 0
    ema_x0: torch.Tensor | None = None  # [B, K, *L], ema_beta > 0


class AWMSurrogate(SurrogateBase):
    """The ``awm`` and ``awm_authors`` surrogates; see ``AWMConfig``."""

    def __init__(self, config: AWMConfig | None = None) -> None:
        self.config = config if config is not None else AWMConfig()
        self.ema = EMAPolicy()
        self.steps_done = 0  # optimiser steps so far (this process)
        self._ema_at = 0  # steps_done when the EMA last moved

    def after_step(self, adapter: Adapter) -> None:
        """Called by the loop after each optimiser step: counts the steps the EMA decay depends on."""
        self.steps_done += 1

    def ema_decay(self) -> float:
        """AWM's ``min(ema_max, ema_rate * step)`` after ``steps_done`` optimiser steps."""
        return min(self.config.ema_max, self.config.ema_rate * self.steps_done)

    def _move_ema(self, denoiser: torch.nn.Module) -> None:
        """Once per iteration: ``ema <- d ema + (1 - d) weights`` if a step happened since the last move."""
        self.ema.initialise(denoiser)
        if self.steps_done != self._ema_at:
            self.ema.update(denoiser, self.ema_decay())
            self._ema_at = self.steps_done

    def _timesteps(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> torch.Tensor:
        """``[B, K]`` shared stratified timesteps: continuous strata, or AWM's grid points."""
        cfg = self.config
        if cfg.timestep_grid is None:
            t, _ = draw_batch_pairs(batch, adapter, generator, cfg, (1,))  # shared noise unused: only t
            return t
        x0 = batch.latents
        pair_dtype = torch.promote_types(x0.dtype, torch.float32)
        grid = diffusers_flow_grid(cfg.timestep_grid, adapter.schedule.warp)  # [G]
        high = int(cfg.timestep_grid * cfg.timestep_fraction)
        low = 1 if cfg.grid_skip_first else 0
        if high <= low:
            raise ValueError(f"timestep_fraction {cfg.timestep_fraction} leaves no grid point to train on")
        n_sets, index = pair_set_index(
            batch.group_ids if batch.rows is None else batch.rows.global_group_ids, cfg.pair_scope
        )
        if batch.rows is not None:
            index = batch.rows.local(index, len(batch))
        sets = grid[stratified_grid_indices(n_sets, cfg.n_mc, low, high, generator)]  # [S, K]
        return sets[index.cpu()].to(x0.device, pair_dtype)  # [B, K]

    def _pair_losses(self, x_hat: torch.Tensor, x0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``[B, K]``: the plain error, or its generalised Huber."""
        cfg = self.config
        loss = fm_pair_losses(x_hat, x0, t, cfg.space)
        return ghuber(loss, t, cfg.ghuber_power) if cfg.weighting == "ghuber" else loss

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Shared stratified timesteps, independent noise; the old policy's per-pair losses."""
        cfg = self.config
        x0 = batch.latents
        latent_shape = tuple(x0.shape[1:])
        pair_dtype = torch.promote_types(x0.dtype, torch.float32)
        if cfg.ema_beta > 0:
            self._move_ema(adapter.denoiser)
        with torch.no_grad():
            t = self._timesteps(batch, adapter, generator)  # [B, K]
            n_rows = len(batch) if batch.rows is None else len(batch.rows.global_group_ids)
            eps = torch.randn(
                (n_rows, cfg.n_mc, *latent_shape),
                generator=generator,
                device=generator.device,
                dtype=pair_dtype,
            )  # [N, K, *L], one draw per sample of the global batch
            if batch.rows is not None:  # a data-parallel rank keeps its rows
                eps = batch.rows.local(eps, len(batch))
            eps = eps.to(x0.device, x0.dtype)  # [B, K, *L]
            x_hat = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)
            old = self._pair_losses(x_hat, x0, t)  # [B, K]
            state = AWMState(t=t, eps=eps, old_pair_loss=old, old_loss=old.mean(dim=1))
            batch.state = state
            if cfg.kl_beta > 0:
                with reference_mode(adapter):
                    state.ref_x0 = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)
            if cfg.ema_beta > 0:
                with self.ema.applied(adapter.denoiser):
                    state.ema_x0 = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)

    def advantages(self, batch: RolloutBatch, dtype: torch.dtype) -> torch.Tensor:
        """``[B]`` ``clamp(A, -adv_clip, adv_clip) * adv_scale`` (AWM: +-5, then 1/5)."""
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("AWM needs the batch's advantages; the loop sets them before the update")
        adv = batch.advantages.to(dtype)
        if cfg.adv_clip is not None:
            adv = adv.clamp(-cfg.adv_clip, cfg.adv_clip)
        return adv * cfg.adv_scale

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """``-mean PPO-clip(rho, A)`` with per-pair or per-sample ratios, ``+ kl_beta KL + ema_beta EMA``."""
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("AWMSurrogate.loss needs batch.advantages (compute them before the update)")
        state = batch.state_as(AWMState, "AWMSurrogate.loss")
        x0, t = batch.latents, state.t
        x_hat = predict_x0_on_pairs(adapter, x0, t, state.eps, batch.cond)  # [B, K, *L]
        new = self._pair_losses(x_hat, x0, t)  # [B, K]
        old = state.old_pair_loss.to(new.dtype)
        adv = self.advantages(batch, new.dtype)  # [B]
        if cfg.ratio_mode == "per_pair":
            rho = elbo.ratio(old, new)  # [B, K]
            objective = elbo.ppo_clip_terms(rho, adv[:, None].expand_as(rho), cfg.clip_range).mean()
        else:
            rho = elbo.ratio(old.mean(dim=1), new.mean(dim=1))  # [B]
            objective = elbo.ppo_clip_objective(rho, adv, cfg.clip_range)
        loss = -objective
        kl = self._velocity_distance(x_hat, t, state.ref_x0, "ref_x0", cfg.kl_beta)
        ema = self._velocity_distance(x_hat, t, state.ema_x0, "ema_x0", cfg.ema_beta)
        loss = loss + cfg.kl_beta * kl + cfg.ema_beta * ema
        with torch.no_grad():
            metrics = {
                "ratio_mean": float(rho.mean()),
                "ratio_min": float(rho.min()),
                "ratio_max": float(rho.max()),
                "kl": float(kl),
                "ema_penalty": float(ema),
                "ema_decay": self.ema_decay(),
                "surrogate": float(new.mean()),
                "surrogate_old": float(old.mean()),
                "policy_objective": float(objective),
            }
        return loss, metrics

    @staticmethod
    def _velocity_distance(
        x_hat: torch.Tensor, t: torch.Tensor, anchor: torch.Tensor | None, name: str, weight: float
    ) -> torch.Tensor:
        """``mean_{i,k} mean_d |v - v_anchor|^2 = |x_hat - x_anchor|^2 / t^2`` (rectified flow); 0 if off."""
        if weight <= 0:
            return torch.zeros((), dtype=torch.float32, device=x_hat.device)
        if anchor is None:
            raise ValueError(f"a weight on {name} but batch.state has none; was prepare() run?")
        sq = elbo.pair_loss(x_hat, anchor, x_hat.ndim - 2, adaptive_weighting=False)  # x_hat [B, K, *L]
        return (sq / t.to(sq.dtype).square()).mean()
