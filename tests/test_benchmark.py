"""python -m benchmarks.compare end to end on the toy world: the sweep and seeds phases as resumable cells,
a second invocation that runs nothing (also from a clone's records alone), the generated doc tables, and
the figures' arithmetic (t-intervals, NFE, the selection rule) against independent computations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import aggregate, compare, matrix, nfe, records, render, rollout_backends
from benchmarks.protocol import METHODS, WORLDS

SMOKE = ["--world", "toy", "--methods", "vgrpo", "flow_grpo", "--seeds", "0", "1", "--lrs", "1e-3", "1e-2"]
SMOKE += ["--iterations", "3"]


def _files(folder: Path) -> dict[str, tuple[float, int]]:
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")
    }


def test_the_smoke_matrix_runs_every_cell_once_and_a_second_invocation_only_prints_tables(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "toy"
    assert compare.main([*SMOKE, "--out", str(out)]) == 0
    first = capsys.readouterr().out
    # the sweep: 2 methods x 2 rates on seed 0 with a third of the budget; then 2 seeds at the chosen rate
    assert first.count(": running") == 8 and "eval @" in first
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["methods"]) == ["vgrpo", "flow_grpo"]
    assert summary["settings"]["sweep_iterations"] == 1 and summary["settings"]["lrs"] == [1e-3, 1e-2]
    assert summary["commit"] and summary["cell_commits"] == [summary["commit"]]
    for name, entry in summary["methods"].items():
        sweep = {row["lr"]: row["mean"] for row in entry["sweep"]}
        assert set(sweep) == {1e-3, 1e-2}
        assert entry["chosen_lr"] == max(sweep, key=lambda lr: (sweep[lr], -lr))  # the rule, recomputed
        assert [s["seed"] for s in entry["seeds"]] == [0, 1]
        ends = [s["reward_end"] for s in entry["seeds"]]
        stats = entry["summary"]["reward_end"]
        assert stats["mean"] == pytest.approx(sum(ends) / 2)
        # two seeds: t_{0.975, 1} = 12.706 (tables), times |a - b| / 2
        assert stats["ci95"] == pytest.approx(12.7062 * abs(ends[0] - ends[1]) / 2, rel=1e-4)
        for seed in entry["seeds"]:
            assert [p["iteration"] for p in seed["curve"]] == [0, 3]
            assert seed["curve"][-1]["nfe"] == seed["nfe"] > 0 and seed["gradient_steps"] == 3
        run = out / "runs" / name / f"lr{entry['chosen_lr']:g}" / "it3" / "seed1"
        assert json.loads((run / "cell.json").read_text())["status"] == "done"
        recipe = json.loads((run / "resolved_recipe.json").read_text())
        assert recipe["surrogate"]["name"] == name and recipe["run"]["seed"] == 1
    assert summary["target"]["value"] == pytest.approx(
        summary["methods"]["vgrpo"]["seeds"][0]["reward_start"] + 0.2
    )
    assert (out / "curves.png").stat().st_size > 1000

    before = _files(out / "runs")
    assert compare.main([*SMOKE, "--out", str(out)]) == 0
    second = capsys.readouterr().out
    assert second.count(": done") == 8 and ": running" not in second and ": resuming" not in second
    assert "eval @" not in second and "Methods (" in second and "Learning-rate sweep" in second
    assert _files(out / "runs") == before  # no run directory touched
    assert json.loads((out / "summary.json").read_text())["methods"] == summary["methods"]

    # a fresh clone holds only what git keeps of a cell (benchmarks/results/.gitignore): its marker and
    # records; the matrix still runs nothing and its summary is the same
    for path in (out / "runs").rglob("*"):
        if path.is_file() and path.name not in (matrix.MARKER, records.RECORDS):
            path.unlink()
    assert compare.main([*SMOKE, "--out", str(out)]) == 0
    third = capsys.readouterr().out
    assert third.count(": done") == 8 and ": running" not in third and ": resuming" not in third
    assert json.loads((out / "summary.json").read_text())["methods"] == summary["methods"]
    # --from-records rebuilds the same summary from those records, only checking each cell finished
    assert compare.main([*SMOKE, "--out", str(out), "--from-records"]) == 0
    assert json.loads((out / "summary.json").read_text())["methods"] == summary["methods"]
    capsys.readouterr()

    # the docs' tables come from the summary, between the markers, and nothing else changes
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n\nintro\n\n{render.DOC_BEGIN}\nold table\n{render.DOC_END}\n\n## After\n")
    args = ["--tables-from", str(out / "summary.json"), "--write-doc", str(doc)]
    assert compare.main(args) == 0
    text = doc.read_text()
    assert text.startswith("# Title\n\nintro\n\n") and text.endswith(f"{render.DOC_END}\n\n## After\n")
    assert "old table" not in text and "| vgrpo | 0.01 | 2 |" in text and "**Learning-rate sweep**" in text
    assert compare.main(args) == 0 and doc.read_text() == text  # regenerating changes nothing


def test_from_records_trains_nothing_and_stops_at_a_cell_that_has_not_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "fresh"
    with pytest.raises(SystemExit, match=r"seed0 has not finished \(new\); --from-records runs nothing"):
        compare.main([*SMOKE, "--out", str(out), "--from-records"])
    assert not (out / "runs").exists() and not (out / "summary.json").exists()


def test_an_interrupted_cell_resumes_from_its_checkpoint_and_ends_where_an_unbroken_run_does(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["--world", "toy", "--methods", "vgrpo", "--seeds", "0", "--iterations", "4", "--eval-every", "2"]
    args += ["--set", "log.keep_last=2", "--out", str(tmp_path)]
    assert compare.main(args) == 0
    run = tmp_path / "runs" / "vgrpo" / "lr0.01" / "it4" / "seed0"
    unbroken = (run / "metrics.jsonl").read_text().splitlines()
    # as if killed after iteration 2's checkpoint: no marker, no later checkpoint
    (run / "cell.json").unlink()
    import shutil

    shutil.rmtree(run / "checkpoints" / "iter_000004")
    capsys.readouterr()
    assert compare.main(args) == 0
    printed = capsys.readouterr().out
    assert ": resuming" in printed and "eval @0" not in printed and "[3/4]" in printed
    resumed = (run / "metrics.jsonl").read_text().splitlines()
    strip = lambda lines, key: [  # noqa: E731 - wall-clock differs, every learned number must not
        {k: v for k, v in json.loads(x).items() if not k.startswith(("time_", "wall"))}[key]
        for x in lines
        if '"eval"' in x
    ]
    assert strip(resumed, "reward") == strip(unbroken, "reward")


def test_a_cells_records_are_the_logs_figure_fields_in_its_order(tmp_path):
    log = [
        {"kind": "eval", "iteration": 0, "reward": 0.5, "detail/x": 0.1, "wall_seconds": 0.0, "other": 1.0},
        {
            "kind": "train",
            "iteration": 1,
            "gradient_steps": 2,
            "time_rollout": 1.5,
            "loss": 0.2,
            "diag/cv": 1,
        },
        {"kind": "skipped", "iteration": 2, "reason": "a fault"},
        {"kind": "train", "iteration": 2, "gradient_steps": 1, "time_rollout": 1.25, "time_train": 0.5},
        {"kind": "eval", "iteration": 2, "reward": 0.625, "detail/x": 0.2, "wall_seconds": 3.0},
    ]
    (tmp_path / records.LOG).write_text("".join(json.dumps(r) + "\n" for r in log))
    records.write(tmp_path)
    kept = records.load(tmp_path)
    assert kept == [
        {"kind": "eval", "iteration": 0, "reward": 0.5, "detail/x": 0.1},
        {"kind": "train", "iteration": 1, "gradient_steps": 2, "time_rollout": 1.5, "diag/cv": 1},
        {"kind": "train", "iteration": 2, "gradient_steps": 1, "time_rollout": 1.25, "time_train": 0.5},
        {"kind": "eval", "iteration": 2, "reward": 0.625, "detail/x": 0.2},
    ]
    (tmp_path / records.LOG).unlink()  # what a clone has: the records alone
    nfe_, kw = [0.0, 10.0, 20.0], {"detail": "detail/x", "target_metric": "detail/x", "target": 0.15}
    full = aggregate.seed_figures([r for r in log if r["kind"] != "skipped"], nfe_, **kw)
    assert aggregate.seed_figures(records.load(tmp_path), nfe_, **kw) == full
    assert aggregate.selection_score(records.load(tmp_path)) == aggregate.selection_score(log)


def test_a_cells_records_keep_seconds_to_the_millisecond_and_every_other_value_as_logged(tmp_path):
    log = [
        {"kind": "eval", "iteration": 0, "reward": 0.123456789012, "detail/x": 0.987654321098},
        {"kind": "train", "iteration": 1, "gradient_steps": 1, "time_rollout": 0.9286620345858616},
        {"kind": "train", "iteration": 2, "time_train": 2.0004999, "diag/cv": 0.1234567891},
    ]
    (tmp_path / records.LOG).write_text("".join(json.dumps(r) + "\n" for r in log))
    records.write(tmp_path)
    kept = records.load(tmp_path)
    assert kept[0] == log[0] and kept[2]["diag/cv"] == log[2]["diag/cv"]  # figures as logged
    assert (kept[1]["time_rollout"], kept[2]["time_train"]) == (0.929, 2.0)
    assert "0.9286620345858616" not in (tmp_path / records.RECORDS).read_text()


def test_t_intervals_match_the_tables_and_the_selection_rule_is_the_last_two_evaluations():
    mean, half = aggregate.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)  # t_{0.975, 2}
    values = [0.5, 0.7, 0.4, 0.9, 0.6]
    sd = math.sqrt(sum((v - 0.62) ** 2 for v in values) / 4)
    assert aggregate.t_interval(values)[1] == pytest.approx(2.776445 * sd / math.sqrt(5), rel=1e-6)
    assert aggregate.t_interval([0.3]) == (0.3, None)
    evals = [{"kind": "eval", "iteration": i, "reward": r} for i, r in enumerate([0.1, 0.9, 0.2, 0.4])]
    assert aggregate.selection_score([*evals, {"kind": "train", "reward": 5.0}]) == pytest.approx(0.3)
    assert aggregate.selection_score([*evals, {"kind": "eval", "reward": math.nan}]) == -math.inf
    assert matrix.choose_rate({1e-3: [0.5, 0.7], 1e-2: [0.6, 0.6], 3e-2: [-math.inf, 0.9]}) == 1e-3  # tie
    assert matrix.choose_rate({1e-3: [-math.inf], 1e-2: [-math.inf]}) is None


def test_targets_are_reached_where_the_curve_first_crosses_them():
    records = [
        {"kind": "eval", "iteration": 0, "reward": 0.1, "wall_seconds": 0.0, "detail/x": 0.2},
        {
            "kind": "train",
            "iteration": 1,
            "gradient_steps": 2,
            "time_rollout": 1.0,
            "time_train": 0.5,
            "wall_seconds": 3.0,
        },
        {
            "kind": "train",
            "iteration": 2,
            "gradient_steps": 2,
            "time_rollout": 1.0,
            "time_train": 0.5,
            "wall_seconds": 6.0,
        },
        {"kind": "eval", "iteration": 2, "reward": 0.5, "wall_seconds": 7.0, "detail/x": 0.35},
        {
            "kind": "train",
            "iteration": 3,
            "gradient_steps": 2,
            "time_rollout": 1.0,
            "time_train": 0.5,
            "wall_seconds": 9.0,
        },
        {"kind": "eval", "iteration": 3, "reward": 0.6, "wall_seconds": 9.5, "detail/x": 0.4},
    ]
    nfe = [0.0, 10.0, 20.0, 35.0]
    fig = aggregate.seed_figures(records, nfe, detail="detail/x", target_metric="detail/x", target=0.3)
    assert (fig["iterations_to_target"], fig["gradient_steps_to_target"]) == (2, 4)
    # wall-clock: the iterations' own seconds up to the target, the evaluation's 1 s (6.0 -> 7.0) left out
    assert (fig["nfe_to_target"], fig["wall_to_target"]) == (20.0, 2.0 + 2 * 0.5)
    assert (fig["detail_start"], fig["detail_end"], fig["reward_end"]) == (0.2, 0.4, 0.6)
    assert fig["time_rollout"] == 3.0 and fig["nfe"] == 35.0 and fig["wall"] == 4.5
    never = aggregate.seed_figures(records, nfe, detail=None, target_metric="reward", target=0.9)
    assert not never["reached"] and never["iterations_to_target"] is None
    both = aggregate.across_seeds([{"seed": 0, **fig}, {"seed": 1, **never}])
    assert both["reached"] == 1 and both["iterations_to_target"]["mean"] is None  # not every seed reached it


def test_a_run_that_crosses_the_target_and_falls_back_has_not_reached_it():
    def evals(values: list[float]) -> list[dict]:
        return [{"kind": "eval", "iteration": 10 * i, "reward": v} for i, v in enumerate(values)]

    def trains(n: int) -> list[dict]:
        return [
            {"kind": "train", "iteration": i, "gradient_steps": 1, "time_train": 1.0} for i in range(1, n)
        ]

    def figures(values: list[float]) -> dict:
        records = trains(10 * len(values)) + evals(values)
        nfe = [float(i) for i in range(10 * len(values))]
        return aggregate.seed_figures(records, nfe, detail=None, target_metric="reward", target=0.5)

    fell_back = figures([0.1, 0.6, 0.4, 0.45])  # crosses at 10, falls back at 20
    assert not fell_back["reached"] and fell_back["iterations_to_target"] is None
    assert fell_back["wall_to_target"] is None and fell_back["gradient_steps_to_target"] is None
    assert not figures([0.1, 0.3, 0.4, 0.6])["reached"]  # crossed at the last evaluation: nothing held
    held = figures([0.1, 0.6, 0.4, 0.55, 0.5])  # the first crossing fell back; the second held at 40
    assert held["reached"] and held["iterations_to_target"] == 30 and held["gradient_steps_to_target"] == 30
    assert held["wall_to_target"] == 30.0 and held["nfe_to_target"] == 30.0


@pytest.mark.parametrize(
    ("method", "gradient_steps"),
    [
        ("vgrpo", 1),
        ("vgrpo", 2),
        ("flow_grpo", 1),
        ("mixgrpo", 2),
        ("dance_grpo", 1),
        ("flow_grpo_fast", 1),
        ("diffusion_nft", 2),
        ("awm_authors", 1),
        ("tree_grpo", 1),
        ("branch_grpo", 2),
        ("dense_grpo", 1),
        ("flow_grpo_cps", 1),
        ("grpo_guard", 2),
        ("flow_dppo", 1),
        ("diffusion_dpo", 1),
        ("dgpo", 2),
    ],
)
def test_nfe_per_iteration_counts_the_forwards_a_real_iteration_makes(tmp_path, method, gradient_steps):
    """Independent count: rows through ``adapter.predict`` during one training iteration."""
    from vgrpo_platform.config.recipe import resolve_recipe
    from vgrpo_platform.training.loop import Trainer

    overrides = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        "log.progress='none'",
        "log.diagnostics_every=0",
        f"train.gradient_steps_per_iteration={gradient_steps}",
        "rollout.steps=6",
        *METHODS[method],
    ]
    if method == "awm_authors":
        overrides.append("surrogate.options={n_mc=2}")
    resolved = resolve_recipe(WORLDS["toy"], overrides)
    trainer = Trainer(resolved)
    adapter = trainer.session.adapter
    counted = [0]
    predict = adapter.predict

    def counting(z_t, t, cond):
        counted[0] += z_t.shape[0]
        return predict(z_t, t, cond)

    adapter.predict = counting
    trainer.iterate(1)
    assert counted[0] == nfe.nfe_per_iteration(resolved, 1)


@pytest.mark.slow  # ~90 s: eleven toy runs; the arms themselves are tested in test_rollout_backends.py
def test_the_rollout_backends_benchmark_runs_at_toy_size_and_resumes_its_cells(tmp_path, capsys, monkeypatch):
    """python -m benchmarks.rollout_backends: every arm and the one-core pair run once, the table has a row
    per arm with ratios to in_process, and a second invocation reuses every cell (runs nothing)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bench = rollout_backends
    args = ["--world", "toy", "--iterations", "2", "--seeds", "0", "1", "--one-core-iterations", "2"]
    args += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "runs")]
    assert bench.main(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert list(summary["arms"]) == list(bench.ARMS)
    for arm in ("cached", "worker+overlap"):
        entry = summary["arms"][arm]
        assert entry["seeds"] == [0, 1] and entry["time_iteration_ratio"]["mean"] > 0
        assert "after_diff" in entry
    assert list(summary["one_core_each"]["arms"]) == list(bench.ONE_CORE_EACH)
    table = capsys.readouterr().out
    assert all(f"| {arm} |" in table for arm in [*bench.ARMS, *bench.ONE_CORE_EACH])
    cells = _files(tmp_path / "out" / "cells")
    assert len(cells) == 2 * len(bench.ARMS) + len(bench.ONE_CORE_EACH)
    assert bench.main(args) == 0
    assert _files(tmp_path / "out" / "cells") == cells  # nothing ran again


def test_a_rollout_backends_cell_names_its_run_folder_relative_to_the_repository():
    """Cell records are committed: a run folder inside the repository is written relative to it (the runs
    start there), so no record names the folder of the machine that made it; one outside stays as given."""
    import argparse

    root = Path(rollout_backends.__file__).resolve().parents[1]
    args = argparse.Namespace(
        work=root / "runs" / "rollout_backends", world="shapes", iterations=3, overrides=[]
    )
    assert "run.output_dir='runs/rollout_backends/shapes'" in rollout_backends.cell_settings(
        args, "cached", 0
    )
    args.work = Path("/elsewhere/runs")
    assert "run.output_dir='/elsewhere/runs/shapes'" in rollout_backends.cell_settings(args, "cached", 0)
