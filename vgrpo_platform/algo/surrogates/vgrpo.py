"""V-GRPO: GRPO whose policy likelihood is an ELBO surrogate of the whole denoising chain.

``prepare`` (rollout time, no gradient) draws the Monte-Carlo pairs and stores the old policy's
surrogate; ``loss`` recomputes it on the very same pairs with gradients and builds the PPO-clip
objective (docs/method.md section 4). The rollout sampler never matters: only the final clean latents
are scored.

``prepare`` writes a ``VGRPOState`` to ``batch.state`` (batch-first, so micro-batching slices it):
``t`` ``[B, K]``, ``eps`` ``[B, K, *L]``, ``old_loss`` ``[B]``, and, when ``kl_beta > 0``,
``old_x0`` or ``ref_x0`` ``[B, K, *L]`` (the KL anchor's x-predictions). When the trainer plans
one optimiser step per batch (``plan_updates(1)``), ``loss`` runs on the old policy itself, so
``prepare`` skips the old policy's forward and ``loss`` takes ``old_loss`` (and ``old_x0``) from its own
forward, detached: the same ratio of exactly 1 and the same gradient, for one forward pass fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vgrpo_platform.algo.surrogates import elbo
from vgrpo_platform.algo.surrogates.configs import VGRPOConfig
from vgrpo_platform.algo.surrogates.pairs import draw_batch_pairs, predict_x0_on_pairs
from vgrpo_platform.finetune import reference_mode
from vgrpo_platform.protocols import Adapter, BatchState, RolloutBatch, SurrogateBase


@dataclass
class VGRPOState(BatchState):
    """What ``prepare`` hands ``loss``: the pairs, and the old policy's surrogate and KL anchor."""

    t: torch.Tensor  # [B, K]
    eps: torch.Tensor  # [B, K, *L]
    old_loss: torch.Tensor | None = None  # [B]; None when the loss's own forward is the old policy's
    old_x0: torch.Tensor | None = None  # [B, K, *L], kl_anchor = "old"
    ref_x0: torch.Tensor | None = None  # [B, K, *L], kl_anchor = "reference"


class VGRPOSurrogate(SurrogateBase):
    """The ``vgrpo`` (and ``elbo_naive``) surrogate; see ``VGRPOConfig`` for the options."""

    def __init__(self, config: VGRPOConfig | None = None) -> None:
        self.config = config if config is not None else VGRPOConfig()

    @property
    def old_from_loss(self) -> bool:
        """With one step per batch (``plan_updates(1)``) the loss's own forward is the old policy's,
        unless the samples came from older weights (``samples_on_policy``)."""
        return self.gradient_steps == 1 and self.samples_on_policy

    def _pair_losses(self, x_hat: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """``[B, K]`` per-pair losses from ``x_hat`` ``[B, K, *L]`` and ``x0`` ``[B, *L]``."""
        latent_ndim = x0.ndim - 1
        return elbo.pair_loss(
            x_hat, x0.unsqueeze(1), latent_ndim, adaptive_weighting=self.config.adaptive_weighting
        )

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Draw the pairs, store them and the old policy's surrogate (and KL anchor) in ``batch.state``."""
        cfg = self.config
        x0 = batch.latents  # [B, *L]
        with torch.no_grad():
            latent_shape = tuple(x0.shape[1:])
            t, eps = draw_batch_pairs(batch, adapter, generator, cfg, latent_shape)  # [B, K], [B, K, *L]
            eps = eps.to(x0.dtype)
            state = VGRPOState(t=t, eps=eps)
            batch.state = state
            if not self.old_from_loss:
                x_hat = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)  # [B, K, *L]
                state.old_loss = elbo.surrogate_loss(self._pair_losses(x_hat, x0))  # [B]
            if cfg.kl_beta > 0:
                if cfg.kl_anchor == "old":
                    if not self.old_from_loss:
                        state.old_x0 = x_hat
                else:
                    with reference_mode(adapter):
                        state.ref_x0 = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """``-J + beta KL``, each a mean over the (micro-)batch's samples, and float metrics."""
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("VGRPOSurrogate.loss needs batch.advantages (compute them before the update)")
        state = batch.state_as(VGRPOState, "VGRPOSurrogate.loss")
        if state.old_loss is None and not self.old_from_loss:
            raise ValueError("VGRPOSurrogate.loss needs the old_loss written by prepare(); call it first")
        x0 = batch.latents  # [B, *L]
        x_hat = predict_x0_on_pairs(adapter, x0, state.t, state.eps, batch.cond)
        new_loss = elbo.surrogate_loss(self._pair_losses(x_hat, x0))  # [B]
        if state.old_loss is not None:
            old_loss = state.old_loss.to(new_loss.dtype)  # [B]
        else:  # one step per batch: this forward is the old policy's
            old_loss = new_loss.detach()
        rho = elbo.ratio(old_loss, new_loss)  # [B]
        advantages = batch.advantages.to(rho.dtype)  # [B]
        objective = elbo.ppo_clip_objective(rho, advantages, cfg.clip_range)
        loss = -objective

        kl = torch.zeros((), dtype=new_loss.dtype, device=new_loss.device)
        if cfg.kl_beta > 0:
            stored = state.old_x0 if cfg.kl_anchor == "old" else state.ref_x0
            if stored is not None:
                anchor = stored
            elif cfg.kl_anchor == "old" and self.old_from_loss:
                anchor = x_hat.detach()  # zero KL with zero gradient, as on any first step
            else:
                name = "old_x0" if cfg.kl_anchor == "old" else "ref_x0"
                raise ValueError(f"kl_beta > 0 but batch.state has no {name}; was prepare() run?")
            kl = elbo.kl_penalty(x_hat, anchor, x0.ndim - 1).mean()
            loss = loss + cfg.kl_beta * kl

        with torch.no_grad():
            clipped = elbo.clipped_mask(rho, advantages, cfg.clip_range)
            metrics = {
                "ratio_mean": float(rho.mean()),
                "ratio_min": float(rho.min()),
                "ratio_max": float(rho.max()),
                "clip_fraction": float(clipped.to(torch.float32).mean()),
                "kl": float(kl),
                "surrogate": float(new_loss.mean()),
                "surrogate_old": float(old_loss.mean()),
                "policy_objective": float(objective),
            }
        return loss, metrics
