"""The figures of ``vgrpo report``: rewards, training diagnostics and reward-hacking monitors, as PNG.

Drawn from a run's records (``metrics.jsonl`` lines as dicts) with matplotlib's object API (Agg, no
pyplot state), imported only when drawing. Three rules keep a figure honest:

- a legend never covers data: it sits outside the axes (right of a panel, or under the figure);
- an axis is scaled to the data drawn as lines and markers, never to a spread band around them (a
  ``reward +- std`` band of a reward in [0, 1] would otherwise push the axis past 1): the band is
  clipped at the axis;
- a panel says what its series is (the KL panel names its anchor, from the surrogate's config).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgrpo_platform.errors import VgrpoError

KL_PANEL = "kl"  # the metric whose title the surrogate gives (``kl_measures``)
TRAINING_PANELS = (  # (title, main key, (band low, band high) or None)
    ("loss", "loss", None),
    ("KL penalty term", KL_PANEL, None),
    ("importance ratio (line: mean; band: min .. max)", "ratio_mean", ("ratio_min", "ratio_max")),
    ("grad norm (before clipping)", "grad_norm", None),
    ("fraction of groups with zero reward spread (no signal)", "zero_std_fraction", None),
    # a rollout backend that is not exact (rollout.mismatch_every): what its speed costs
    ("rollout backend vs exact sampler: relative latent distance", "rollout_mismatch_rel_rmse", None),
    ("rollout backend vs exact sampler: reward gap (backend - exact)", "rollout_mismatch_reward_gap", None),
    ("rollout staleness (updates behind the trained weights)", "rollout_staleness", None),
)
TIME_KEYS = ("time_rollout", "time_reward", "time_train")
LEGEND = {"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0}

Records = Sequence[dict[str, Any]]


class ReportError(VgrpoError):
    """The run directory cannot be reported on (missing, no or unreadable metrics, no matplotlib)."""


def number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def series(records: Records, key: str, x: str) -> tuple[list[float], list[float]]:
    """``(xs, ys)`` of the records holding both ``x`` and ``key`` as numbers."""
    xs, ys = [], []
    for r in records:
        xv, yv = number(r.get(x)), number(r.get(key))
        if xv is not None and yv is not None:
            xs.append(xv)
            ys.append(yv)
    return xs, ys


def reward_keys(records: Records) -> list[str]:
    """``reward``, then ``reward/<name>``, then ``detail/<name>/<criterion>``, in first-seen order."""
    seen: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if number(v) is not None and (k == "reward" or k.startswith(("reward/", "detail/"))):
                seen.setdefault(k)

    def rank(k: str) -> int:
        return 0 if k == "reward" else 1 if k.startswith("reward/") else 2

    return sorted(seen, key=rank)  # stable: first-seen order within each group


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("`vgrpo report` needs matplotlib: pip install matplotlib") from None
    return Figure, FigureCanvasAgg


def data_limits(values: Sequence[float]) -> tuple[float, float] | None:
    """Axis limits around ``values`` with a 6% margin (a flat series gets a small one); None if empty."""
    if not values:
        return None
    lo, hi = min(values), max(values)
    pad = 0.06 * (hi - lo) if hi > lo else max(abs(hi) * 0.05, 1e-3)
    return lo - pad, hi + pad


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


def rewards_figure(train: Records, evals: Records) -> Any:
    """Train (thin line, with the batch's +-1 std band where logged) and eval (markers) rewards; left
    column per iteration, right per wall second, whose panels carry the row's legend on their right."""
    Figure, Canvas = _matplotlib()
    groups = _panel_groups(reward_keys([*train, *evals])) or [("reward (none logged)", [])]
    fig = Figure(figsize=(14, 2.9 * len(groups) + 0.6), dpi=100, layout="constrained")
    Canvas(fig)
    axes = fig.subplots(len(groups), 2, squeeze=False)
    for row, (title, keys) in enumerate(groups):
        for col, (x, xlabel) in enumerate(
            (("iteration", "iteration"), ("wall_seconds", "wall-clock seconds"))
        ):
            ax = axes[row][col]
            drawn: list[float] = []
            for i, key in enumerate(keys):
                color = f"C{i % 10}"
                label = key.split("/")[-1] if key.startswith("detail/") else ""
                xs, ys = series(train, key, x)
                if xs:
                    ax.plot(xs, ys, color=color, lw=1.0, alpha=0.55, label=f"train {label}".strip())
                    drawn += ys
                    std = f"reward_std/{key.removeprefix('reward/')}" if key.startswith("reward/") else ""
                    xs_std, sds = series(train, std, x) if std else ([], [])
                    if len(xs_std) == len(xs):
                        ax.fill_between(
                            xs,
                            [y - s for y, s in zip(ys, sds, strict=True)],
                            [y + s for y, s in zip(ys, sds, strict=True)],
                            color=color,
                            alpha=0.12,
                            lw=0,
                            label="train ±1 std within batch (clipped at the axis)",
                        )
                xs, ys = series(evals, key, x)
                if xs:
                    ax.plot(xs, ys, color=color, lw=2.0, marker="o", ms=5, label=f"eval {label}".strip())
                    drawn += ys
            limits = data_limits(drawn)
            if limits is not None:
                ax.set_ylim(*limits)  # the lines' range, not the band's
            ax.set_title(f"{title} vs {xlabel}", fontsize=10)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(keys[0] if len(keys) == 1 else "criterion score")
            ax.grid(alpha=0.3)
            if col == 1 and ax.get_legend_handles_labels()[0]:
                ax.legend(**LEGEND)
    fig.suptitle("Rewards: train (thin) and held-out eval (markers, fixed prompts and seeds)")
    return fig


def training_panels(train: Records) -> list[tuple[str, str, tuple[str, str] | None]]:
    """The ``TRAINING_PANELS`` this run has data for (a rollout backend's gap only where it was measured)."""
    return [p for p in TRAINING_PANELS if series(train, p[1], "iteration")[0]]


def training_figure(train: Records, kl_title: str = "") -> Any:
    """Loss, KL (titled ``kl_title``: what the surrogate's ``kl`` measures), ratio, grad norm per
    iteration, and where each iteration's seconds went."""
    Figure, Canvas = _matplotlib()
    panels = training_panels(train)
    has_time = any(series(train, k, "iteration")[0] for k in TIME_KEYS)
    n = len(panels) + int(has_time) or 1
    cols = 2 if n > 1 else 1
    rows = -(-n // cols)
    fig = Figure(figsize=(13 if cols == 2 else 6.5, 3.2 * rows + 0.6), dpi=100, layout="constrained")
    Canvas(fig)
    axes = [ax for row in fig.subplots(rows, cols, squeeze=False) for ax in row]
    for ax, (title, key, band) in zip(axes, panels, strict=False):
        xs, ys = series(train, key, "iteration")
        ax.plot(xs, ys, color="C0", lw=1.3, marker="." if len(xs) <= 60 else None)
        if band:
            lo, hi = (series(train, b, "iteration") for b in band)
            if lo[0] == hi[0] and lo[0]:
                ax.fill_between(lo[0], lo[1], hi[1], color="C0", alpha=0.2, lw=0)
        ax.set_title(kl_title if key == KL_PANEL and kl_title else title, fontsize=10, wrap=True)
        ax.set_xlabel("iteration")
        ax.set_ylabel(key)  # one series per panel: its key is its label, no legend over the data
        ax.grid(alpha=0.3)
    used = len(panels)
    if has_time:
        ax = axes[used]
        used += 1
        iters = [float(r["iteration"]) for r in train]
        bottom = [0.0] * len(iters)
        for i, key in enumerate(TIME_KEYS):
            ys = [number(r.get(key)) or 0.0 for r in train]
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
        ax.legend(**LEGEND)
    if used == 0:
        axes[0].text(0.5, 0.5, "no train records yet", ha="center", va="center", transform=axes[0].transAxes)
        used = 1
    for ax in axes[used:]:
        ax.set_visible(False)
    fig.suptitle("Training diagnostics per iteration")
    return fig


def _running_best(ys: list[float]) -> list[float]:
    out: list[float] = []
    for y in ys:
        out.append(max(y, out[-1]) if out else y)
    return out


def monitors_figure(
    train: Records,
    evals: Records,
    stops: Records,
    keys: list[str],
    rising: str = "reward",
    margin: float | None = None,
) -> Any:
    """One panel per monitor: the training reward (left axis: train thin, eval markers) and the monitor
    at each evaluation (right axis, with its best so far less ``margin``: below that line the run
    warns), so a reward that rises while the monitor falls is seen at once. A dashed line marks where
    ``[eval.monitor]`` stopped the run. One legend for all panels, under them."""
    Figure, Canvas = _matplotlib()
    cols = 2 if len(keys) > 1 else 1
    rows = -(-len(keys) // cols)
    fig = Figure(figsize=(6.5 * cols, 3.2 * rows + 1.1), dpi=100, layout="constrained")
    Canvas(fig)
    axes = [ax for row in fig.subplots(rows, cols, squeeze=False) for ax in row]
    legend: dict[str, Any] = {}
    for ax, key in zip(axes, keys, strict=False):
        xs, ys = series(train, "reward", "iteration")
        if xs:
            (legend["train reward (left axis)"],) = ax.plot(xs, ys, color="C0", lw=1.0, alpha=0.55)
        xs, ys = series(evals, rising, "iteration")
        (legend[f"eval {rising} (left axis)"],) = ax.plot(xs, ys, color="C0", lw=2.0, marker="o", ms=4)
        ax.set_xlabel("iteration")
        ax.set_ylabel("training reward", color="C0")
        twin = ax.twinx()
        xs, ys = series(evals, key, "iteration")
        (legend["the panel's monitor (right axis)"],) = twin.plot(
            xs, ys, color="C3", lw=2.0, marker="s", ms=4
        )
        if margin is not None and xs:
            floor = [b - margin for b in _running_best(ys)]
            (legend["its best so far - eval.monitor.margin"],) = twin.step(
                xs, floor, where="post", color="C3", lw=1.0, ls=":"
            )
        twin.set_ylabel(key, color="C3")
        for stop in stops:
            legend["stopped by the monitor"] = ax.axvline(stop["iteration"], color="k", ls="--", lw=1.0)
        ax.set_title(f"training reward vs {key}", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncol=3, fontsize=8)
    fig.suptitle("Reward-hacking monitors: the reward should not rise while a monitor falls")
    return fig


def save(fig: Any, path: Path) -> Path:
    fig.savefig(path)
    return path
