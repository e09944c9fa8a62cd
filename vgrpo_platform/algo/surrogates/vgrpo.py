"""V-GRPO: GRPO whose policy likelihood is an ELBO surrogate of the whole denoising chain.

``prepare`` (rollout time, no gradient) draws the Monte-Carlo pairs and stores the old policy's
surrogate; ``loss`` recomputes it on the very same pairs with gradients and builds the PPO-clip
objective (docs/method.md section 4). The rollout sampler never matters: only the final clean latents
are scored.

``batch.extras`` keys written by ``prepare`` (batch-first, so micro-batching slices them):
``"t"`` ``[B, K]``, ``"eps"`` ``[B, K, *L]``, ``"old_loss"`` ``[B]``, and, when ``kl_beta > 0``,
``"old_x0"`` or ``"ref_x0"`` ``[B, K, *L]`` (the KL anchor's x-predictions). When the trainer plans
one optimiser step per batch (``plan_updates(1)``), ``loss`` runs on the old policy itself, so
``prepare`` skips the old policy's forward and ``loss`` takes ``old_loss`` (and ``old_x0``) from its own
forward, detached: the same ratio of exactly 1 and the same gradient, for one forward pass fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vgrpo_platform.algo.surrogates import elbo
from vgrpo_platform.algo.surrogates.configs import AWMConfig, VGRPOConfig
from vgrpo_platform.algo.timesteps import PairScope, draw_pairs
from vgrpo_platform.protocols import Adapter, RolloutBatch, SurrogateBase


def predict_x0_on_pairs(
    adapter: Adapter, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, cond: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The model's x-predictions on every stored pair: ``[B, K, *L]``.

    One ``adapter.predict`` call per pair index ``k`` (each on a ``[B, *L]`` batch), so peak memory
    grows with the micro-batch, not with ``B * K``.
    """
    schedule = adapter.schedule
    preds = []
    for k in range(t.shape[1]):
        t_k = t[:, k]  # [B]
        eps_k = eps[:, k].to(x0.dtype)  # [B, *L]
        z_t = schedule.noise(x0, eps_k, t_k)  # [B, *L]
        out = adapter.predict(z_t, t_k, cond)  # [B, *L]
        preds.append(schedule.predict_x0(z_t, out, t_k))
    return torch.stack(preds, dim=1)  # [B, K, *L]


@dataclass(frozen=True)
class PairScheme:
    """How many pairs a surrogate draws per sample, who shares them, and the clamp of ``t``.

    ``VGRPOConfig`` and ``AWMConfig`` carry these fields themselves; a surrogate with a fixed scheme
    (DiffusionNFT: independent, unstratified draws) builds one of these instead.
    """

    n_mc: int
    pair_scope: PairScope
    stratified: bool
    t_min: float
    t_max: float


def draw_batch_pairs(
    batch: RolloutBatch,
    adapter: Adapter,
    generator: torch.Generator,
    scheme: PairScheme | VGRPOConfig | AWMConfig,
    latent_shape: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``draw_pairs`` for ``batch`` under ``scheme``: ``(t [B, K], eps [B, K, *L])``.

    Every pair-drawing surrogate draws on the adapter's warp, on the batch's device and (data-parallel)
    rows, in at least float32; one place keeps them in step. AWM passes ``latent_shape = (1,)``: it
    uses the shared timesteps only.
    """
    x0 = batch.latents
    return draw_pairs(
        batch.group_ids,
        scheme.n_mc,
        latent_shape,
        generator=generator,
        scope=scheme.pair_scope,
        stratified=scheme.stratified,
        warp=adapter.schedule.warp,
        t_min=scheme.t_min,
        t_max=scheme.t_max,
        device=x0.device,
        dtype=torch.promote_types(x0.dtype, torch.float32),
        rows=batch.rows,
    )


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
        """Draw the pairs, store them and the old policy's surrogate (and KL anchor) in ``batch.extras``."""
        cfg = self.config
        x0 = batch.latents  # [B, *L]
        with torch.no_grad():
            latent_shape = tuple(x0.shape[1:])
            t, eps = draw_batch_pairs(batch, adapter, generator, cfg, latent_shape)  # [B, K], [B, K, *L]
            eps = eps.to(x0.dtype)
            batch.extras["t"] = t
            batch.extras["eps"] = eps
            if not self.old_from_loss:
                x_hat = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)  # [B, K, *L]
                batch.extras["old_loss"] = elbo.surrogate_loss(self._pair_losses(x_hat, x0))  # [B]
            if cfg.kl_beta > 0:
                if cfg.kl_anchor == "old":
                    if not self.old_from_loss:
                        batch.extras["old_x0"] = x_hat
                else:
                    from vgrpo_platform.finetune import reference_mode

                    with reference_mode(adapter):
                        batch.extras["ref_x0"] = predict_x0_on_pairs(adapter, x0, t, eps, batch.cond)

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """``-J + beta KL``, each a mean over the (micro-)batch's samples, and float metrics."""
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("VGRPOSurrogate.loss needs batch.advantages (compute them before the update)")
        if "t" not in batch.extras or ("old_loss" not in batch.extras and not self.old_from_loss):
            raise ValueError("VGRPOSurrogate.loss needs the extras written by prepare(); call it first")
        x0 = batch.latents  # [B, *L]
        x_hat = predict_x0_on_pairs(adapter, x0, batch.extras["t"], batch.extras["eps"], batch.cond)
        new_loss = elbo.surrogate_loss(self._pair_losses(x_hat, x0))  # [B]
        if "old_loss" in batch.extras:
            old_loss = batch.extras["old_loss"].to(new_loss.dtype)  # [B]
        else:  # one step per batch: this forward is the old policy's
            old_loss = new_loss.detach()
        rho = elbo.ratio(old_loss, new_loss)  # [B]
        advantages = batch.advantages.to(rho.dtype)  # [B]
        objective = elbo.ppo_clip_objective(rho, advantages, cfg.clip_range)
        loss = -objective

        kl = torch.zeros((), dtype=new_loss.dtype, device=new_loss.device)
        if cfg.kl_beta > 0:
            anchor_key = "old_x0" if cfg.kl_anchor == "old" else "ref_x0"
            if anchor_key == "old_x0" and anchor_key not in batch.extras and self.old_from_loss:
                anchor = x_hat.detach()  # zero KL with zero gradient, as on any first step
            elif anchor_key in batch.extras:
                anchor = batch.extras[anchor_key]
            else:
                raise ValueError(f"kl_beta > 0 but batch.extras has no {anchor_key!r}; was prepare() run?")
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
