"""The optimiser (AdamW on the trained parameters) and its learning-rate schedule: linear warm-up,
then constant or a cosine down to a floor.

RL fine-tuning with a constant rate drifts until it collapses on small models (the quickstart at
lr 2e-3 turns black after ~350 iterations); a cosine that ends at a fraction of the peak keeps the
early progress and stops the drift. Pretraining (``vgrpo pretrain-shapes``) uses the same formula.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch

from vgrpo_platform.config.schema import TrainSection


def build_optimizer(params: Iterable[torch.nn.Parameter], train: TrainSection) -> torch.optim.Optimizer:
    """AdamW with the recipe's ``train`` settings."""
    return torch.optim.AdamW(
        params, lr=train.lr, betas=train.adam_betas, eps=train.adam_eps, weight_decay=train.weight_decay
    )


def lr_factor(
    step: int,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: Literal["constant", "cosine"],
    final_ratio: float,
) -> float:
    """Multiplier of the peak rate at optimiser step ``step`` (0-based).

    Warm-up reaches 1 at step ``warmup_steps - 1`` (step 0 already moves: ``1 / warmup_steps``);
    the cosine then falls from 1 to ``final_ratio`` at ``total_steps`` and stays there.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_schedule(
    optimizer: torch.optim.Optimizer, train: TrainSection
) -> torch.optim.lr_scheduler.LambdaLR:
    """The recipe's schedule over all optimiser steps of the run (iterations x gradient steps)."""
    total = train.iterations * train.gradient_steps_per_iteration
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(
            step,
            warmup_steps=train.warmup_steps,
            total_steps=total,
            schedule=train.lr_schedule,
            final_ratio=train.lr_final_ratio,
        ),
    )
