"""From run records to the benchmark's figures: one seed's numbers, then their means and 95% intervals.

Every figure of a seed comes from its run's records (``records.py``): the held-out reward (and the world's
detail metric) at the start and the end, and the iterations, gradient steps, NFE and wall-clock
seconds at the first evaluation that reaches the target: the first at or above it whose next
evaluation is too (``first_held``; a crossing that falls back does not count). Wall-clock is the
method's own: the sum of each iteration's rollout, reward and training seconds, so evaluations and
diagnostics (the same for every method, and not its cost) stay out of it. Over seeds each figure gets
its mean and the half-width of a two-sided 95% Student-t interval, ``t_{0.975, n-1} s / sqrt(n)`` with the
sample standard deviation ``s`` (ddof 1): with 3 seeds that is 2.48 s, not the normal 1.13 s.
A to-target figure has a mean only when every seed reached the target (``reached`` counts them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy import stats

TIMES = ("time_rollout", "time_reward", "time_train")  # a method's own seconds: see method_seconds
TO_TARGET = ("iterations_to_target", "gradient_steps_to_target", "nfe_to_target", "wall_to_target")
DIAGNOSTICS = ("diag/cv", "diag/within_group_cv", "diag/grad_corr")


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None]:
    """``(mean, half-width)`` of the two-sided Student-t interval; no width for fewer than 2 values."""
    n = len(values)
    if n == 0:
        return math.nan, None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)


def selection_score(records: list[dict[str, Any]]) -> float:
    """The sweep's rule, fixed before any run: the mean held-out reward of the last two evaluations."""
    evals = [r for r in records if r.get("kind") == "eval"]
    last = [r["reward"] for r in evals[-2:]]
    if not last or not all(math.isfinite(x) for x in last):
        return -math.inf
    return sum(last) / len(last)


def method_seconds(record: dict[str, Any]) -> float:
    """One iteration's cost in seconds: rollout, reward and training; evaluations and diagnostics left out."""
    return sum(record.get(key, 0.0) for key in TIMES)


def seed_figures(
    records: list[dict[str, Any]],
    cumulative_nfe: Sequence[float],
    *,
    detail: str | None,
    target_metric: str,
    target: float | None,
) -> dict[str, Any]:
    """One run's figures; ``cumulative_nfe[i]`` is the NFE spent by the end of iteration ``i``."""
    evals = [r for r in records if r.get("kind") == "eval"]
    trains = [r for r in records if r.get("kind") == "train"]
    first, last = (evals[0], evals[-1]) if evals else ({}, {})
    figures: dict[str, Any] = {
        "reward_start": first.get("reward", math.nan),
        "reward_end": last.get("reward", math.nan),
        "detail_start": first.get(detail) if detail else None,
        "detail_end": last.get(detail) if detail else None,
        "iterations": trains[-1]["iteration"] if trains else 0,
        "gradient_steps": sum(r.get("gradient_steps", 0) for r in trains),
        "nfe": cumulative_nfe[-1] if cumulative_nfe else 0.0,
        "wall": sum(method_seconds(r) for r in trains) if trains else math.nan,
    }
    for key in TIMES:
        figures[key] = sum(r.get(key, 0.0) for r in trains)
    for key in DIAGNOSTICS:
        vals = [r[key] for r in trains if key in r and math.isfinite(r[key])]
        figures[key] = sum(vals) / len(vals) if vals else None
    reached = first_held(evals, target_metric, target) if target is not None else None
    figures["reached"] = reached is not None
    it = reached["iteration"] if reached else None
    figures["iterations_to_target"] = it
    figures["gradient_steps_to_target"] = (
        sum(r.get("gradient_steps", 0) for r in trains if r["iteration"] <= it) if reached else None
    )
    figures["nfe_to_target"] = cumulative_nfe[it] if reached else None
    figures["wall_to_target"] = (
        sum(method_seconds(r) for r in trains if r["iteration"] <= it) if reached else None
    )
    figures["curve"] = [
        {
            "iteration": r["iteration"],
            "nfe": cumulative_nfe[r["iteration"]] if r["iteration"] < len(cumulative_nfe) else None,
            "reward": r["reward"],
            **({"detail": r.get(detail)} if detail else {}),
        }
        for r in evals
    ]
    return figures


def first_held(evals: list[dict[str, Any]], metric: str, target: float) -> dict[str, Any] | None:
    """The first evaluation at or above ``target`` whose next evaluation is too: the target *held*.

    A crossing that falls back at the next evaluation is noise, not reaching, and a crossing at the
    last evaluation has nothing after it to hold, so neither counts (before 2026-12-06 the first
    crossing did). The run's cost to the target is counted up to this first evaluation of the two.
    """
    above = [r.get(metric, -math.inf) >= target for r in evals]
    return next((evals[i] for i in range(len(evals) - 1) if above[i] and above[i + 1]), None)


def run_target(
    records: list[dict[str, Any]], metric: str, delta: float | None, absolute: float | None
) -> float | None:
    """The target of one run: ``absolute``, or its own base value (iteration 0) plus ``delta``."""
    if absolute is not None:
        return absolute
    first = next((r for r in records if r.get("kind") == "eval"), None)
    if delta is None or first is None or metric not in first:
        return None
    return first[metric] + delta


def needs_extension(
    records: list[dict[str, Any]], metric: str, delta: float | None, absolute: float | None
) -> bool:
    """A finished baseline seed runs on (``--extend``) when it has a target and did not hold it."""
    target = run_target(records, metric, delta, absolute)
    if target is None:
        return False
    return first_held([r for r in records if r.get("kind") == "eval"], metric, target) is None


def across_seeds(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """``{figure: {"mean", "ci95", "n"}}`` over seeds, plus ``reached`` = seeds that hit the target."""
    out: dict[str, Any] = {"reached": sum(bool(s.get("reached")) for s in per_seed), "n": len(per_seed)}
    skip = ("curve", "reached", "seed", "extended")
    keys = [k for k in (per_seed[0] if per_seed else {}) if k not in skip]
    for key in keys:
        values = [s[key] for s in per_seed]
        if key in TO_TARGET and any(v is None for v in values):
            out[key] = {"mean": None, "ci95": None, "n": sum(v is not None for v in values)}
            continue
        finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        mean, half = t_interval(finite)
        out[key] = {"mean": mean if finite else None, "ci95": half, "n": len(finite)}
    out["curve"] = mean_curve([s["curve"] for s in per_seed])
    return out


def mean_curve(curves: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Evaluations common to every seed: the mean and 95% half-width of each value at each point."""
    if not curves:
        return []
    common = set.intersection(*({p["iteration"] for p in c} for c in curves))
    out = []
    for it in sorted(common):
        points = [next(p for p in c if p["iteration"] == it) for c in curves]
        row: dict[str, Any] = {"iteration": it, "nfe": points[0]["nfe"]}
        for key in ("reward", "detail"):
            vals = [p[key] for p in points if p.get(key) is not None]
            if vals:
                row[key], row[f"{key}_ci95"] = t_interval(vals)
        out.append(row)
    return out
