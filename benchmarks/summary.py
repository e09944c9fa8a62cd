"""The method matrix's ``summary.json``: every finished cell's figures, per method and ablation, over seeds.

Built only from the cells' committed records (``records.py``) and the plan, so a later invocation that
runs nothing rebuilds the same summary from a fresh clone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import aggregate, matrix, nfe
from benchmarks.matrix import Cell
from benchmarks.phases import Groups, Plan
from benchmarks.protocol import ROOT, SELECTION_RULE


def summarise(
    plan: Plan,
    chosen: dict[str, float | None],
    sweeps: dict[str, list[dict[str, Any]]],
    finals: Groups,
    ablations: Groups,
) -> dict[str, Any]:
    """The summary: settings, each block's per-seed figures and their means, the target, the commits."""
    args = plan.args
    summary: dict[str, Any] = {
        "recipe": shown(plan.recipe),
        "world": None if args.recipe else args.world,
        "commit": plan.commit,
        "settings": settings(plan),
        "selection_rule": SELECTION_RULE,
        "detail": plan.detail,
        "methods": {},
        "ablations": {},
    }
    target = {
        "metric": plan.metric,
        "delta": plan.delta,
        "value": args.target,
        "rule": rule(args.target, plan.delta),
    }
    commits: set[str] = set()
    for label, cells in finals.items():
        head = {"chosen_lr": chosen[label], "sweep": sweeps.get(label, [])}
        summary["methods"][label] = {**head, **_entry(plan, cells, target, commits)}
    for label, cells in ablations.items():
        summary["ablations"][label] = {"lr": chosen["vgrpo"], **_entry(plan, cells, target, commits)}
    for method, lr in chosen.items():
        if lr is None:  # every rate of the sweep failed
            sweep = sweeps.get(method, [])
            summary["methods"][method] = {"chosen_lr": None, "sweep": sweep, "seeds": [], "summary": None}
    summary["target"] = target
    summary["cell_commits"] = sorted(commits)
    return summary


def settings(plan: Plan) -> dict[str, Any]:
    """The invocation's settings as the summary records them: enough to run the same matrix again."""
    args = plan.args
    return {
        "iterations": args.iterations,
        "sweep_iterations": plan.sweep_iterations,
        "seeds": args.seeds,
        "sweep_seeds": plan.sweep_seeds,
        "lrs": plan.lrs,
        "eval_every": args.eval_every,
        "eval_prompts": args.eval_prompts,
        "overrides": plan.common,
    }


def _entry(plan: Plan, cells: list[Cell], target: dict[str, Any], commits: set[str]) -> dict[str, Any]:
    """One method's (or ablation's) seeds: their figures, the seeds that failed, the means over seeds.
    Notes each cell's commit in ``commits``; the first run's own target becomes ``target["value"]``."""
    from vgrpo_platform.config.recipe import resolve_recipe

    per_seed, failed = [], []
    for cell in cells:
        marker, records = matrix.read_cell(cell, plan.out)
        if marker is not None:
            commits.add(marker["commit"])
        if not records:
            failed.append(cell.seed)
            continue
        resolved = resolve_recipe(plan.recipe, cell.recipe_overrides(plan.common, plan.out))
        reach = run_target(records, plan.metric, plan.delta, plan.args.target)
        if target["value"] is None:
            target["value"] = reach
        figures = aggregate.seed_figures(
            records,
            nfe.cumulative_nfe(resolved, cell.iterations),
            detail=plan.detail,
            target_metric=plan.metric,
            target=reach,
        )
        per_seed.append({"seed": cell.seed, **figures})
    means = aggregate.across_seeds(per_seed) if per_seed else None
    return {"seeds": per_seed, "failed_seeds": failed, "summary": means}


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


def rule(absolute: float | None, delta: float | None) -> str:
    """How the target was set, in words, for the summary's readers."""
    if absolute is not None:
        return "given with --target"
    return (
        f"the base model's value + {delta:g}"
        if delta is not None
        else "none: give --target or --target-delta"
    )


def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (summaries move between machines)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()
