"""``[scoring]``: rewards in a worker process and scored while the rollout goes on give the very same
run as inline scoring; a worker that dies is restarted (or stops the run through ``train.on_fault``
with a checkpoint); bad combinations are one-line recipe errors."""

from __future__ import annotations

from pathlib import Path

import crashing_reward
import pytest
import torch

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError, RewardError
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import Samples
from vgrpo_platform.training.iteration.reward_workers import GroupFeeder, InlineScorer
from vgrpo_platform.training.iteration.scoring import WeightedReward
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics, without_timing
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
# 16 rows an iteration in chunks of 4 (micro_batch_size): groups of 8 complete every second chunk
BASE = ("train.iterations=3", "eval.every=2", "log.checkpoint_every=0", "log.diagnostics_every=0")
BASE += ("train.micro_batch_size=4",)


@pytest.fixture(scope="module")
def registry():
    return collect_components(build_plugin_manager(extra_plugins=[crashing_reward]))


def toy(tmp_path: Path, name: str, *overrides: str, registry=None):
    base = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", "log.progress='none'"]
    return resolve_recipe(TOY, [*base, *BASE, *overrides], registry=registry)


def comparable(run_dir: Path) -> list[dict]:
    return without_timing(read_metrics(run_dir / "metrics.jsonl"))


# a group reward beside the main one: the worker, fed chunks of 4 rows, must still score groups of 8
DIVERSITY = ("rewards.1.name='diversity'", "rewards.1.weight=0.2")


def test_worker_process_with_overlap_gives_exactly_the_inline_run(tmp_path):
    inline = Trainer(toy(tmp_path, "inline", *DIVERSITY)).run()
    isolated = toy(tmp_path, "worker", *DIVERSITY, "scoring.isolation='process'", "scoring.overlap=true")
    worker = Trainer(isolated).run()
    expected, got = comparable(inline), comparable(worker)
    assert [r["kind"] for r in got] == ["eval", "train", "train", "eval", "train", "eval"]
    assert got == expected  # rewards, advantages, losses and evaluations to the last bit
    train = [r for r in read_metrics(worker / "metrics.jsonl") if r["kind"] == "train"]
    assert all(r["time_scoring"] > 0 for r in train)
    assert all("reward/diversity" in r for r in train)  # so the comparison above covers it


def test_threaded_overlap_gives_exactly_the_inline_run(tmp_path):
    inline = Trainer(toy(tmp_path, "inline")).run()
    overlapped = Trainer(toy(tmp_path, "thread", "scoring.overlap=true")).run()
    assert comparable(overlapped) == comparable(inline)


class SizeRecorder:
    """Records the prompts of every call; scores each image by its mean."""

    modalities = frozenset({"image"})

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def score(self, samples, prompts, metadata):
        self.calls.append(list(prompts))
        return samples.data.flatten(1).mean(1)


@pytest.mark.parametrize("chunk", [1, 3, 8, 20])
def test_feeder_sends_whole_groups_in_order_and_the_scores_match_one_call(chunk):
    group, prompts = 4, [f"p{i // 4}" for i in range(20)]  # 5 groups of 4 rows
    data = torch.rand(20, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    recorder = SizeRecorder()
    scorer = InlineScorer([WeightedReward("r", recorder, 1.0)], overlap=True)
    feeder = GroupFeeder(scorer, prompts, group, step=1)
    for start in range(0, 20, chunk):
        feeder(Samples("image", data[start : start + chunk]))
    terms, _ = scorer.collect(feeder.finish())
    scorer.close()
    assert all(len(call) % group == 0 for call in recorder.calls)  # whole groups only
    assert [p for call in recorder.calls for p in call] == prompts  # each row once, in order
    assert torch.equal(terms["r"], data.flatten(1).mean(1))
    # a chunk as large as the batch is one call; chunks of one row, one call per group
    if chunk >= 20:
        assert len(recorder.calls) == 1
    if chunk == 1:
        assert len(recorder.calls) == 5


def test_a_worker_that_dies_is_restarted_and_the_run_is_unchanged(tmp_path, registry):
    die = tmp_path / "die"
    reward = ["rewards.0.name='crashing_brightness'", f"rewards.0.options.die_file={die.as_posix()!r}"]
    reference = Trainer(toy(tmp_path, "ref", *reward, registry=registry)).run()  # inline: never dies

    trainer = Trainer(toy(tmp_path, "restart", *reward, "scoring.isolation='process'", registry=registry))
    original = trainer.iterate

    def iterate(iteration: int):
        if iteration == 2:
            die.touch()
        return original(iteration)

    trainer.iterate = iterate
    run_dir = trainer.run()
    records = read_metrics(run_dir / "metrics.jsonl")
    restarts = [r for r in records if r["kind"] == "reward_worker_restarted"]
    assert len(restarts) == 1 and restarts[0]["iteration"] == 2
    assert "died at iteration 2" in restarts[0]["reason"] and "\n" not in restarts[0]["reason"]
    assert [r for r in comparable(run_dir) if r["kind"] != "reward_worker_restarted"] == comparable(reference)


def test_a_worker_that_keeps_dying_stops_the_run_with_a_resumable_checkpoint(tmp_path, registry):
    die = tmp_path / "die"
    reward = ["rewards.0.name='crashing_brightness'", f"rewards.0.options.die_file={die.as_posix()!r}"]
    worker = [
        *reward,
        "rewards.0.options.once=false",
        "scoring.isolation='process'",
        "scoring.max_restarts=1",
    ]
    trainer = Trainer(toy(tmp_path, "dies", *worker, registry=registry))
    original = trainer.iterate

    def iterate(iteration: int):
        if iteration == 3:
            die.touch()
        return original(iteration)

    trainer.iterate = iterate
    with pytest.raises(RewardError) as info:
        trainer.run()
    message = str(info.value)
    assert "\n" not in message
    assert "reward worker process died at iteration 3" in message and "scoring.max_restarts = 1" in message
    assert "checkpoint of iteration 2 saved" in message
    assert [p.name for p in list_checkpoints(trainer.run_dir)] == ["iter_000002"]

    die.unlink()  # the reward is fixed: --resume finishes the run, as one that never failed would
    resumed = Trainer(toy(tmp_path, "dies", *worker, registry=registry), resume=True).run()
    reference = Trainer(toy(tmp_path, "ref", *reward, registry=registry)).run()
    assert [r for r in comparable(resumed) if r["kind"] != "reward_worker_restarted"] == comparable(reference)


def test_a_reward_that_cannot_build_in_the_worker_fails_at_start_up_in_one_line(tmp_path):
    recipe = toy(tmp_path, "bad", "scoring.isolation='process'")
    bad = recipe.rewards[0]
    object.__setattr__(bad, "spec", bad.spec.__class__(**{**bad.spec.__dict__, "factory": _raising_factory}))
    with pytest.raises(RewardError, match=r"could not build its rewards: OSError: no weights at /nowhere"):
        Trainer(recipe)


def _raising_factory(config, context):
    raise OSError("no weights at /nowhere")


def test_a_reward_a_worker_cannot_receive_is_a_recipe_error(tmp_path):
    recipe = toy(tmp_path, "local", "scoring.isolation='process'")
    bad = recipe.rewards[0]
    object.__setattr__(bad, "spec", bad.spec.__class__(**{**bad.spec.__dict__, "factory": lambda c, x: None}))
    with pytest.raises(RecipeError, match="cannot be sent to a worker"):
        Trainer(recipe)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["scoring.device='cuda:1'"], "scoring.device applies to the reward worker"),
        (["scoring.worker_threads=2"], "scoring.worker_threads applies to the reward worker"),
        (["scoring.isolation='process'", "train.offload_rewards=true"], "remove one of the two"),
        (["scoring.isolaton='process'"], "isolaton"),
    ],
)
def test_scoring_keys_that_do_not_fit_are_one_line_recipe_errors(tmp_path, overrides, needle):
    with pytest.raises(RecipeError) as info:
        toy(tmp_path, "x", *overrides)
    assert needle in str(info.value) and "\n" not in str(info.value)
