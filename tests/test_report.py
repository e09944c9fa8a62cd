"""``vgrpo report``: a synthetic run directory in, plots + self-contained HTML out; clear one-line errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from vgrpo_platform.cli import app as cli
from vgrpo_platform.cli.report import (
    Cell,
    ReportError,
    eval_table,
    kl_title,
    monitor_keys,
    read_eval_stats,
    read_run_metrics,
    reward_keys,
    write_report,
)
from vgrpo_platform.cli.report_figures import monitors_figure, rewards_figure, training_figure
from vgrpo_platform.training.observe.metrics import EVAL_STATS, stats_record

EVAL_ITERS = (0, 2, 4)
RECIPE_TOML = '[run]\nname = "<script>alert(1)</script>"\n\n[[rewards]]\nname = "shapes"\n'


def train_record(i: int) -> dict:
    return {
        "kind": "train",
        "iteration": i,
        "wall_seconds": 10.0 * i,
        "reward": 0.1 * i,
        "reward/shapes": 0.1 * i,
        "reward_std/shapes": 0.05,
        "detail/shapes/correct": 0.05 * i,
        "detail/shapes/color": 0.2 * i,
        "loss": 1.0 / i,
        "kl": 0.01 * i,
        "ratio_mean": 1.0,
        "ratio_min": 0.9,
        "ratio_max": 1.1,
        "grad_norm": 2.0 - 0.1 * i,
        "zero_std_fraction": 0.0,
        "time_rollout": 3.0,
        "time_reward": 0.5,
        "time_train": 1.5 + i,
    }


def eval_record(i: int) -> dict:
    # dyadic fractions: exact in binary and printed the same by repr and by a 4-digit format
    return {
        "kind": "eval",
        "iteration": i,
        "wall_seconds": 10.0 * i,
        "reward": 0.125 + 0.1875 * i,
        "reward/shapes": 0.125 + 0.1875 * i,
        "detail/shapes/correct": 0.0625 * (i + 1),
        "detail/shapes/color": 0.5 + 0.0625 * i,
    }


def records() -> list[dict]:
    out = [eval_record(0)]
    for i in range(1, 5):
        out.append(train_record(i))
        if i in EVAL_ITERS:
            out.append(eval_record(i))
    return out


def tiny_grid(path: Path, shade: int) -> None:
    rng = np.random.default_rng(shade)
    pixels = rng.integers(0, 256, size=(12, 20, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def sem_of(key: str) -> float:
    return 0.015625 if key.startswith("reward") else 0.03125


def write_stats(run: Path, evals: list[dict]) -> None:
    """``eval_stats.jsonl`` as the loop writes it: 8 samples per evaluation."""
    lines = []
    for r in evals:
        summary = {
            k: {"mean": v, "sem": sem_of(k), "n": 8} for k, v in r.items() if "/" in k or k == "reward"
        }
        lines.append(json.dumps(stats_record(r["iteration"], summary)))
    (run / EVAL_STATS).write_text("".join(line + "\n" for line in lines))


def make_run(root: Path, lines: list[str] | None = None) -> Path:
    run = root / "myrun"
    run.mkdir()
    if lines is None:
        lines = [json.dumps(r) for r in records()]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    write_stats(run, [r for r in records() if r["kind"] == "eval"])
    for i in EVAL_ITERS:
        tiny_grid(run / "samples" / f"eval_{i:06d}.png", i)
    tiny_grid(run / "samples" / "before_after.png", 99)
    (run / "recipe.toml").write_text(RECIPE_TOML)
    (run / "resolved_recipe.json").write_text(json.dumps({"run": {"name": "myrun"}}))
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Rendered once (matplotlib takes seconds here); its metrics end in a killed run's torn line."""
    lines = [json.dumps(r) for r in records()] + ['{"kind": "train", "iteration": 5, "rew']
    run = make_run(tmp_path_factory.mktemp("report"), lines)
    index = write_report(run)
    return run, index, index.read_text()


# --------------------------------------------------------------------------------------- outputs
def test_report_folder_is_written(report):
    run, index, _ = report
    assert index == run / "report" / "index.html"
    for name in ("rewards.png", "training.png"):
        path = run / "report" / name
        with Image.open(path) as im:
            im.verify()  # a well-formed PNG
        with Image.open(path) as im:
            assert im.format == "PNG" and im.width >= 800 and im.height >= 500
            rgb = np.asarray(im.convert("RGB")).astype(np.int64)  # [H, W, 3]
            assert len(np.unique(rgb @ np.array([65536, 256, 1]))) > 50  # lines, text, fills: not blank
        assert path.stat().st_size > 20_000


def test_rewards_figure_has_a_row_per_reward_panel(report):
    # total, reward/shapes, detail/shapes/* -> 3 rows of (iteration, wall-clock) panels
    run, _, _ = report
    with Image.open(run / "report" / "rewards.png") as im:
        assert im.height > 2.5 * 290  # 2.9 in per row at 100 dpi


def test_html_references_every_grid_and_copies_it(report):
    run, _, text = report
    srcs = re.findall(r'<img src="([^"]+)"', text)
    for i in EVAL_ITERS:
        name = f"eval_{i:06d}.png"
        assert f"samples/{name}" in srcs
        copied = run / "report" / "samples" / name
        assert copied.read_bytes() == (run / "samples" / name).read_bytes()
    for src in srcs:  # relative paths that resolve inside the report folder: it is self-contained
        assert not src.startswith(("/", "http")) and (run / "report" / src).is_file()
    assert {"rewards.png", "training.png"} <= set(srcs)
    # first and last evaluation side by side, then every grid in iteration order
    # shown at their own size (never shrunk to a thumbnail), every evaluation behind its own summary
    assert "figure.grid img { max-width: none;" in text
    assert len(re.findall(r'<figure class="grid"><a href="samples/eval_', text)) == len(EVAL_ITERS) + 2
    assert re.findall(r"<summary>(iteration \d+)</summary>", text) == [f"iteration {i}" for i in EVAL_ITERS]
    pair = re.search(r'<div class="pair">(.*?)</div>', text).group(1)
    assert re.findall(r'<img src="([^"]+)"', pair) == ["samples/eval_000000.png", "samples/eval_000004.png"]
    every = re.search(r'<div class="all">(.*?)</div>', text).group(1)
    assert re.findall(r'<img src="([^"]+)"', every) == [f"samples/eval_{i:06d}.png" for i in EVAL_ITERS]


def test_html_shows_the_runs_before_after_picture(report):
    run, _, text = report
    assert '<img src="samples/before_after.png"' in text
    copied = run / "report" / "samples" / "before_after.png"
    assert copied.read_bytes() == (run / "samples" / "before_after.png").read_bytes()


def test_html_table_holds_first_peak_and_last_with_standard_errors_and_counts(report):
    _, _, text = report
    first, last = eval_record(EVAL_ITERS[0]), eval_record(EVAL_ITERS[-1])
    assert f"first eval (iteration {EVAL_ITERS[0]})" in text
    assert f"last eval (iteration {EVAL_ITERS[-1]})" in text
    for key in ("reward", "reward/shapes", "detail/shapes/correct", "detail/shapes/color"):
        change = last[key] - first[key]
        sem = f"{sem_of(key):.2g}"
        row = (  # every figure rises here: the peak is the last evaluation
            f"<tr><td>{key}</td><td>8</td><td>{first[key]!r} ± {sem}</td><td>{last[key]!r} ± {sem}</td>"
            f"<td>{EVAL_ITERS[-1]}</td><td>{last[key]!r} ± {sem}</td><td>+{change!r}</td><td>0</td></tr>"
        )
        assert row in text, key


def test_the_table_shows_the_peak_and_that_the_last_evaluation_is_below_it(tmp_path):
    lines = []
    for r in records():
        if r["kind"] == "eval":
            r = {**r, "reward": {0: 0.25, 2: 0.75, 4: 0.5}[r["iteration"]]}
        lines.append(json.dumps(r))
    run = make_run(tmp_path, lines)
    evals = read_run_metrics(run / "metrics.jsonl").eval
    (row,) = [r for r in eval_table(evals, read_eval_stats(run)) if r.key == "reward"]
    assert (row.first.mean, row.peak.mean, row.last.mean) == (0.25, 0.75, 0.5)
    assert row.peak == Cell(2, 0.75, 0.015625, 8)
    text = write_report(run).read_text()
    assert (
        '<tr class="below"><td>reward</td><td>8</td><td>0.25 ± 0.016</td><td>0.75 ± 0.016</td><td>2</td>'
        "<td>0.5 ± 0.016</td><td>+0.25</td><td>\u22120.25</td></tr>"
    ) in text


def test_a_run_without_eval_stats_shows_its_means_without_errors(tmp_path):
    run = make_run(tmp_path)
    (run / EVAL_STATS).write_text(
        '{"iteration": 0, "stats": {"reward": {"mean": 0.1, "sem": 0.1, "n": 8}}}\n{"torn'
    )
    assert set(read_eval_stats(run)) == {0}  # the torn line is skipped
    (run / EVAL_STATS).unlink()
    assert read_eval_stats(run) == {}
    text = write_report(run).read_text()
    assert "<tr><td>reward</td><td>–</td><td>0.125</td>" in text


def test_html_escapes_the_recipe(report):
    _, _, text = report
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<script>" not in text
    assert "resolved_recipe.json" in text


def test_eval_table_and_keys_follow_the_records():
    recs = records()
    evals = [r for r in recs if r["kind"] == "eval"]
    assert reward_keys(recs) == ["reward", "reward/shapes", "detail/shapes/correct", "detail/shapes/color"]
    table = eval_table(evals)
    assert [r.key for r in table] == reward_keys(evals)
    assert [(r.first.mean, r.last.mean) for r in table] == [
        (evals[0][k], evals[-1][k]) for k in reward_keys(evals)
    ]
    assert all(r.first.sem is None and r.first.n is None for r in table)  # no stats given
    assert eval_table([]) == []


# ------------------------------------------------------------------------------- torn and corrupt
def test_torn_last_line_is_skipped(tmp_path):
    lines = [json.dumps(r) for r in records()]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + '\n{"kind": "train", "iteration": 5, "rew')
    metrics = read_run_metrics(path)
    assert metrics.torn_last_line
    assert [r["iteration"] for r in metrics.train] == [1, 2, 3, 4]
    assert [r["iteration"] for r in metrics.eval] == list(EVAL_ITERS)


def test_torn_last_line_report_still_renders(report):
    _, _, text = report
    assert "was incomplete" in text and "4 train iterations (last: 4)" in text


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("", "is empty"),
        ("\n\n", "is empty"),
        ('{"kind": "eval", "iteration": 0}\n{oops\n{"kind": "eval", "iteration": 2}', ":2: not valid JSON"),
        ('[1, 2]\n{"kind": "train", "iteration": 2}\n', ":1: expected a JSON object"),
        ('{"kind": "train"}\n{"kind": "train", "iteration": 2}\n', ":1: expected a JSON object"),
        ('{"kind": "other", "iteration": 1}\n', "no train or eval records"),
        ("torn", "no train or eval records"),  # a single torn line leaves nothing
    ],
)
def test_bad_metrics_are_one_line_errors(tmp_path, content, fragment):
    path = tmp_path / "metrics.jsonl"
    path.write_text(content)
    with pytest.raises(ReportError) as info:
        read_run_metrics(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_missing_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import now raises ImportError
    with pytest.raises(ReportError, match="needs matplotlib"):
        write_report(run)


def test_report_module_does_not_import_torch_or_pyplot():
    code = (
        "import sys, vgrpo_platform.cli.report; "
        "assert not {'torch', 'matplotlib', 'matplotlib.pyplot'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------- CLI
def invoke(*args):
    return CliRunner().invoke(cli.app, [str(a) for a in args], env={"COLUMNS": "200", "VGRPO_DEBUG": ""})


def assert_user_error(result, fragment):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr
    assert result.stdout == ""


def test_cli_report_writes_and_prints_the_index(tmp_path, report):
    # reporting again (here: a copy of an already-reported run) drops grid copies that are gone
    run = make_run(tmp_path)
    shutil.copytree(report[0] / "report", run / "report")
    (run / "samples" / "eval_000002.png").unlink()
    result = invoke("report", run)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip() == str(run / "report" / "index.html")
    assert "eval_000002.png" not in (run / "report" / "index.html").read_text()
    copies = sorted(p.name for p in (run / "report" / "samples").iterdir())
    assert copies == ["before_after.png", "eval_000000.png", "eval_000004.png"]
    assert "was incomplete" not in (run / "report" / "index.html").read_text()  # this run's metrics are whole


def test_cli_report_errors_exit_2_with_one_line(tmp_path):
    assert_user_error(invoke("report", tmp_path / "nope"), "run directory")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert_user_error(invoke("report", empty_dir), "metrics.jsonl not found")
    (empty_dir / "metrics.jsonl").write_text("")
    assert_user_error(invoke("report", empty_dir), "is empty")
    (empty_dir / "metrics.jsonl").write_text('garbage\n{"kind": "eval", "iteration": 0}\n')
    assert_user_error(invoke("report", empty_dir), "metrics.jsonl:1: not valid JSON")


# ------------------------------------------------------------------------------- hacking monitors
def test_the_report_plots_the_reward_against_each_monitor_and_marks_the_stop(tmp_path):
    lines = []
    for r in records():
        if r["kind"] == "eval":  # the reward rises while diversity and a held-out judge fall
            r = {**r, "monitor/diversity": 0.5 - 0.0625 * r["iteration"], "reward/judge": 0.25}
        lines.append(json.dumps(r))
    reason = "reward-hacking monitor: monitor/diversity fell from 0.5000 (iteration 0) to 0.2500"
    lines.append(json.dumps({"kind": "stopped", "iteration": 4, "reason": reason}))
    run = make_run(tmp_path, lines)
    recipe = {
        "run": {"name": "myrun"},
        "eval": {"monitor": {"stop_when_falls": ["detail/shapes/correct"], "rising": "reward"}},
    }
    (run / "resolved_recipe.json").write_text(json.dumps(recipe))

    metrics = read_run_metrics(run / "metrics.jsonl")
    assert [r["iteration"] for r in metrics.stopped] == [4]
    # watched first, then monitor/*, then what only the evaluations score; train-only keys are not monitors
    assert monitor_keys(metrics, ["detail/shapes/correct"]) == [
        "detail/shapes/correct",
        "monitor/diversity",
        "reward/judge",
    ]
    assert monitor_keys(metrics) == ["monitor/diversity", "reward/judge"]
    text = write_report(run).read_text()
    with Image.open(run / "report" / "monitors.png") as im:
        assert im.width >= 1000 and im.height >= 500  # two columns of panels, two rows
    assert '<img src="monitors.png"' in text and "Stopped at iteration 4: reward-hacking monitor" in text
    row = '<tr class="warn below"><td>⚠ monitor/diversity</td><td>–</td><td>0.5</td><td>0.5</td><td>0</td>'
    assert row + "<td>0.25</td><td>\u22120.25</td><td>\u22120.25</td></tr>" in text  # first, peak, last


def test_a_run_without_monitors_has_no_monitor_section(report):
    run, _, text = report
    assert "monitors.png" not in text and not (run / "report" / "monitors.png").exists()


# ------------------------------------------------------------------------------- honest figures
@pytest.mark.parametrize(
    ("surrogate", "fragment"),
    [
        (
            {"name": "vgrpo", "options": {"kl_beta": 0.02, "kl_anchor": "reference"}},
            "KL to the frozen base model",
        ),
        ({"name": "vgrpo", "options": {"kl_beta": 0.02}}, "x-prediction KL to the old (rollout) policy"),
        ({"name": "vgrpo", "options": {}}, "no KL penalty (kl_beta = 0)"),
        ({"name": "flow_grpo", "options": {}}, "per-step Gaussian KL to the frozen base model"),
        ({"name": "dance_grpo"}, "no KL penalty"),
        ({"name": "awm_authors", "options": {}}, "velocity distance to the frozen base model"),
        (
            {"name": "diffusion_nft", "options": {"kl_beta": 0.1}},
            "velocity distance to the frozen base model",
        ),
        ({"name": "no_such_surrogate"}, "KL penalty term of surrogate 'no_such_surrogate'"),
        (None, "KL penalty term (what it measures is the surrogate's own)"),
    ],
)
def test_the_kl_panel_says_what_the_surrogates_kl_measures(tmp_path, surrogate, fragment):
    recipe = {"run": {"name": "x"}} if surrogate is None else {"surrogate": surrogate}
    (tmp_path / "resolved_recipe.json").write_text(json.dumps(recipe))
    title = kl_title(tmp_path)
    assert fragment in title
    assert "old" not in title or "old (rollout) policy" in fragment  # never "old policy" for another anchor
    titles = [ax.get_title() for ax in training_figure([train_record(i) for i in range(1, 4)], title).axes]
    assert title in titles and "KL to the old policy" not in titles


def _data_points(fig) -> list[tuple[float, float]]:
    """Every line's points and every filled band's corners, in display pixels."""
    points = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for line in ax.get_lines():
            points += [tuple(p) for p in ax.transData.transform(line.get_xydata())]
        for band in ax.collections:
            for path in band.get_paths():
                inside = [v for v in path.vertices if ax.get_ylim()[0] <= v[1] <= ax.get_ylim()[1]]
                points += [tuple(p) for p in ax.transData.transform(inside)] if inside else []
    return points


def test_no_legend_covers_data_and_every_legend_is_on_the_figure():
    train = [train_record(i) for i in range(1, 5)]
    evals = [{**eval_record(i), "monitor/diversity": 0.5 - 0.0625 * i} for i in EVAL_ITERS]
    stops = [{"kind": "stopped", "iteration": 4}]
    figures = [
        rewards_figure(train, evals),
        training_figure(train, "KL"),
        monitors_figure(train, evals, stops, ["monitor/diversity", "detail/shapes/correct"], margin=0.02),
    ]
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
        assert legends
        points = _data_points(fig)
        assert len(points) > 20
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)
            covered = [p for p in points if box.x0 <= p[0] <= box.x1 and box.y0 <= p[1] <= box.y1]
            assert not covered, (fig.get_suptitle(), covered[:3])


def test_a_reward_axis_follows_the_curves_not_the_std_band():
    # a [0, 1] reward near its top with a wide spread: mean + std reaches 1.3
    train = [
        {**train_record(i), "reward/shapes": 0.8 + 0.04 * i, "reward_std/shapes": 0.45} for i in (1, 2, 3)
    ]
    evals = [{**eval_record(i), "reward/shapes": 0.85 + 0.02 * i} for i in (0, 2)]
    fig = rewards_figure(train, evals)
    (ax,) = [a for a in fig.axes if a.get_title() == "reward/shapes vs iteration"]
    curves = [0.84, 0.88, 0.92, 0.85, 0.89]
    low, high = ax.get_ylim()
    assert high < 1.0 and low > 0.7  # the curves' range with a margin, not the band's 0.39 .. 1.37
    assert low < min(curves) and high > max(curves)


def test_a_monitor_past_its_margin_is_a_warning_even_with_the_stop_rule_off(tmp_path):
    lines = []
    for r in records():
        if r["kind"] == "eval":  # diversity 31% below its best at the last evaluation while the reward rose
            r = {**r, "monitor/diversity": {0: 0.4, 2: 0.5, 4: 0.345}[r["iteration"]]}
        lines.append(json.dumps(r))
    run = make_run(tmp_path, lines)
    (run / "resolved_recipe.json").write_text(json.dumps({"eval": {"monitor": {"stop_when_falls": []}}}))
    text = write_report(run).read_text()
    assert '<div class="warnings">' in text
    assert "⚠ monitor/diversity is 31% below its best: 0.5 at iteration 2, 0.345 at iteration 4" in text
    assert "the stop rule was off" in text
    assert "<td>⚠ monitor/diversity</td>" in text
    assert "monitors.png" in text  # and its panel shows the margin below the best
    # within the margin (0.2 here): no warning
    (run / "resolved_recipe.json").write_text(json.dumps({"eval": {"monitor": {"margin": 0.2}}}))
    text = write_report(run).read_text()
    assert '<div class="warnings">' not in text and "⚠ monitor/diversity" not in text
