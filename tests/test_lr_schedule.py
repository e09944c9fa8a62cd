"""The learning-rate schedule against its closed form, and its wiring into the trainer's optimiser."""

from __future__ import annotations

import math

import pytest
import torch

from vgrpo_platform.config.schema import TrainSection
from vgrpo_platform.training.iteration.optimizer import build_lr_schedule, lr_factor


@pytest.mark.parametrize("warmup", [0, 5])
def test_cosine_matches_its_closed_form(warmup: int) -> None:
    total, final = 50, 0.2
    for step in range(total + 10):
        got = lr_factor(step, warmup_steps=warmup, total_steps=total, schedule="cosine", final_ratio=final)
        if step < warmup:
            expected = (step + 1) / warmup
        else:
            progress = min(1.0, (step - warmup) / (total - warmup))
            expected = final + (1 - final) * (math.cos(math.pi * progress) + 1) / 2
        assert got == pytest.approx(expected)
    assert lr_factor(total, warmup_steps=warmup, total_steps=total, schedule="cosine", final_ratio=final) == (
        pytest.approx(final)
    )


def test_constant_only_warms_up() -> None:
    factors = [
        lr_factor(s, warmup_steps=4, total_steps=9, schedule="constant", final_ratio=0.1) for s in range(9)
    ]
    assert factors == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_the_trainer_schedule_spans_every_optimiser_step_of_the_run() -> None:
    train = TrainSection(
        iterations=10, gradient_steps_per_iteration=2, lr=1e-2, lr_schedule="cosine", lr_final_ratio=0.1
    )
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=train.lr)
    schedule = build_lr_schedule(optimizer, train)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[0] == pytest.approx(1e-2)
    assert rates[10] == pytest.approx(1e-2 * (0.1 + 0.9 * 0.5))  # half-way through 20 steps
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # the floor after the last step
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
