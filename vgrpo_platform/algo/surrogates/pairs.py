"""The Monte-Carlo ``(t, eps)`` pairs the ELBO-style surrogates share: how they are drawn for a batch and
the model's x-predictions on them.

V-GRPO, AWM and DiffusionNFT all draw pairs the same way and predict on them the same way; one module
keeps them in step without any surrogate importing another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vgrpo_platform.algo.surrogates.configs import AWMConfig, VGRPOConfig
from vgrpo_platform.algo.timesteps import PairScope, draw_pairs
from vgrpo_platform.protocols import Adapter, RolloutBatch


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
