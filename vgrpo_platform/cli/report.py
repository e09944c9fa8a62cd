"""``vgrpo report RUN_DIR``: one self-contained HTML page per run, for a person judging it.

Why a static folder (``RUN_DIR/report/``): it opens from disk, can be copied or attached as is, and
needs no server. It holds ``rewards.png`` (train and held-out reward curves per reward and per
criterion, against iteration and against wall-clock seconds), ``training.png`` (loss, KL, ratio,
grad norm, time split per iteration), ``monitors.png`` (the training reward against each
reward-hacking monitor, where the run has one), copies of the sample grids and of the sounds and
videos kept beside them (``training.observe.clips``), and ``index.html`` tying them together (the
sounds as ``<audio controls>`` under their grid) with the evaluation table (first, peak and last,
each with its standard error and sample count), the warnings of the monitors, and the run's recipe.

Reads only files (``metrics.jsonl``, ``eval_stats.jsonl``, ``samples/eval_*.png``, ``recipe.toml``,
``resolved_recipe.json``, the clips in ``samples/eval_*/``); imports no torch, and matplotlib (Agg, no
pyplot state) only when drawing (``report_figures``).
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

from vgrpo_platform.cli.report_figures import (
    ReportError,
    monitors_figure,
    number,
    reward_keys,
    rewards_figure,
    save,
    training_figure,
)
from vgrpo_platform.cli.report_figures import training_panels as _panels_of
from vgrpo_platform.config.schema import MonitorSection
from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.training.observe.metrics import EVAL_STATS
from vgrpo_platform.training.observe.monitor import Fall, falls

__all__ = [
    "ReportError",
    "RunMetrics",
    "eval_table",
    "monitor_keys",
    "read_run_metrics",
    "reward_keys",
    "training_panels",
    "write_report",
]

REPORT_DIR = "report"
BEFORE_AFTER = "samples/before_after.png"  # written by the run at its end (training.observe.grids)
_GRID = re.compile(r"eval_(\d+)\.png$")
_CLIP = re.compile(r"^(\d+)_(\d+)\.(wav|mp4)$")  # training.observe.clips: <prompt>_<k>.wav / .mp4
_MINUS = "\u2212"


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


def read_eval_stats(run_dir: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """``eval_stats.jsonl``: iteration -> metric -> ``{"mean", "sem", "n"}``; ``{}`` where the run wrote
    none (runs before it existed). Unreadable lines (a killed run's torn last one) are skipped: the
    table then shows those evaluations without standard errors."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    try:
        text = (run_dir / EVAL_STATS).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            record = json.loads(line)
            out[int(record["iteration"])] = dict(record["stats"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def monitor_keys(metrics: RunMetrics, watched: list[str] | tuple[str, ...] = ()) -> list[str]:
    """What can reveal reward hacking: the keys ``[eval.monitor]`` watches, ``monitor/*`` (diversity,
    the evaluation-only total) and every evaluated reward or criterion that training never saw."""
    trained = {k for r in metrics.train for k in r}
    seen: dict[str, None] = dict.fromkeys(k for k in watched if any(k in r for r in metrics.eval))
    for r in metrics.eval:
        for k, v in r.items():
            if number(v) is None:
                continue
            if k.startswith("monitor/") or (k.startswith(("reward/", "detail/")) and k not in trained):
                seen.setdefault(k)
    return list(seen)


@dataclass(frozen=True)
class MonitorRule:
    """The run's ``[eval.monitor]`` from ``resolved_recipe.json`` (the schema's defaults without one)."""

    watched: list[str] = field(default_factory=list)  # stop_when_falls; empty: the stop rule was off
    rising: str = "reward"
    margin: float = MonitorSection().margin


def monitor_rule(run_dir: Path) -> MonitorRule:
    """``[eval.monitor]`` of the run; a key it lacks (or a run without the file) keeps its default."""
    default = MonitorRule()
    try:
        monitor = json.loads((run_dir / "resolved_recipe.json").read_text())["eval"]["monitor"]
        return MonitorRule(
            [str(k) for k in monitor.get("stop_when_falls", default.watched)],
            str(monitor.get("rising", default.rising)),
            float(monitor.get("margin", default.margin)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return default


def kl_title(run_dir: Path) -> str:
    """What the run's ``kl`` metric measures, from its surrogate's config (``kl_measures``), so the panel
    never calls a KL to the base model one to the old policy; a neutral title where that is unknown."""
    unknown = "KL penalty term (what it measures is the surrogate's own)"
    try:
        surrogate = json.loads((run_dir / "resolved_recipe.json").read_text())["surrogate"]
        name, options = str(surrogate["name"]), dict(surrogate.get("options") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return unknown
    from vgrpo_platform.host.collect import default_registry

    try:
        config = default_registry().validate_options("surrogate", name, options)
    except VgrpoError:  # the plugin is gone, or its options changed since the run
        return f"KL penalty term of surrogate '{name}'"
    measures = getattr(config, "kl_measures", None)
    return str(measures()) if callable(measures) else f"KL penalty term of surrogate '{name}'"


def training_panels(metrics: RunMetrics) -> list[tuple[str, str, tuple[str, str] | None]]:
    """The training panels this run has data for (a rollout backend's gap only where it was measured)."""
    return _panels_of(metrics.train)


def sample_grids(run_dir: Path) -> list[tuple[int, Path]]:
    """``(iteration, path)`` of ``samples/eval_NNNNNN.png``, in iteration order."""
    found = []
    for p in (run_dir / "samples").glob("eval_*.png"):
        m = _GRID.search(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


# --------------------------------------------------------------------------------------------- table
@dataclass(frozen=True)
class Cell:
    """One evaluation's value of a metric, with its standard error where ``eval_stats.jsonl`` has it."""

    iteration: int
    mean: float | None
    sem: float | None = None
    n: int | None = None


@dataclass(frozen=True)
class TableRow:
    """A metric at the first, the best (highest; the earliest on ties) and the last evaluation."""

    key: str
    first: Cell
    peak: Cell
    last: Cell


def _cell(record: dict[str, Any], key: str, stats: dict[int, dict[str, dict[str, Any]]]) -> Cell:
    it = int(record["iteration"])
    found = stats.get(it, {}).get(key, {})
    n = found.get("n")
    return Cell(it, number(record.get(key)), number(found.get("sem")), int(n) if isinstance(n, int) else None)


def eval_table(
    evals: list[dict[str, Any]], stats: dict[int, dict[str, dict[str, Any]]] | None = None
) -> list[TableRow]:
    """Every reward, criterion and ``monitor/*`` metric logged at evaluation: first, peak and last."""
    if not evals:
        return []
    stats = stats or {}
    monitors = [k for k in dict.fromkeys(k for r in evals for k in r) if k.startswith("monitor/")]
    rows = []
    for key in [*reward_keys(evals), *monitors]:
        held = [r for r in evals if number(r.get(key)) is not None]
        peak = max(held, key=lambda r: r[key]) if held else evals[-1]  # max keeps the earliest of equals
        rows.append(
            TableRow(key, _cell(evals[0], key, stats), _cell(peak, key, stats), _cell(evals[-1], key, stats))
        )
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"


def _with_sem(cell: Cell) -> str:
    text = _fmt(cell.mean)
    if cell.sem is not None and math.isfinite(cell.sem):
        text += f" ± {cell.sem:.2g}"
    return text


def _delta(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "–"
    d = b - a
    return "0" if d == 0 else ("+" if d > 0 else _MINUS) + _fmt(abs(d))


def _table_html(rows: list[TableRow], warned: set[str]) -> str:
    if not rows:
        return "<p>No evaluation records in metrics.jsonl.</p>"
    first, last = rows[0].first.iteration, rows[0].last.iteration
    head = (
        f"<tr><th>metric</th><th>n</th><th>first eval (iteration {first})</th><th>peak</th>"
        f"<th>peak iteration</th><th>last eval (iteration {last})</th><th>last {_MINUS} first</th>"
        f"<th>last {_MINUS} peak</th></tr>"
    )
    body = []
    for row in rows:
        ns = {c.n for c in (row.first, row.peak, row.last) if c.n is not None}
        below = row.last.mean is not None and row.peak.mean is not None and row.last.mean < row.peak.mean
        classes = [c for c, on in (("warn", row.key in warned), ("below", below)) if on]
        mark = "⚠ " if row.key in warned else ""
        attr = f' class="{" ".join(classes)}"' if classes else ""
        body.append(
            f"<tr{attr}><td>{mark}{html.escape(row.key)}</td>"
            f"<td>{'/'.join(str(n) for n in sorted(ns)) or '–'}</td>"
            f"<td>{_with_sem(row.first)}</td><td>{_with_sem(row.peak)}</td><td>{row.peak.iteration}</td>"
            f"<td>{_with_sem(row.last)}</td><td>{_delta(row.first.mean, row.last.mean)}</td>"
            f"<td>{_delta(row.peak.mean, row.last.mean)}</td></tr>"
        )
    note = (
        '<p class="small">± one standard error of the mean (std / √n, unbiased std) over the <i>n</i> '
        "held-out samples (prompts for <code>monitor/diversity</code>); – where the run wrote no "
        f"<code>{EVAL_STATS}</code>. Peak: the highest evaluation. Shaded rows end below their peak"
        "; ⚠ marks a monitor past its margin (warnings above).</p>"
    )
    return f"<table>{head}{''.join(body)}</table>{note}"


# ------------------------------------------------------------------------------------------- HTML
def _figure_html(src: str, caption: str, cls: str = "plot") -> str:
    src, caption = html.escape(src), html.escape(caption)
    image = f'<a href="{src}"><img src="{src}" alt="{caption}"></a>'
    return f'<figure class="{cls}">{image}<figcaption>{caption}</figcaption></figure>'


def clips_of(grid: Path) -> list[tuple[int, int, Path]]:
    """``(prompt, k, path)`` of the sounds and videos kept beside ``grid`` (in ``grid`` without its
    suffix), in prompt, then sample order."""
    found = [(m, p) for p in grid.with_suffix("").glob("*_*.*") if (m := _CLIP.match(p.name))]
    return sorted((int(m.group(1)), int(m.group(2)), p) for m, p in found)


def _prompts_of(grid: Path) -> list[str]:
    """The prompts of ``grid``'s tiles from the layout beside it (``grids.save_grid``); [] without one."""
    try:
        return [str(t.get("prompt", "")) for t in json.loads(grid.with_suffix(".json").read_text())["tiles"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def _clips_html(run_dir: Path, src: str) -> str:
    """The sounds (``<audio controls>``) and videos kept beside the grid ``src`` (relative to the report
    folder, where ``write_report`` copied them), each captioned with its prompt."""
    clips = clips_of(run_dir / REPORT_DIR / src)
    if not clips:
        return ""
    prompts = _prompts_of(run_dir / src)
    items = []
    for prompt, k, path in clips:
        rel = html.escape(f"{Path(src).with_suffix('').as_posix()}/{path.name}")
        tag = "video" if path.suffix == ".mp4" else "audio"
        text = prompts[prompt] if prompt < len(prompts) else f"prompt {prompt}"
        caption = html.escape(f"{text} (sample {k + 1})")
        items.append(
            f'<figure class="clip"><{tag} controls preload="none" src="{rel}"></{tag}>'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    return f'<div class="clips">{"".join(items)}</div>'


def _grid_html(run_dir: Path, src: str, caption: str) -> str:
    """A sample grid at its own size, its sounds and videos under it."""
    return _figure_html(src, caption, "grid") + _clips_html(run_dir, src)


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
img { border: 1px solid #ddd; }
figure { margin: 0.5em 0; }
figure.plot img { max-width: 100%; }
/* sample grids keep their own size (their labels are 11 px): they wrap or scroll, never shrink */
figure.grid { display: inline-block; vertical-align: top; max-width: 100%; overflow-x: auto;
  margin-right: 1em; }
figure.grid img { max-width: none; image-rendering: pixelated; }
details.grid { margin: 0.3em 0; }
figure.clip { display: inline-block; margin: 0.2em 0.8em 0.2em 0; font-size: 0.85em; }
figure.clip audio { display: block; height: 2em; }
figure.clip video { display: block; max-width: 320px; image-rendering: pixelated; }
table { border-collapse: collapse; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: right; }
td:first-child { text-align: left; font-family: monospace; }
tr.below td { background: #fbf3e4; }
tr.warn td:first-child { color: #b00; font-weight: bold; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
.note { color: #a60; }
.small { font-size: 0.9em; color: #555; }
.warnings { border: 2px solid #c33; background: #fdf0f0; padding: 0.3em 1em; margin: 1em 0; }
.warnings p { color: #900; }
"""


def _warnings_html(found: list[Fall], rule: MonitorRule) -> str:
    if not found:
        return ""
    if rule.watched:
        how = f"[eval.monitor] stops the run after {html.escape(', '.join(rule.watched))} fall"
    else:
        how = "[eval.monitor] stop_when_falls is empty: the stop rule was off, so nothing stopped the run"
    lines = "".join(f"<p>⚠ {html.escape(f.message())}</p>" for f in found)
    return (
        f'<div class="warnings"><h3>Warnings: a monitor is past its margin at the last evaluation</h3>'
        f'{lines}<p class="small">{how}.</p></div>\n'
    )


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


def _samples_html(run_dir: Path, grids: list[tuple[int, str]]) -> str:
    if not grids:
        return "<p>No sample grids (samples/eval_*.png) in the run directory.</p>"
    before_after = ""
    if (run_dir / REPORT_DIR / BEFORE_AFTER).is_file():
        caption = "each prompt's samples at the first and the last evaluation"
        before_after = _figure_html(BEFORE_AFTER, caption, "grid")
    (i0, p0), (i1, p1) = grids[0], grids[-1]
    pair = _grid_html(run_dir, p0, f"first evaluation, iteration {i0}")
    pair += _grid_html(run_dir, p1, f"last evaluation, iteration {i1}")
    every = "".join(
        f'<details class="grid"><summary>iteration {i}</summary>'
        f"{_grid_html(run_dir, p, f'iteration {i}')}</details>"
        for i, p in grids
    )
    return (
        "<p>Held-out prompts, each with its samples under it; the same seeds at every evaluation. "
        "Where a reward judges each sample (a <code>correct</code> detail), its border is green "
        "(right) or red (wrong). Grids are shown at their own size: a video as a filmstrip of evenly "
        "spaced frames, a sound as its spectrogram (time left to right, low pitches at the bottom), with "
        "a few of them to play under the grid.</p>"
        f"{before_after}"
        f'<div class="pair">{pair}</div><h3>Every evaluation, in order (click to open)</h3>'
        f'<div class="all">{every}</div>'
    )


def render_html(
    run_dir: Path,
    metrics: RunMetrics,
    grids: list[tuple[int, str]],
    monitors: bool = False,
    *,
    stats: dict[int, dict[str, dict[str, Any]]] | None = None,
    warnings: list[Fall] | None = None,
    rule: MonitorRule | None = None,
) -> str:
    """The page; ``grids`` are ``(iteration, path relative to the report folder)``; ``monitors``: whether
    ``monitors.png`` was drawn; ``warnings``: the monitors past their margin at the last evaluation."""
    name = html.escape(run_dir.resolve().name)
    last_train = metrics.train[-1] if metrics.train else {}
    facts = [
        f"{len(metrics.train)} train iterations"
        + (f" (last: {last_train['iteration']})" if last_train else ""),
        f"{len(metrics.eval)} evaluations",
    ]
    wall = number(last_train.get("wall_seconds"))
    if wall is not None:
        facts.append(f"{wall:.1f} wall-clock seconds")
    note = (
        '<p class="note">The last line of metrics.jsonl was incomplete (a killed run?) and was skipped.</p>'
        if metrics.torn_last_line
        else ""
    )
    found = warnings or []
    table = _table_html(eval_table(metrics.eval, stats), {f.key for f in found})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vgrpo report: {name}</title><style>{_CSS}</style></head>
<body>
<h1>vgrpo report: {name}</h1>
<p>{html.escape(", ".join(facts))}. Run directory: <code>{html.escape(str(run_dir))}</code></p>{note}
{_warnings_html(found, rule or MonitorRule())}<h2>Held-out evaluation: first, peak and last</h2>
{table}
<h2>Rewards</h2>
{_figure_html("rewards.png", "rewards per iteration (left) and per wall-clock second (right)")}
{_monitors_html(metrics, monitors)}<h2>Training</h2>
{_figure_html("training.png", "loss, KL, ratio, grad norm, zero-spread groups and time split per iteration")}
<h2>Samples</h2>
{_samples_html(run_dir, grids)}
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
    rule = monitor_rule(run_dir)
    save(rewards_figure(metrics.train, metrics.eval), out / "rewards.png")
    save(training_figure(metrics.train, kl_title(run_dir)), out / "training.png")
    monitors = monitor_keys(metrics, rule.watched)
    if monitors:
        figure = monitors_figure(
            metrics.train, metrics.eval, metrics.stopped, monitors, rule.rising, rule.margin
        )
        save(figure, out / "monitors.png")
    else:
        (out / "monitors.png").unlink(missing_ok=True)  # a stale one from an earlier report
    samples_out = out / "samples"
    shutil.rmtree(samples_out, ignore_errors=True)  # ours: stale copies from an earlier report go
    grids = []
    for iteration, src in sample_grids(run_dir):
        samples_out.mkdir(exist_ok=True)
        shutil.copy2(src, samples_out / src.name)
        for _, _, clip in clips_of(src):  # the sounds and videos beside it, into the same relative place
            (samples_out / src.stem).mkdir(exist_ok=True)
            shutil.copy2(clip, samples_out / src.stem / clip.name)
        grids.append((iteration, f"samples/{src.name}"))
    if (run_dir / BEFORE_AFTER).is_file():
        samples_out.mkdir(exist_ok=True)
        shutil.copy2(run_dir / BEFORE_AFTER, out / BEFORE_AFTER)
    found = falls(metrics.eval, monitors, margin=rule.margin, rising=rule.rising)
    page = render_html(
        run_dir,
        metrics,
        grids,
        monitors=bool(monitors),
        stats=read_eval_stats(run_dir),
        warnings=found,
        rule=rule,
    )
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
