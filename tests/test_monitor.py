"""The reward-hacking monitor: the stop rule on constructed evaluation sequences, its recipe checks,
and a toy run it stops with a checkpoint that resumes (and that it stops again until loosened)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import EVAL_STATS, read_metrics
from vgrpo_platform.training.observe.monitor import (
    Alarm,
    Fall,
    Watch,
    check,
    falls,
    flagged,
    guard_keys,
    require_keys,
    warning_line,
)
from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"


def evals(rewards: list[float], monitor: list[float]) -> list[dict]:
    return [
        {"kind": "eval", "iteration": 10 * i, "reward": r, "monitor/diversity": m}
        for i, (r, m) in enumerate(zip(rewards, monitor, strict=True))
    ]


# ------------------------------------------------------------------------------------ the rule
def test_flags_mark_evaluations_below_the_best_by_the_margin_while_the_reward_is_higher():
    records = evals([0.1, 0.2, 0.3, 0.4, 0.5], [0.50, 0.60, 0.55, 0.50, 0.58])
    # best so far: 0, 1, 1, 1, 1; falls since it: -, 0, .05, .10, .02 ; reward above it: -, -, yes, yes, yes
    assert flagged(records, "monitor/diversity", "reward", margin=0.03) == [None, None, 1, 1, None]
    assert flagged(records, "monitor/diversity", "reward", margin=0.0) == [None, None, 1, 1, 1]


def test_the_rule_fires_after_patience_flagged_evaluations_in_a_row():
    rewards, monitor = [0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.6, 0.5, 0.45, 0.40]
    rule = {"margin": 0.05, "patience": 2}
    for n in range(1, 4):  # flags: -, -, 1, 1, 1 -> not yet after three evaluations
        assert check(evals(rewards[:n], monitor[:n]), ["monitor/diversity"], **rule) is None
    alarm = check(evals(rewards[:4], monitor[:4]), ["monitor/diversity"], **rule)
    assert alarm == Alarm(
        key="monitor/diversity",
        rising="reward",
        iteration=30,
        best_iteration=10,
        best=0.6,
        now=0.45,
        rising_at_best=0.2,
        rising_now=0.4,
        evaluations=2,
    )
    assert "monitor/diversity fell from 0.6000 (iteration 10) to 0.4500" in alarm.message()
    assert check(evals(rewards, monitor), ["monitor/diversity"], **rule).evaluations == 3


@pytest.mark.parametrize(
    ("rewards", "monitor", "why"),
    [
        ([0.1, 0.2, 0.3, 0.4], [0.6, 0.58, 0.57, 0.56], "falls by no more than the margin"),
        ([0.4, 0.3, 0.2, 0.1], [0.6, 0.5, 0.4, 0.3], "the reward falls too: no hacking"),
        ([0.1, 0.2, 0.3, 0.4], [0.6, 0.4, 0.6, 0.4], "it recovered in between: not in a row"),
        ([0.1, 0.2, 0.3, 0.4], [0.6, 0.7, 0.8, 0.9], "it rises"),
    ],
)
def test_the_rule_stays_quiet(rewards, monitor, why):
    assert check(evals(rewards, monitor), ["monitor/diversity"], margin=0.05, patience=2) is None, why


def test_the_first_watched_key_that_fires_is_reported_and_rising_is_configurable():
    records = evals([0.1, 0.2, 0.3], [0.9, 0.5, 0.4])
    for r, other in zip(records, [0.0, 0.5, 1.0], strict=True):
        r["detail/shapes/correct"] = 1.0 - other
        r["reward/held_out"] = other  # rises: it can stand for the training reward
    keys = ["detail/shapes/correct", "monitor/diversity"]
    assert check(records, keys, margin=0.1, patience=2).key == "detail/shapes/correct"
    assert check(records, keys[::-1], margin=0.1, patience=2).key == "monitor/diversity"
    assert check(records, keys, margin=0.1, patience=2, rising="reward/held_out").rising == "reward/held_out"
    assert check(records, keys, margin=0.1, patience=3) is None  # the first evaluation is never flagged


# ------------------------------------------------------------------------------------ the warnings
def test_a_guard_past_the_margin_below_its_best_is_a_fall_whatever_the_reward_did():
    records = evals([0.1, 0.2, 0.3, 0.4], [0.40, 0.50, 0.45, 0.345])  # diversity 31% below its best
    (fall,) = falls(records, ["monitor/diversity"], margin=0.05, rising="reward")
    assert fall == Fall(
        key="monitor/diversity",
        iteration=30,
        best_iteration=10,
        best=0.5,
        now=0.345,
        margin=0.05,
        rising="reward",
        rising_at_best=0.2,
        rising_now=0.4,
    )
    assert fall.message() == (
        "monitor/diversity is 31% below its best: 0.5 at iteration 10, 0.345 at iteration 30 "
        "(eval.monitor.margin 0.05); reward rose from 0.2 to 0.4 meanwhile"
    )
    assert falls(records, ["monitor/diversity"], margin=0.2, rising="reward") == []  # within the margin
    assert falls(records[:2], ["monitor/diversity"], margin=0.0, rising="reward") == []  # the best is last
    falling = evals([0.4, 0.3], [0.5, 0.1])
    assert (
        "reward did not rise from 0.4 to 0.3"
        in falls(falling, ["monitor/diversity"], margin=0.0, rising="reward")[0].message()
    )
    zero_best = evals([0.1, 0.2], [0.0, -0.5])  # a share of 0 means nothing: the drop in the metric's units
    assert falls(zero_best, ["monitor/diversity"], margin=0.1, rising="reward")[0].drop() == "0.5"


def test_the_guards_are_the_watched_keys_then_monitors_then_what_only_the_evaluations_score():
    keys = ["reward", "reward/brightness", "reward/judge", "detail/judge/color", "monitor/diversity"]
    assert guard_keys(keys, ["reward/brightness"], ["judge"]) == [
        "reward/brightness",
        "monitor/diversity",
        "reward/judge",
        "detail/judge/color",
    ]
    assert guard_keys(keys, [], []) == ["monitor/diversity"]


def test_the_log_line_names_every_fall_on_one_line_and_whether_the_rule_is_off():
    records = evals([0.1, 0.2, 0.3], [0.5, 0.4, 0.3])
    for r, judge in zip(records, [0.9, 0.8, 0.2], strict=True):
        r["reward/judge"] = judge
    found = falls(records, ["monitor/diversity", "reward/judge"], margin=0.05, rising="reward")
    line = warning_line(found, rule_on=False)
    assert line == (
        "warning: more than eval.monitor.margin 0.05 below their best at iteration 20, reward now 0.3: "
        "monitor/diversity -40% (best 0.5 at iteration 0, reward then 0.1), "
        "reward/judge -78% (best 0.9 at iteration 0, reward then 0.1); "
        "the stop rule is off (eval.monitor.stop_when_falls = [])"
    )
    assert "stop rule" not in warning_line(found, rule_on=True)
    assert warning_line([], rule_on=False) is None


def test_the_watch_warns_with_the_rule_off_and_never_stops():
    from types import SimpleNamespace

    from vgrpo_platform.config.schema import MonitorSection

    watch = Watch(MonitorSection(margin=0.05), SimpleNamespace(is_main_process=True), [], ["judge"])
    lines = []
    for r, judge in zip(evals([0.1, 0.2, 0.3], [0.5, 0.5, 0.5]), [0.9, 0.88, 0.5], strict=True):
        assert watch({**r, "reward/judge": judge}) is None
        lines.append(watch.warning())
    assert lines[:2] == [None, None]  # 0.02 below the best is within the margin
    assert lines[2].startswith("warning: ") and "reward/judge -44%" in lines[2]
    assert "monitor/diversity" not in lines[2]


def test_a_missing_key_is_a_one_line_error_naming_the_found_ones():
    record = {"kind": "eval", "iteration": 0, "reward": 0.5, "detail/shapes/correct": 0.2}
    require_keys(record, ["detail/shapes/correct"], "reward")
    with pytest.raises(
        RecipeError, match=r"'detail/shapes/corect' is not .* use one of .*detail/shapes/correct"
    ):
        require_keys(record, ["detail/shapes/corect"], "reward")


# ------------------------------------------------------------------------------------ recipe checks
def toy(tmp_path: Path, name: str, *overrides: str):
    base = [f"run.output_dir={tmp_path.as_posix()!r}", f"run.name={name!r}", "log.progress='none'"]
    return resolve_recipe(TOY, [*base, *overrides])


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (['eval.monitor.stop_when_falls=["reward/brightnes"]'], "did you mean 'reward/brightness'?"),
        (['eval.monitor.stop_when_falls=["monitor/reward"]'], "needs at least one [[eval.rewards]]"),
        (
            ['eval.monitor.stop_when_falls=["monitor/diversity"]', "eval.samples_per_prompt=1"],
            "needs eval.samples_per_prompt >= 2",
        ),
        (['eval.monitor.stop_when_falls=["detail/nope/correct"]'], "detail/<reward>/<criterion>"),
        (["eval.monitor.rising='reward/other'"], "eval.monitor.rising: 'reward/other'"),
    ],
)
def test_the_recipe_rejects_metrics_the_evaluations_will_not_have(tmp_path, overrides, fragment):
    with pytest.raises(RecipeError) as caught:
        toy(tmp_path, "bad", *overrides)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_recipe_accepts_rewards_criteria_and_monitors(tmp_path):
    resolved = toy(
        tmp_path,
        "ok",
        "eval.rewards.0.name=brightness",
        'eval.monitor.stop_when_falls=["reward/brightness_eval", "monitor/reward", "monitor/diversity", '
        '"detail/brightness/any"]',
    )
    assert [r.key for r in resolved.eval_rewards] == ["brightness_eval"]  # its name is a training key


# ------------------------------------------------------------------------------------ a toy run
# Training raises the brightness; the evaluation-only copy with target 0 scores darkness, so it falls.
HACKED = [
    "train.iterations=6",
    "eval.every=1",
    "log.checkpoint_every=0",
    "log.save_grids=false",
    "log.diagnostics_every=0",
    "rollout.group_size=4",
    "eval.rewards.0.name=brightness",
    "eval.rewards.0.options.target=0.0",
    'eval.monitor.stop_when_falls=["reward/brightness_eval"]',
    "eval.monitor.margin=0.0",
    "eval.monitor.patience=2",
]


def test_a_run_whose_held_out_check_falls_stops_with_a_resumable_checkpoint(tmp_path):
    run_dir = Trainer(toy(tmp_path, "hacked", *HACKED)).run()
    records = read_metrics(run_dir / "metrics.jsonl")
    ev = [r for r in records if r["kind"] == "eval"]
    assert [r["iteration"] for r in ev] == [0, 1, 2]
    assert ev[2]["reward"] > ev[1]["reward"] > ev[0]["reward"]
    assert ev[2]["reward/brightness_eval"] < ev[1]["reward/brightness_eval"] < ev[0]["reward/brightness_eval"]
    stopped = [r for r in records if r["kind"] == "stopped"]
    assert [r["iteration"] for r in stopped] == [2]
    assert "reward/brightness_eval fell" in stopped[0]["reason"]
    assert max(r["iteration"] for r in records if r["kind"] == "train") == 2
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000002"]  # not the 6 it was asked for

    # resumed as is, the earlier evaluations still count: it stops at the next one
    Trainer(toy(tmp_path, "hacked", *HACKED), resume=True).run()
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000002", "iter_000003"]
    # loosened, it trains on to the end
    Trainer(toy(tmp_path, "hacked", *HACKED, "eval.monitor.patience=100"), resume=True).run()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["iteration"] for r in records if r["kind"] == "stopped"] == [2, 3]


def test_a_run_with_the_rule_off_warns_in_its_log_and_keeps_each_evaluations_standard_errors(
    tmp_path, capsys
):
    """The same hacked toy run without a stop rule: it trains to the end, and the log says, at each
    evaluation, that the evaluation-only check fell below its best; plain progress lines name the
    method and carry the elapsed time and an ETA; ``eval_stats.jsonl`` holds each evaluation's
    standard errors and counts beside the means of ``metrics.jsonl``."""
    sets = [*HACKED, "train.iterations=2", "eval.monitor.stop_when_falls=[]", "log.progress='plain'"]
    run_dir = Trainer(toy(tmp_path, "warned", *sets)).run()
    out = capsys.readouterr().out.splitlines()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert not [r for r in records if r["kind"] == "stopped"]
    assert [r["iteration"] for r in records if r["kind"] == "train"] == [1, 2]
    warnings = [line for line in out if line.startswith("warning: ")]
    assert len(warnings) == 2, out  # after evaluations 1 and 2; the first has nothing to fall from
    for it, line in zip((1, 2), warnings, strict=True):
        assert f"below their best at iteration {it}" in line and "reward/brightness_eval -" in line
        assert line.endswith("the stop rule is off (eval.monitor.stop_when_falls = [])")
    progress = [line for line in out if line.startswith("vgrpo [")]
    assert [line.split("]")[0] for line in progress] == ["vgrpo [1/2", "vgrpo [2/2"]
    assert all(re.search(r"\| elapsed \d+:\d\d:\d\d  ETA \d+:\d\d:\d\d$", line) for line in progress)

    evals_written = [r for r in records if r["kind"] == "eval"]
    stats = [json.loads(line) for line in (run_dir / EVAL_STATS).read_text().splitlines()]
    assert [s["iteration"] for s in stats] == [0, 1, 2]
    for s, record in zip(stats, evals_written, strict=True):
        assert s["stats"]["reward"]["mean"] == record["reward"]
        assert s["stats"]["reward"]["n"] == 2 * 2  # the toy's 2 held-out prompts x 2 seeds
        assert s["stats"]["monitor/diversity"]["n"] == 2  # one value per prompt
        assert s["stats"]["reward"]["sem"] > 0
