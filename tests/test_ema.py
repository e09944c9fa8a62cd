"""The weights' moving average (``train.ema_decay``): the recurrence against its closed form, the
swap in and out, and a toy run whose evaluations see the average while training never does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from toy_runs import crash_at

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.training.iteration.ema import WeightAverage
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics, without_timing
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"


def test_average_equals_the_closed_form_weighted_sum():
    """After weights w_1..w_n: decay^n * w_0 + sum_k (1 - decay) * decay^(n-k) * w_k."""
    generator = torch.Generator().manual_seed(0)
    decay, n = 0.9, 7
    w0 = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    param = torch.nn.Parameter(w0.clone())
    average = WeightAverage({"w": param}, decay)
    history = []
    for _ in range(n):
        with torch.no_grad():
            param.copy_(torch.randn(3, 4, generator=generator, dtype=torch.float64))
        history.append(param.detach().clone())
        average.update({"w": param})
    expected = decay**n * w0 + sum((1 - decay) * decay ** (n - k) * w for k, w in enumerate(history, start=1))
    torch.testing.assert_close(average.average["w"], expected, rtol=1e-12, atol=1e-12)


def test_applied_swaps_the_average_in_and_restores_the_trained_weights_bit_for_bit():
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
    average = WeightAverage({"w": param}, 0.5)
    with torch.no_grad():
        param.copy_(torch.tensor([3.0, 4.0, 5.0]))
    average.update({"w": param})  # average = [2, 3, 4]
    trained = param.detach().clone()
    with average.applied({"w": param}):
        assert torch.equal(param.detach(), torch.tensor([2.0, 3.0, 4.0]))
    assert torch.equal(param.detach(), trained)
    with pytest.raises(RuntimeError, match="inside"), average.applied({"w": param}):
        raise RuntimeError("inside")
    assert torch.equal(param.detach(), trained), "restored even when the block raises"
    with pytest.raises(ValueError, match="decay"):
        WeightAverage({"w": param}, 1.0)


def _run(tmp_path: Path, name: str, *overrides: str, resume: bool = False) -> Path:
    settings = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        f"run.name={name!r}",
        "log.progress='none'",
        "train.iterations=4",
        "eval.every=2",
        "log.checkpoint_every=2",
        *overrides,
    ]
    return Trainer(resolve_recipe(TOY, settings), resume=resume).run()


def _records(run_dir: Path, kind: str) -> list[dict]:
    records = read_metrics(run_dir / "metrics.jsonl")
    return without_timing([r for r in records if r["kind"] == kind])


def test_a_run_trains_the_raw_weights_and_evaluates_the_average(tmp_path):
    plain = _run(tmp_path, "plain", "train.ema_decay=0")  # 0, like none, is off
    averaged = _run(tmp_path, "ema", "train.ema_decay=0.5")
    assert _records(averaged, "train") == _records(plain, "train"), "the average never touches training"
    evals_plain, evals_ema = _records(plain, "eval"), _records(averaged, "eval")
    assert evals_ema[0] == evals_plain[0], "before the first step the average is the model"
    assert evals_ema[-1]["reward"] != evals_plain[-1]["reward"]

    last = load_checkpoint(list_checkpoints(averaged)[-1])
    assert last.averaged is not None and last.served_weights is last.averaged
    assert load_checkpoint(list_checkpoints(plain)[-1]).averaged is None
    # the logged final evaluation is the averaged weights', re-evaluated in a fresh trainer
    where = [f"run.output_dir={tmp_path.as_posix()!r}", "run.name='fresh'", "log.progress='none'"]
    fresh = Trainer(resolve_recipe(TOY, where))
    with torch.no_grad():
        for name, p in fresh.session.trainable.items():
            p.copy_(last.averaged[name])
    assert fresh.evaluate(4, wall=0.0)["reward"] == pytest.approx(evals_ema[-1]["reward"], abs=1e-6)


def test_resume_restores_the_average(tmp_path, monkeypatch):
    reference = _run(tmp_path, "ref", "train.ema_decay=0.5")
    crash_at(monkeypatch, 3, lambda: _run(tmp_path, "crash", "train.ema_decay=0.5"))
    resumed = _run(tmp_path, "crash", "train.ema_decay=0.5", resume=True)
    assert _records(resumed, "eval") == _records(reference, "eval")
    done, expected = (load_checkpoint(list_checkpoints(d)[-1]).averaged for d in (resumed, reference))
    assert done.keys() == expected.keys()
    assert all(torch.equal(done[k], expected[k]) for k in done)
