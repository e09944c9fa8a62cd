"""The method matrix's ``summary.json``: every finished cell's figures, per method and ablation, over seeds.

Built only from the cells' committed records (``records.py``) and the plan, so a later invocation that
runs nothing rebuilds the same summary from a fresh clone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import aggregate, matrix, nfe
from benchmarks.matrix import Cell
from benchmarks.phases import Groups, Plan, extension_budget
from benchmarks.protocol import ROOT, SELECTION_RULE

# what an extended seed's run adds to its figures: how far it went and its cost to the target there
EXTENDED = ("reached", *aggregate.TO_TARGET, "iterations", "gradient_steps", "nfe", "wall")


def summarise(
    plan: Plan,
    chosen: dict[str, float | None],
    sweeps: dict[str, list[dict[str, Any]]],
    finals: Groups,
    ablations: Groups,
    extended: dict[str, dict[int, Cell]] | None = None,
) -> dict[str, Any]:
    """The summary: settings, each block's per-seed figures and their means, the target, the commits."""
    args = plan.args
    rule_text = SELECTION_RULE
    if plan.sweep_eval:
        rule_text = rule_text.replace("held-out reward", "validation-prompt reward")
    summary: dict[str, Any] = {
        "recipe": shown(plan.recipe),
        "world": None if args.recipe else args.world,
        "commit": plan.commit,
        "settings": settings(plan),
        "selection_rule": rule_text,
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
        more = (extended or {}).get(label, {})
        summary["methods"][label] = {**head, **_entry(plan, cells, target, commits, more)}
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
        **({"grids": plan.grids} if any(g != plan.lrs for g in plan.grids.values()) else {}),
        **(
            {"sweep_eval": list(plan.sweep_eval), "seeds_eval": list(plan.seeds_eval)}
            if plan.sweep_eval
            else {}
        ),
        **({"extend_to": extension_budget(plan)} if getattr(args, "extend", False) else {}),
    }


def _entry(
    plan: Plan,
    cells: list[Cell],
    target: dict[str, Any],
    commits: set[str],
    extended: dict[int, Cell] | None = None,
) -> dict[str, Any]:
    """One method's (or ablation's) seeds: their figures, the seeds that failed, the means over seeds.
    Notes each cell's commit in ``commits``; the first run's own target becomes ``target["value"]``.
    A seed with a finished cell in ``extended`` (``--extend``) also gets ``extended``: the ``EXTENDED``
    figures of that longer run, against the same target; its other figures stay the budget's."""
    per_seed, failed = [], []
    for cell in cells:
        marker, records = matrix.read_cell(cell, plan.out)
        if marker is not None:
            commits.add(marker["commit"])
        if not records:
            failed.append(cell.seed)
            continue
        reach = aggregate.run_target(records, plan.metric, plan.delta, plan.args.target)
        if target["value"] is None:
            target["value"] = reach
        figures = _figures(plan, cell, records, reach)
        longer = (extended or {}).get(cell.seed)
        more = matrix.read_cell(longer, plan.out) if longer is not None else (None, [])
        if more[0] is not None:
            commits.add(more[0]["commit"])
        if more[1] and longer is not None:
            ext = _figures(plan, longer, more[1], reach)
            figures["extended"] = {"budget": longer.iterations, **{k: ext[k] for k in EXTENDED}}
        per_seed.append({"seed": cell.seed, **figures})
    means = aggregate.across_seeds(per_seed) if per_seed else None
    return {"seeds": per_seed, "failed_seeds": failed, "summary": means}


def _figures(plan: Plan, cell: Cell, records: list[dict[str, Any]], reach: float | None) -> dict[str, Any]:
    from vgrpo_platform.config.recipe import resolve_recipe

    resolved = resolve_recipe(plan.recipe, cell.recipe_overrides(plan.common, plan.out))
    return aggregate.seed_figures(
        records,
        nfe.cumulative_nfe(resolved, cell.iterations),
        detail=plan.detail,
        target_metric=plan.metric,
        target=reach,
    )


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
