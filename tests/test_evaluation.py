"""Evaluation: one code path for training's evaluations and ``vgrpo eval``, which repeats a run's
numbers to the last digit; evaluation-only rewards are scored but never trained on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vgrpo_platform.cli import app as cli
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.evaluation import diversity, standard_error
from vgrpo_platform.training.observe.metrics import read_metrics, without_timing

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
TINY = ["train.iterations=2", "rollout.group_size=4", "eval.every=0", "log.diagnostics_every=0"]
DARKNESS = ["eval.rewards.0.name=brightness", "eval.rewards.0.options.target=0.0", "eval.rewards.0.weight=2"]


def sets(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [
        f"run.output_dir={tmp_path.as_posix()!r}",
        f"run.name={name!r}",
        "log.progress='none'",
        *TINY,
        *extra,
    ]


def records(run_dir: Path, kind: str) -> list[dict]:
    found = read_metrics(run_dir / "metrics.jsonl")
    return without_timing([r for r in found if r["kind"] == kind])


# ------------------------------------------------------------------------------------------ units
def test_diversity_is_the_mean_pairwise_rms_difference_per_prompt():
    a = torch.zeros(3, 2, 2)
    same = torch.stack([a, a, a + 0.5, a + 0.5])  # prompt 0: two equal samples; prompt 1: also equal
    assert diversity(same, 2).tolist() == [0.0, 0.0]
    spread = torch.stack([a, a + 0.2, a + 0.6])  # pairs differ by 0.2, 0.6, 0.4 everywhere
    assert diversity(spread, 3).tolist() == pytest.approx([0.4])
    with pytest.raises(ValueError, match="at least 2"):
        diversity(spread, 1)


def test_standard_error_is_the_unbiased_std_over_root_n():
    values = torch.tensor([1.0, 2.0, 4.0, 7.0])
    assert standard_error(values) == pytest.approx(float(values.std(unbiased=True)) / 2.0)
    assert math.isnan(standard_error(torch.tensor([3.0])))


# ------------------------------------------------------------------------------------------ training
def test_evaluation_only_rewards_are_scored_but_never_trained_on(tmp_path):
    plain = Trainer(resolve_recipe(TOY, sets(tmp_path, "plain"))).run()
    watched = Trainer(resolve_recipe(TOY, sets(tmp_path, "watched", *DARKNESS))).run()
    assert records(watched, "train") == records(plain, "train")
    for before, after in zip(records(plain, "eval"), records(watched, "eval"), strict=True):
        assert after.items() >= before.items()  # the same numbers, and more
        extra = set(after) - set(before)
        assert extra == {"reward/brightness_eval", "monitor/reward"}
        assert after["reward/brightness_eval"] == pytest.approx(-after["reward/brightness"], abs=1e-6)
        assert after["monitor/reward"] == pytest.approx(2 * after["reward/brightness_eval"], abs=1e-6)
        assert after["monitor/diversity"] > 0
    assert not any("brightness_eval" in k for r in records(watched, "train") for k in r)


# ------------------------------------------------------------------------------------------ vgrpo eval
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[str]]:
    tmp_path = tmp_path_factory.mktemp("eval")
    overrides = sets(tmp_path, "run", *DARKNESS, "train.ema_decay=0.5")
    return Trainer(resolve_recipe(TOY, overrides)).run(), overrides


def vgrpo_eval(overrides: list[str], *args: str):
    argv = ["eval", str(TOY), *args]
    for item in overrides:
        argv += ["--set", item]
    result = CliRunner().invoke(cli.app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def test_eval_of_a_run_repeats_its_last_evaluation_to_the_last_digit(trained, tmp_path):
    run_dir, overrides = trained
    first = vgrpo_eval(overrides, "--checkpoint", str(run_dir), "--out", str(tmp_path / "a"))
    report = json.loads((tmp_path / "a" / "eval.json").read_text())
    last = records(run_dir, "eval")[-1]
    metrics = {k: v for k, v in last.items() if k not in ("kind", "iteration")}
    assert {k: r["mean"] for k, r in report["results"].items()} == metrics  # exactly: one code path
    assert report["checkpoint"]["iteration"] == 2 and report["checkpoint"]["weights"] == "moving average"
    protocol = report["protocol"]
    assert (protocol["seed"], protocol["samples_per_prompt"], protocol["sampler"], protocol["steps"]) == (
        1234,
        2,
        "dpmsolver++",
        8,
    )
    assert protocol["prompts"] == ["a bright image", "a dark image"]
    assert [r["key"] for r in protocol["eval_rewards"]] == ["brightness_eval"]
    for key in metrics:
        assert key in first.stdout
    assert str(tmp_path / "a" / "eval.json") in first.stdout

    vgrpo_eval(overrides, "--checkpoint", str(run_dir), "--out", str(tmp_path / "b"))
    again = json.loads((tmp_path / "b" / "eval.json").read_text())
    assert again["results"] == report["results"] and again["per_prompt"] == report["per_prompt"]

    # the grid's layout holds each sample's reward: the standard error is theirs
    layout = json.loads((tmp_path / "a" / "grid.json").read_text())
    rewards = torch.tensor([x for tile in layout["tiles"] for x in tile["rewards"]])
    assert report["results"]["reward"]["n"] == len(rewards) == 4
    assert report["results"]["reward"]["sem"] == pytest.approx(standard_error(rewards), rel=1e-6)
    assert report["results"]["monitor/diversity"]["n"] == 2  # one value per prompt
    prompts = report["per_prompt"]
    assert [p["prompt"] for p in prompts] == protocol["prompts"]
    mean_of_prompts = sum(p["reward"] for p in prompts) / len(prompts)
    assert mean_of_prompts == pytest.approx(report["results"]["reward"]["mean"], rel=1e-6)


def test_eval_of_the_base_model_repeats_the_runs_first_evaluation(trained):
    run_dir, overrides = trained
    vgrpo_eval(overrides)  # default folder: RUN/eval/base
    report = json.loads((run_dir / "eval" / "base" / "eval.json").read_text())
    assert report["checkpoint"] is None
    first = records(run_dir, "eval")[0]
    assert report["results"]["reward"]["mean"] == first["reward"]
    assert report["results"]["reward/brightness_eval"]["mean"] == first["reward/brightness_eval"]
    assert (run_dir / "eval" / "base" / "grid.png").is_file()


def test_eval_of_a_missing_checkpoint_is_one_line(tmp_path):
    argv = ["eval", str(TOY), "--checkpoint", str(tmp_path / "nope")]
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: checkpoint") and len(result.stderr.splitlines()) == 1
