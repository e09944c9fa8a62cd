"""``vgrpo report RUN_DIR``: one self-contained HTML page per run, for a person judging it.

Why a static folder (``RUN_DIR/report/``): it opens from disk, can be copied or attached as is, and
needs no server. It holds ``rewards.png`` (train and held-out reward curves per reward and per
criterion, against iteration and against wall-clock seconds), ``training.png`` (loss, KL, ratio,
grad norm, time split per iteration), ``monitors.png`` (the training reward against each
reward-hacking monitor, where the run has one), copies of the sample grids, and ``index.html``
tying them together with a first-vs-last evaluation table and the run's recipe.

Reads only files (``metrics.jsonl``, ``samples/eval_*.png``, ``recipe.toml``,
``resolved_recipe.json``); imports no torch, and matplotlib (Agg, no pyplot state) only when drawing.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgrpo_platform.errors import VgrpoError

REPORT_DIR = "report"
BEFORE_AFTER = "samples/before_after.png"  # written by the run at its end (training.observe.grids)
TRAINING_PANELS = (  # (title, main key, (band low, band high) or None)
    ("loss", "loss", None),
    ("KL to the old policy", "kl", None),
    ("importance ratio (mean, min-max band)", "ratio_mean", ("ratio_min", "ratio_max")),
    ("grad norm (before clipping)", "grad_norm", None),
    ("fraction of groups with zero reward spread (no signal)", "zero_std_fraction", None),
    # a rollout backend that is not exact (rollout.mismatch_every): what its speed costs
    ("rollout backend vs exact sampler: relative latent distance", "rollout_mismatch_rel_rmse", None),
    ("rollout backend vs exact sampler: reward gap (backend - exact)", "rollout_mismatch_reward_gap", None),
    ("rollout staleness (updates behind the trained weights)", "rollout_staleness", None),
)
TIME_KEYS = ("time_rollout", "time_reward", "time_train")
_NOT_METRICS = {"kind", "iteration", "wall_seconds", "epoch"}
_GRID = re.compile(r"eval_(\d+)\.png$")


class ReportError(VgrpoError):
    """The run directory cannot be reported on (missing, no or unreadable metrics)."""


@dataclass
class RunMetrics:
    """A run's ``metrics.jsonl`` split by kind, each list sorted by iteration."""

    train: list[dict[str, Any]] = field(default_factory=list)
    eval: list[dict[str, Any]] = field(default_factory=list)
    stopped: list[dict[str, Any]] = field(default_factory=list)  # [eval.monitor] stops (kind "stopped")
    torn_last_line: bool = False  # a killed run's partial last line was skipped


# ------------------------------------------------------------------------------------------ reading
def read_run_metrics(path: Path) -> RunMetrics:
    """Parse ``metrics.jsonl``; a torn last line is skipped, any other bad line is an error."""
    if not path.is_file():
        raise ReportError(f"{path} not found; is {path.parent} a run directory written by `vgrpo run`?")
    lines = [
        (n, line) for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if line.strip()
    ]
    if not lines:
        raise ReportError(f"{path} is empty: the run wrote no metrics yet; report again after an iteration")
    out = RunMetrics()
    for pos, (n, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if pos == len(lines) - 1:  # the process was killed mid-write
                out.torn_last_line = True
                continue
            raise ReportError(f"{path}:{n}: not valid JSON; the metrics file is corrupt") from None
        if not isinstance(record, dict) or not isinstance(record.get("iteration"), int | float):
            raise ReportError(f"{path}:{n}: expected a JSON object with an 'iteration'; the file is corrupt")
        kind = record.get("kind")
        if kind == "train":
            out.train.append(record)
        elif kind == "eval":
            out.eval.append(record)
        elif kind == "stopped":
            out.stopped.append(record)
    if not out.train and not out.eval:
        raise ReportError(f"{path} holds no train or eval records; report again after an iteration")
    out.train.sort(key=lambda r: r["iteration"])
    out.eval.sort(key=lambda r: r["iteration"])
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def reward_keys(records: list[dict[str, Any]]) -> list[str]:
    """``reward``, then ``reward/<name>``, then ``detail/<name>/<criterion>``, in first-seen order."""
    seen: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if _number(v) is not None and (k == "reward" or k.startswith(("reward/", "detail/"))):
                seen.setdefault(k)

    def rank(k: str) -> int:
        return 0 if k == "reward" else 1 if k.startswith("reward/") else 2

    return sorted(seen, key=rank)  # stable: first-seen order within each group


def monitor_keys(metrics: RunMetrics, watched: list[str] | tuple[str, ...] = ()) -> list[str]:
    """What can reveal reward hacking: the keys ``[eval.monitor]`` watches, ``monitor/*`` (diversity,
    the evaluation-only total) and every evaluated reward or criterion that training never saw."""
    trained = {k for r in metrics.train for k in r}
    seen: dict[str, None] = dict.fromkeys(k for k in watched if any(k in r for r in metrics.eval))
    for r in metrics.eval:
        for k, v in r.items():
            if _number(v) is None:
                continue
            if k.startswith("monitor/") or (k.startswith(("reward/", "detail/")) and k not in trained):
                seen.setdefault(k)
    return list(seen)


def watched_keys(run_dir: Path) -> tuple[list[str], str]:
    """``[eval.monitor]``'s ``(stop_when_falls, rising)`` from ``resolved_recipe.json``; default ``[]``."""
    try:
        monitor = json.loads((run_dir / "resolved_recipe.json").read_text())["eval"]["monitor"]
        return [str(k) for k in monitor["stop_when_falls"]], str(monitor["rising"])
    except (OSError, ValueError, KeyError, TypeError):
        return [], "reward"


def _series(records: list[dict[str, Any]], key: str, x: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        xv, yv = _number(r.get(x)), _number(r.get(key))
        if xv is not None and yv is not None:
            xs.append(xv)
            ys.append(yv)
    return xs, ys


def sample_grids(run_dir: Path) -> list[tuple[int, Path]]:
    """``(iteration, path)`` of ``samples/eval_NNNNNN.png``, in iteration order."""
    found = []
    for p in (run_dir / "samples").glob("eval_*.png"):
        m = _GRID.search(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


# ------------------------------------------------------------------------------------------ drawing
def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("`vgrpo report` needs matplotlib: pip install matplotlib") from None
    return Figure, FigureCanvasAgg


def _panel_groups(keys: list[str]) -> list[tuple[str, list[str]]]:
    """One panel for the total, one per reward, one per reward's criteria (they share a [0, 1]-ish scale)."""
    groups: list[tuple[str, list[str]]] = []
    details: dict[str, list[str]] = {}
    for k in keys:
        if k.startswith("detail/"):
            name = k.split("/")[1] if k.count("/") >= 2 else "detail"
            details.setdefault(name, []).append(k)
        else:
            groups.append((k if k != "reward" else "reward (weighted total)", [k]))
    groups += [(f"detail/{name}/* (criteria)", ks) for name, ks in details.items()]
    return groups


def plot_rewards(metrics: RunMetrics, path: Path) -> Path:
    """Train (thin line) and eval (markers) rewards; left column per iteration, right per wall second."""
    Figure, Canvas = _matplotlib()
    groups = _panel_groups(reward_keys(metrics.train + metrics.eval))
    if not groups:
        groups = [("reward (none logged)", [])]
    fig = Figure(figsize=(13, 2.9 * len(groups) + 0.6), dpi=100, layout="constrained")
    Canvas(fig)
    axes = fig.subplots(len(groups), 2, squeeze=False)
    palette = [f"C{i}" for i in range(10)]
    for row, (title, keys) in enumerate(groups):
        for col, (x, xlabel) in enumerate(
            (("iteration", "iteration"), ("wall_seconds", "wall-clock seconds"))
        ):
            ax = axes[row][col]
            for i, key in enumerate(keys):
                color = palette[i % len(palette)]
                label = key.split("/")[-1] if key.startswith("detail/") else ""
                xs, ys = _series(metrics.train, key, x)
                if xs:
                    ax.plot(xs, ys, color=color, lw=1.0, alpha=0.55, label=f"train {label}".strip())
                    std = f"reward_std/{key.removeprefix('reward/')}" if key.startswith("reward/") else ""
                    xs_std, sds = _series(metrics.train, std, x) if std else ([], [])
                    if len(xs_std) == len(xs):
                        ax.fill_between(
                            xs,
                            [y - s for y, s in zip(ys, sds, strict=True)],
                            [y + s for y, s in zip(ys, sds, strict=True)],
                            color=color,
                            alpha=0.12,
                            lw=0,
                            label="train ±1 std within batch",
                        )
                xs, ys = _series(metrics.eval, key, x)
                if xs:
                    ax.plot(xs, ys, color=color, lw=2.0, marker="o", ms=5, label=f"eval {label}".strip())
            ax.set_title(f"{title} vs {xlabel}", fontsize=10)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(keys[0] if len(keys) == 1 else "criterion score")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="best", ncol=2 if len(keys) > 2 else 1)
    fig.suptitle("Rewards: train (thin) and held-out eval (markers, fixed prompts and seeds)")
    fig.savefig(path)
    return path


def training_panels(metrics: RunMetrics) -> list[tuple[str, str, tuple[str, str] | None]]:
    """The ``TRAINING_PANELS`` this run has data for (a rollout backend's gap only where it was measured)."""
    return [p for p in TRAINING_PANELS if _series(metrics.train, p[1], "iteration")[0]]


def plot_training(metrics: RunMetrics, path: Path) -> Path:
    """Loss, KL, ratio, grad norm per iteration, and where each iteration's seconds went."""
    Figure, Canvas = _matplotlib()
    panels = training_panels(metrics)
    has_time = any(_series(metrics.train, k, "iteration")[0] for k in TIME_KEYS)
    n = len(panels) + int(has_time) or 1
    cols = 2 if n > 1 else 1
    rows = -(-n // cols)
    fig = Figure(figsize=(6.5 * cols, 3.2 * rows + 0.6), dpi=100, layout="constrained")
    Canvas(fig)
    axes = [ax for row in fig.subplots(rows, cols, squeeze=False) for ax in row]
    for ax, (title, key, band) in zip(axes, panels, strict=False):
        xs, ys = _series(metrics.train, key, "iteration")
        ax.plot(xs, ys, color="C0", lw=1.3, marker="." if len(xs) <= 60 else None, label=key)
        if band:
            lo, hi = (_series(metrics.train, b, "iteration") for b in band)
            if lo[0] == hi[0] and lo[0]:
                ax.fill_between(
                    lo[0], lo[1], hi[1], color="C0", alpha=0.2, lw=0, label=f"{band[0]} .. {band[1]}"
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    used = len(panels)
    if has_time:
        ax = axes[used]
        used += 1
        iters = [float(r["iteration"]) for r in metrics.train]
        bottom = [0.0] * len(iters)
        for i, key in enumerate(TIME_KEYS):
            ys = [_number(r.get(key)) or 0.0 for r in metrics.train]
            ax.bar(
                iters,
                ys,
                bottom=bottom,
                width=1.0,
                color=f"C{i + 1}",
                label=key.removeprefix("time_"),
                edgecolor="white" if len(iters) <= 60 else "none",
                linewidth=0.5,
            )
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        ax.set_title("time per iteration (stacked)", fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, loc="best")
    if used == 0:
        axes[0].text(0.5, 0.5, "no train records yet", ha="center", va="center", transform=axes[0].transAxes)
        used = 1
    for ax in axes[used:]:
        ax.set_visible(False)
    fig.suptitle("Training diagnostics per iteration")
    fig.savefig(path)
    return path


def plot_monitors(metrics: RunMetrics, path: Path, keys: list[str], rising: str = "reward") -> Path:
    """One panel per monitor: the training reward (left axis: train thin, eval markers) and the monitor
    at each evaluation (right axis), so a reward that rises while the monitor falls is seen at once.
    A dashed line marks where ``[eval.monitor]`` stopped the run."""
    Figure, Canvas = _matplotlib()
    cols = 2 if len(keys) > 1 else 1
    rows = -(-len(keys) // cols)
    fig = Figure(figsize=(6.5 * cols, 3.2 * rows + 0.6), dpi=100, layout="constrained")
    Canvas(fig)
    axes = [ax for row in fig.subplots(rows, cols, squeeze=False) for ax in row]
    for ax, key in zip(axes, keys, strict=False):
        xs, ys = _series(metrics.train, "reward", "iteration")
        if xs:
            ax.plot(xs, ys, color="C0", lw=1.0, alpha=0.55, label="train reward")
        xs, ys = _series(metrics.eval, rising, "iteration")
        ax.plot(xs, ys, color="C0", lw=2.0, marker="o", ms=4, label=f"eval {rising}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("training reward", color="C0")
        twin = ax.twinx()
        xs, ys = _series(metrics.eval, key, "iteration")
        twin.plot(xs, ys, color="C3", lw=2.0, marker="s", ms=4, label=key)
        twin.set_ylabel(key, color="C3")
        for stop in metrics.stopped:
            ax.axvline(stop["iteration"], color="k", ls="--", lw=1.0, label="stopped by the monitor")
        ax.set_title(f"training reward vs {key}", fontsize=10)
        ax.grid(alpha=0.3)
        handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
        labels = [t for a in (ax, twin) for t in a.get_legend_handles_labels()[1]]
        ax.legend(handles, labels, fontsize=8, loc="best")
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    fig.suptitle("Reward-hacking monitors: the reward should not rise while a monitor falls")
    fig.savefig(path)
    return path


# ------------------------------------------------------------------------------------------- HTML
def _fmt(value: Any) -> str:
    v = _number(value)
    if v is None:
        return "–"
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}"


def eval_table(evals: list[dict[str, Any]]) -> list[tuple[str, Any, Any]]:
    """``(metric, first value, last value)`` for every reward / criterion logged at evaluation."""
    if not evals:
        return []
    first, last = evals[0], evals[-1]
    monitors = [k for k in dict.fromkeys(k for r in evals for k in r) if k.startswith("monitor/")]
    return [(k, first.get(k), last.get(k)) for k in [*reward_keys(evals), *monitors]]


def _table_html(evals: list[dict[str, Any]]) -> str:
    rows = eval_table(evals)
    if not rows:
        return "<p>No evaluation records in metrics.jsonl.</p>"
    first, last = evals[0], evals[-1]
    head = (
        f"<tr><th>metric</th><th>first eval (iteration {first['iteration']})</th>"
        f"<th>last eval (iteration {last['iteration']})</th><th>change</th></tr>"
    )
    body = []
    for key, a, b in rows:
        na, nb = _number(a), _number(b)
        delta = _fmt(nb - na) if na is not None and nb is not None else "–"
        if delta not in ("–", "nan") and not delta.startswith("-"):
            delta = "+" + delta
        body.append(
            f"<tr><td>{html.escape(key)}</td><td>{_fmt(a)}</td><td>{_fmt(b)}</td><td>{delta}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def _figure_html(src: str, caption: str) -> str:
    src, caption = html.escape(src), html.escape(caption)
    image = f'<a href="{src}"><img src="{src}" alt="{caption}"></a>'
    return f"<figure>{image}<figcaption>{caption}</figcaption></figure>"


def _recipe_html(run_dir: Path) -> str:
    parts: list[str] = []
    for name in ("recipe.toml", "resolved_recipe.json"):
        p = run_dir / name
        if p.is_file():
            text = html.escape(p.read_text(errors="replace"))
            opened = " open" if not parts else ""
            parts.append(f"<details{opened}><summary>{name}</summary><pre>{text}</pre></details>")
    return "".join(parts) or "<p>No recipe.toml or resolved_recipe.json in the run directory.</p>"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
img { max-width: 100%; image-rendering: pixelated; border: 1px solid #ddd; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; text-align: center; }
.pair figure { width: 45%; } .pair img { width: 100%; }
.all figure img { width: 240px; }
table { border-collapse: collapse; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: right; }
td:first-child { text-align: left; font-family: monospace; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
.note { color: #a60; }
"""


def _monitors_html(metrics: RunMetrics, drawn: bool) -> str:
    if not drawn:
        return ""
    stops = "".join(
        f'<p class="note">Stopped at iteration {html.escape(str(r["iteration"]))}: '
        f"{html.escape(str(r.get('reason', '')))}</p>"
        for r in metrics.stopped
    )
    figure = _figure_html("monitors.png", "training reward (left axis) against each monitor (right axis)")
    return f"<h2>Reward-hacking monitors</h2>\n{stops}{figure}\n"


def render_html(
    run_dir: Path, metrics: RunMetrics, grids: list[tuple[int, str]], monitors: bool = False
) -> str:
    """The page; ``grids`` are ``(iteration, path relative to the report folder)``; ``monitors``: whether
    ``monitors.png`` was drawn."""
    name = html.escape(run_dir.resolve().name)
    last_train = metrics.train[-1] if metrics.train else {}
    facts = [
        f"{len(metrics.train)} train iterations"
        + (f" (last: {last_train['iteration']})" if last_train else ""),
        f"{len(metrics.eval)} evaluations",
    ]
    wall = _number(last_train.get("wall_seconds"))
    if wall is not None:
        facts.append(f"{wall:.1f} wall-clock seconds")
    note = (
        '<p class="note">The last line of metrics.jsonl was incomplete (a killed run?) and was skipped.</p>'
        if metrics.torn_last_line
        else ""
    )
    before_after = ""
    if (run_dir / REPORT_DIR / BEFORE_AFTER).is_file():
        caption = "each prompt's samples at the first and the last evaluation"
        before_after = _figure_html(BEFORE_AFTER, caption)
    if grids:
        (i0, p0), (i1, p1) = grids[0], grids[-1]
        pair = _figure_html(p0, f"first evaluation, iteration {i0}")
        pair += _figure_html(p1, f"last evaluation, iteration {i1}")
        every = "".join(_figure_html(p, f"iteration {i}") for i, p in grids)
        samples = (
            "<p>Held-out prompts, each with its samples under it; the same seeds at every evaluation. "
            "Where a reward judges each sample (a <code>correct</code> detail), its border is green "
            "(right) or red (wrong).</p>"
            f"{before_after}"
            f'<div class="pair">{pair}</div><h3>All evaluations, in order</h3><div class="all">{every}</div>'
        )
    else:
        samples = "<p>No sample grids (samples/eval_*.png) in the run directory.</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vgrpo report: {name}</title><style>{_CSS}</style></head>
<body>
<h1>vgrpo report: {name}</h1>
<p>{html.escape(", ".join(facts))}. Run directory: <code>{html.escape(str(run_dir))}</code></p>{note}
<h2>Held-out evaluation: first vs last</h2>
{_table_html(metrics.eval)}
<h2>Rewards</h2>
{_figure_html("rewards.png", "rewards per iteration (left) and per wall-clock second (right)")}
{_monitors_html(metrics, monitors)}<h2>Training</h2>
{_figure_html("training.png", "loss, KL, ratio, grad norm, zero-spread groups and time split per iteration")}
<h2>Samples</h2>
{samples}
<h2>Recipe</h2>
{_recipe_html(run_dir)}
</body></html>
"""


# ------------------------------------------------------------------------------------------ entry
def write_report(run_dir: Path | str) -> Path:
    """Write ``run_dir/report/`` (plots, copied grids, ``index.html``); returns the ``index.html`` path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"run directory {run_dir} not found; pass run.output_dir/run.name of a `vgrpo run`")
    metrics = read_run_metrics(run_dir / "metrics.jsonl")
    out = run_dir / REPORT_DIR
    out.mkdir(exist_ok=True)
    plot_rewards(metrics, out / "rewards.png")
    plot_training(metrics, out / "training.png")
    watched, rising = watched_keys(run_dir)
    monitors = monitor_keys(metrics, watched)
    if monitors:
        plot_monitors(metrics, out / "monitors.png", monitors, rising)
    else:
        (out / "monitors.png").unlink(missing_ok=True)  # a stale one from an earlier report
    samples_out = out / "samples"
    shutil.rmtree(samples_out, ignore_errors=True)  # ours: stale copies from an earlier report go
    grids = []
    for iteration, src in sample_grids(run_dir):
        samples_out.mkdir(exist_ok=True)
        shutil.copy2(src, samples_out / src.name)
        grids.append((iteration, f"samples/{src.name}"))
    if (run_dir / BEFORE_AFTER).is_file():
        samples_out.mkdir(exist_ok=True)
        shutil.copy2(run_dir / BEFORE_AFTER, out / BEFORE_AFTER)
    index = out / "index.html"
    index.write_text(render_html(run_dir, metrics, grids, monitors=bool(monitors)), encoding="utf-8")
    return index
