"""Runs of the toy recipe that several test modules make the same way: a short surrogate run through the
real loop (flow_grpo, nft_awm) and a run interrupted by a simulated crash (ema, train_e2e)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics

TOY = Path(__file__).resolve().parents[1] / "recipes" / "toy.toml"


def surrogate_toy_run(tmp_path: Path, surrogate: str, *overrides: str) -> tuple[list[dict], Trainer]:
    """Two iterations of the toy recipe trained by ``surrogate`` (one prompt, groups of 4, no evaluation,
    ``overrides`` after these settings) through the real loop. Asserts that the trainable weights moved;
    returns the run's train records and the trainer."""
    base = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        f"surrogate.name={surrogate!r}",
        "log.progress='none'",
        "log.save_grids=false",
        "train.iterations=2",
        "train.micro_batch_size=2",
        "eval.every=0",
        "eval.max_prompts=1",
        "eval.samples_per_prompt=1",
        "rollout.group_size=4",
        "rollout.prompts_per_iteration=1",
    ]
    trainer = Trainer(resolve_recipe(TOY, [*base, *overrides]))
    before = {k: p.detach().clone() for k, p in trainer.session.trainable.items()}
    run_dir = trainer.run()
    assert any(not torch.equal(p.detach(), before[k]) for k, p in trainer.session.trainable.items())
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"], trainer


def crash_at(monkeypatch: pytest.MonkeyPatch, iteration: int, run: Callable[[], Any]) -> None:
    """``run()`` while ``Trainer.iterate`` raises a simulated crash at ``iteration``: the crash must come
    out of ``run``. ``Trainer.iterate`` is the real one again afterwards."""
    original = Trainer.iterate

    def iterate_then_crash(self: Trainer, it: int) -> Any:
        if it == iteration:
            raise RuntimeError("simulated crash")
        return original(self, it)

    monkeypatch.setattr(Trainer, "iterate", iterate_then_crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run()
    monkeypatch.setattr(Trainer, "iterate", original)
