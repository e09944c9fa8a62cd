"""DiffusionNFT: policy improvement on the forward process, with implicit positive / negative policies.

No likelihood at all: on noised clean samples the trained velocity ``v_theta`` is mixed with the
frozen old policy's ``v_old`` into ``v+ = (1 - b) v_old + b v_theta`` and ``v- = (1 + b) v_old -
b v_theta``; the loss fits ``v+`` to the data with weight ``r`` and ``v-`` with weight ``1 - r``,
where ``r = 1/2 + 1/2 clip(A / A_max, -1, 1)`` is the sample's "optimality probability". Both fits
are x-space losses with the adaptive weight ``MSE / sg(L1)`` (NVlabs/DiffusionNFT), and the sum is
scaled by ``A_max / b`` as there. At ``v_theta = v_old`` its gradient is ``(2r - 1) A_max`` times the
gradient of the (self-normalised) flow-matching loss: positive samples are fitted, negative ones
pushed away, and ``r = 1/2`` samples only pull ``v_theta`` back toward ``v_old``.

The old policy is an EMA of the trainable weights, kept here and swapped in while it is evaluated;
the loop calls ``after_step(adapter)`` after each optimiser step to update it with DiffusionNFT's
decay schedule ``min(max(step - flat, 0) rate, max)`` (decay 0: the old policy is the current one).
Its state is not checkpointed: a resumed run restarts the EMA from the resumed weights.

``prepare`` writes an ``NFTState`` to ``batch.state``: ``t`` ``[B, K]``, ``eps`` ``[B, K, *L]``
(independent per sample).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vgrpo_platform.algo.surrogates import elbo
from vgrpo_platform.algo.surrogates.configs import DiffusionNFTConfig
from vgrpo_platform.algo.surrogates.ema_policy import EMAPolicy
from vgrpo_platform.algo.surrogates.pairs import PairScheme, draw_batch_pairs
from vgrpo_platform.finetune import reference_mode
from vgrpo_platform.protocols import Adapter, BatchState, RolloutBatch, SurrogateBase


def optimality_probability(advantages: torch.Tensor, adv_clip: float) -> torch.Tensor:
    """``r = 1/2 + 1/2 clip(A / adv_clip, -1, 1)`` ``[B]``."""
    return 0.5 + 0.5 * (advantages / adv_clip).clamp(-1.0, 1.0)


def implicit_policies(
    v_theta: torch.Tensor, v_old: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(v+, v-)`` = ``((1 - b) v_old + b v_theta, (1 + b) v_old - b v_theta)``; ``v_old`` is detached."""
    v_old = v_old.detach()
    return (1 - beta) * v_old + beta * v_theta, (1 + beta) * v_old - beta * v_theta


def nft_loss(
    x_pos: torch.Tensor,
    x_neg: torch.Tensor,
    x0: torch.Tensor,
    r: torch.Tensor,
    *,
    beta: float,
    adv_clip: float,
    latent_ndim: int,
    adaptive_weighting: bool = True,
) -> torch.Tensor:
    """Per-sample ``A_max (r l(x+) + (1 - r) l(x-)) / b`` ``[...]`` from x-predictions ``[..., *L]``.

    ``l`` is ``elbo.pair_loss`` (self-normalised by default); ``r`` broadcasts over ``[...]``.
    """
    pos = elbo.pair_loss(x_pos, x0, latent_ndim, adaptive_weighting=adaptive_weighting)
    neg = elbo.pair_loss(x_neg, x0, latent_ndim, adaptive_weighting=adaptive_weighting)
    return adv_clip * (r * pos + (1 - r) * neg) / beta


def ema_decay(step: int, flat: int, rate: float, maximum: float) -> float:
    """DiffusionNFT's decay after ``step`` optimiser steps: 0 before ``flat``, then linear to ``maximum``."""
    return 0.0 if step < flat else min((step - flat) * rate, maximum)


@dataclass
class NFTState(BatchState):
    """What ``prepare`` hands ``loss``: the independent pairs (the old policy is evaluated in the loss)."""

    t: torch.Tensor  # [B, K]
    eps: torch.Tensor  # [B, K, *L]


class DiffusionNFTSurrogate(SurrogateBase):
    """The ``diffusion_nft`` surrogate; see ``DiffusionNFTConfig``."""

    def __init__(self, config: DiffusionNFTConfig | None = None) -> None:
        self.config = config if config is not None else DiffusionNFTConfig()
        self.old_policy = EMAPolicy()
        self.steps_done = 0

    def after_step(self, adapter: Adapter) -> None:
        """Called by the loop after each optimiser step: move the old policy toward the current one."""
        cfg = self.config
        self.steps_done += 1
        decay = ema_decay(self.steps_done, cfg.ema_flat, cfg.ema_rate, cfg.ema_max)
        self.old_policy.update(adapter.denoiser, decay)

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """Draw independent ``(t, eps)`` per sample (no sharing, no strata: DiffusionNFT has neither)."""
        cfg = self.config
        self.old_policy.initialise(adapter.denoiser)
        x0 = batch.latents
        scheme = PairScheme(
            cfg.n_timesteps, pair_scope="sample", stratified=False, t_min=cfg.t_min, t_max=cfg.t_max
        )
        t, eps = draw_batch_pairs(batch, adapter, generator, scheme, tuple(x0.shape[1:]))
        batch.state = NFTState(t=t, eps=eps.to(x0.dtype))

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over samples and draws of ``nft_loss`` ``+ kl_beta |v_theta - v_ref|^2``."""
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("DiffusionNFTSurrogate.loss needs batch.advantages (set before the update)")
        state = batch.state_as(NFTState, "DiffusionNFTSurrogate.loss")
        x0 = batch.latents  # [B, *L]
        latent_ndim = x0.ndim - 1
        t_all, eps_all = state.t, state.eps  # [B, K], [B, K, *L]
        r = optimality_probability(batch.advantages, cfg.adv_clip)  # [B]
        schedule = adapter.schedule
        zs = [schedule.noise(x0, eps_all[:, k], t_all[:, k]) for k in range(t_all.shape[1])]  # K x [B, *L]
        # frozen predictions first: swapping weights in place must not touch a graph being built
        with torch.no_grad():
            with self.old_policy.applied(adapter.denoiser):
                v_olds = [adapter.predict(z, t_all[:, k], batch.cond) for k, z in enumerate(zs)]
            v_refs = []
            if cfg.kl_beta > 0:
                with reference_mode(adapter):
                    v_refs = [adapter.predict(z, t_all[:, k], batch.cond) for k, z in enumerate(zs)]
        losses, kls, deviations = [], [], []
        for k, z in enumerate(zs):
            t = t_all[:, k]
            v = adapter.predict(z, t, batch.cond)
            work = torch.promote_types(v.dtype, torch.float32)  # float32 at least, whatever the model's
            v_pos, v_neg = implicit_policies(v.to(work), v_olds[k].to(work), cfg.beta)
            x_pos = schedule.predict_x0(z.to(work), v_pos, t)
            x_neg = schedule.predict_x0(z.to(work), v_neg, t)
            losses.append(
                nft_loss(
                    x_pos,
                    x_neg,
                    x0,
                    r,
                    beta=cfg.beta,
                    adv_clip=cfg.adv_clip,
                    latent_ndim=latent_ndim,
                    adaptive_weighting=cfg.adaptive_weighting,
                )
            )
            deviations.append((v.detach().to(work) - v_olds[k].to(work)).square().flatten(1).mean(1))
            if v_refs:
                kls.append((v.to(work) - v_refs[k].to(work)).square().flatten(1).mean(1))
        policy = torch.stack(losses, dim=1).mean()
        kl = torch.stack(kls, dim=1).mean() if kls else torch.zeros((), device=policy.device)
        loss = policy + cfg.kl_beta * kl
        metrics = {
            "policy_loss": float(policy.detach()),
            "kl": float(kl.detach()),
            "old_deviation": float(torch.stack(deviations).mean()),
            "optimality_mean": float(r.mean()),
            "ema_decay": ema_decay(self.steps_done, cfg.ema_flat, cfg.ema_rate, cfg.ema_max),
        }
        return loss, metrics
