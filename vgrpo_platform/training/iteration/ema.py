"""An exponential moving average of the trained weights (``train.ema_decay``): what evaluations,
sample grids and the exported model use, while the optimiser keeps stepping the raw weights.

Why: an online-RL policy moves with the noise of each small batch, so its held-out score swings
from one evaluation to the next by more than the evaluation's own sampling error. The average over
the last ``~1 / (1 - decay)`` optimiser steps follows the trend without the swing (Polyak
averaging; Flow-GRPO, DanceGRPO and DiffusionNFT keep one for the same reason).

The average mirrors each parameter as the model holds it: a plain tensor, or an FSDP2 shard
(``DTensor``) that averages its own slice; a checkpoint stores it gathered, under the parameter names.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext

import torch

from vgrpo_platform.finetune import values_swapped_in
from vgrpo_platform.parallel import sharded_state


class WeightAverage:
    """``average <- decay * average + (1 - decay) * weights`` after every optimiser step."""

    def __init__(self, trainable: Mapping[str, torch.Tensor], decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must lie in (0, 1), got {decay}")
        self.decay = decay
        self.average = {name: p.detach().clone() for name, p in trainable.items()}

    @torch.no_grad()
    def update(self, trainable: Mapping[str, torch.Tensor]) -> None:
        for name, p in trainable.items():
            self.average[name].lerp_(p.detach(), 1.0 - self.decay)

    def applied(self, trainable: Mapping[str, torch.Tensor]) -> AbstractContextManager[None]:
        """The averaged weights in the model inside the block; the trained ones, bit for bit, after it."""
        return values_swapped_in(trainable, self.average)

    def full_state(self) -> dict[str, torch.Tensor]:
        """Name -> full tensor, gathered like the weights (every rank must call it)."""
        return sharded_state.full_weights(self.average)

    def load_full_state(self, weights: dict[str, torch.Tensor]) -> None:
        """Full tensors back into the average, each rank keeping its slice."""
        sharded_state.load_weights(self.average, weights)


def served(
    average: WeightAverage | None, trainable: Mapping[str, torch.Tensor]
) -> AbstractContextManager[None]:
    """The weights users get (evaluations, grids, export): the moving average where there is one."""
    if average is None:
        return nullcontext()
    return average.applied(trainable)
