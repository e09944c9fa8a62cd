"""Faults inside an iteration under both ``train.on_fault`` policies: a reward that returns NaN or
raises, a NaN loss, out of memory in a rollout. "stop" saves an exact checkpoint and says so in one
line; "skip" drops the iteration and goes on; neither loses saved work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RewardError
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics, without_timing
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints
from vgrpo_platform.training.recovery.faults import NonFiniteLossError, RolloutOutOfMemory, is_out_of_memory

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
BASE = ("train.iterations=5", "eval.every=0", "log.checkpoint_every=0", "log.diagnostics_every=0")


def toy(tmp_path: Path, name: str, *overrides: str):
    base = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", "log.progress='none'"]
    return resolve_recipe(TOY, [*base, *BASE, *overrides])


def kinds_of(records: list[dict]) -> list[tuple[str, int]]:
    """Each metrics record's kind and iteration, in the order written."""
    return [(r["kind"], r["iteration"]) for r in records]


def fail_on(trainer: Trainer, target: str, iterations: set[int], failure) -> None:
    """Make ``target`` ("reward", "loss" or "sample") fail while the trainer runs those iterations."""
    current = {"iteration": 0}
    original_iterate = trainer.iterate

    def iterate(iteration: int):
        current["iteration"] = iteration
        return original_iterate(iteration)

    trainer.iterate = iterate
    if target == "reward":
        obj, name = trainer.session.rewards[0].reward, "score"
    elif target == "loss":
        obj, name = trainer.session.surrogate, "loss"
    else:
        obj, name = trainer.session.adapter, "sample"
    original = getattr(obj, name)

    def patched(*args, **kwargs):
        out = original(*args, **kwargs)
        if current["iteration"] in iterations:
            return failure(out)
        return out

    setattr(obj, name, patched)


def nan_scores(out):
    return torch.full_like(torch.as_tensor(out), float("nan"))


def raise_(exc: BaseException):
    def fail(_out):
        raise exc

    return fail


def nan_loss(out):
    loss, metrics = out
    return loss * float("nan"), metrics


def test_stop_on_a_nan_reward_saves_the_previous_iteration_exactly_and_resume_matches(tmp_path):
    reference = Trainer(toy(tmp_path, "ref")).run()

    trainer = Trainer(toy(tmp_path, "nan"))
    fail_on(trainer, "reward", {3}, nan_scores)
    with pytest.raises(RewardError) as info:
        trainer.run()
    message = str(info.value)
    assert "\n" not in message
    assert "iteration 3" in message and "nan" in message.lower()
    assert "checkpoint of iteration 2 saved" in message and "on_fault = 'skip'" in message
    assert [p.name for p in list_checkpoints(trainer.run_dir)] == ["iter_000002"]

    # the reward is fixed: --resume replays iteration 3 from exactly the state it started with
    resumed = Trainer(toy(tmp_path, "nan"), resume=True).run()
    assert without_timing(read_metrics(resumed / "metrics.jsonl")) == without_timing(
        read_metrics(reference / "metrics.jsonl")
    )


def test_skip_drops_the_faulty_iteration_without_touching_the_weights_and_goes_on(tmp_path):
    trainer = Trainer(toy(tmp_path, "skip", "train.on_fault='skip'"))
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    original_iterate = Trainer.iterate

    def iterate_and_snapshot(iteration: int):
        snapshots[iteration] = {k: p.detach().clone() for k, p in trainer.session.trainable.items()}
        return original_iterate(trainer, iteration)

    trainer.iterate = iterate_and_snapshot
    fail_on(trainer, "reward", {2}, raise_(RuntimeError("reward server down")))
    trainer.run()

    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    kinds = kinds_of(records)
    assert kinds == [
        ("eval", 0),
        ("train", 1),
        ("skipped", 2),
        ("train", 3),
        ("train", 4),
        ("train", 5),
        ("eval", 5),
    ]
    skipped = records[2]
    assert "reward server down" in skipped["reason"] and "iteration 2" in skipped["reason"]
    for key in snapshots[2]:  # iteration 2 changed nothing, iteration 3 did
        assert torch.equal(snapshots[2][key], snapshots[3][key])
    assert any(not torch.equal(snapshots[3][k], snapshots[4][k]) for k in snapshots[3])
    assert [p.name for p in list_checkpoints(trainer.run_dir)] == ["iter_000005"]


def test_skip_still_stops_after_too_many_faults_in_a_row(tmp_path):
    trainer = Trainer(toy(tmp_path, "many", "train.on_fault='skip'", "train.max_consecutive_skips=2"))
    fail_on(trainer, "reward", {2, 3, 4}, nan_scores)
    with pytest.raises(RewardError, match="iteration 3"):
        trainer.run()
    kinds = kinds_of(read_metrics(trainer.run_dir / "metrics.jsonl"))
    assert kinds == [("eval", 0), ("train", 1), ("skipped", 2)]
    # the stop at iteration 3 saved the state after iteration 2 (a skipped one: the weights of 1)
    assert [p.name for p in list_checkpoints(trainer.run_dir)] == ["iter_000002"]


def test_a_nan_loss_stops_with_a_checkpoint_and_names_the_iteration(tmp_path):
    trainer = Trainer(toy(tmp_path, "loss"))
    fail_on(trainer, "loss", {4}, nan_loss)
    with pytest.raises(NonFiniteLossError) as info:
        trainer.run()
    message = str(info.value)
    assert "loss became nan at iteration 4" in message and "train.lr" in message
    assert [p.name for p in list_checkpoints(trainer.run_dir)] == ["iter_000003"]


def test_out_of_memory_in_a_rollout_is_skipped_with_advice(tmp_path):
    trainer = Trainer(toy(tmp_path, "oom", "train.on_fault='skip'"))
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    fail_on(trainer, "sample", {3}, raise_(oom))
    trainer.run()
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    skipped = [r for r in records if r["kind"] == "skipped"]
    assert [r["iteration"] for r in skipped] == [3]
    assert "out of memory during the rollout of iteration 3" in skipped[0]["reason"]
    assert "train.micro_batch_size" in skipped[0]["reason"]
    assert len([r for r in records if r["kind"] == "train"]) == 4


def test_a_bug_is_not_mistaken_for_a_fault(tmp_path):
    """Only the listed faults are caught: a plain error in the adapter keeps its traceback."""
    trainer = Trainer(toy(tmp_path, "bug", "train.on_fault='skip'"))
    fail_on(trainer, "sample", {2}, raise_(ValueError("shape mismatch")))
    with pytest.raises(ValueError, match="shape mismatch"):
        trainer.run()


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.OutOfMemoryError("CUDA out of memory"), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB"), True),
        (MemoryError(), True),
        (RuntimeError("size mismatch"), False),
    ],
)
def test_out_of_memory_is_recognised_on_gpu_and_cpu(exc, expected):
    assert is_out_of_memory(exc) is expected
    assert issubclass(RolloutOutOfMemory, Exception)


# ------------------------------------------------------------------ faults in an evaluation


def fail_eval_on(trainer: Trainer, iterations: set[int], failure) -> None:
    """Make the first reward fail (``failure`` of its output) in the evaluations of those iterations."""
    current = {"eval": None}
    original_evaluate = trainer.evaluate

    def evaluate(iteration: int, *, wall: float):
        current["eval"] = iteration
        try:
            return original_evaluate(iteration, wall=wall)
        finally:
            current["eval"] = None

    trainer.evaluate = evaluate
    reward = trainer.session.rewards[0].reward
    original = reward.score

    def patched(*args, **kwargs):
        out = original(*args, **kwargs)
        return failure(out) if current["eval"] in iterations else out

    reward.score = patched


def pending_of(run_dir: Path) -> list[tuple[str, object]]:
    import json

    return [
        (p.name, json.loads((p / "state.json").read_text()).get("eval_pending"))
        for p in list_checkpoints(run_dir)
    ]


@pytest.mark.parametrize("at", [0, 2, 5])
def test_stop_on_an_evaluation_fault_saves_that_iteration_and_resume_reruns_the_evaluation(tmp_path, at):
    """The first, a middle and the final evaluation: a checkpoint of the evaluated iteration, marked
    pending; --resume re-runs that evaluation first and ends with the uninterrupted run's metrics."""
    every = ("eval.every=2",)
    reference = Trainer(toy(tmp_path, "ref", *every)).run()

    trainer = Trainer(toy(tmp_path, "eval", *every))
    fail_eval_on(trainer, {at}, raise_(RuntimeError("judge offline")))
    with pytest.raises(RewardError) as info:
        trainer.run()
    message = str(info.value)
    assert "\n" not in message and "judge offline" in message
    assert f"evaluation of iteration {at} failed; checkpoint of iteration {at} saved" in message
    assert "--resume re-runs this evaluation" in message
    assert ("on_fault = 'skip'" in message) is (at != 5)  # the final evaluation is never skipped
    assert [(name, bool(p)) for name, p in pending_of(trainer.run_dir)][-1] == (f"iter_{at:06d}", True)
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    assert [(r["kind"], r["iteration"]) for r in records][-1:] == ([("train", at)] if at else [])

    resumed = Trainer(toy(tmp_path, "eval", *every), resume=True).run()  # the reward works again
    assert without_timing(read_metrics(resumed / "metrics.jsonl")) == without_timing(
        read_metrics(reference / "metrics.jsonl")
    )
    assert all(p is None for _, p in pending_of(resumed))  # re-saved once its evaluation was done


def test_skip_drops_a_failed_evaluation_and_goes_on_but_not_the_final_one(tmp_path):
    every = ("eval.every=2", "train.on_fault='skip'")
    trainer = Trainer(toy(tmp_path, "skip_eval", *every))
    fail_eval_on(trainer, {0, 2, 5}, nan_scores)
    with pytest.raises(RewardError) as info:
        trainer.run()
    message = str(info.value)
    assert "the final evaluation of iteration 5 failed" in message and "never skipped" in message
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    kinds = kinds_of(records)
    assert kinds == [
        ("eval_skipped", 0),
        ("train", 1),
        ("train", 2),
        ("eval_skipped", 2),
        ("train", 3),
        ("train", 4),
        ("eval", 4),
        ("train", 5),
    ]
    assert "returned nan" in records[0]["reason"] and "rewards must be finite" in records[0]["reason"]
    assert [(name, bool(p)) for name, p in pending_of(trainer.run_dir)] == [("iter_000005", True)]
    resumed = Trainer(toy(tmp_path, "skip_eval", *every), resume=True).run()
    kinds = kinds_of(read_metrics(resumed / "metrics.jsonl"))
    assert kinds[-2:] == [("train", 5), ("eval", 5)]


def test_evaluation_faults_count_towards_max_consecutive_skips(tmp_path):
    trainer = Trainer(
        toy(tmp_path, "in_a_row", "train.on_fault='skip'", "train.max_consecutive_skips=2", "eval.every=1")
    )
    fail_on(trainer, "reward", {2}, nan_scores)  # iteration 2 skipped: one fault
    fail_eval_on(trainer, {2}, nan_scores)  # its evaluation: the second in a row
    with pytest.raises(RewardError) as info:
        trainer.run()
    assert "max_consecutive_skips" in str(info.value)
    kinds = kinds_of(read_metrics(trainer.run_dir / "metrics.jsonl"))
    assert kinds == [("eval", 0), ("train", 1), ("eval", 1), ("skipped", 2)]
    assert [name for name, _ in pending_of(trainer.run_dir)] == ["iter_000002"]
