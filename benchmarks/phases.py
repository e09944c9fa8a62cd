"""The method matrix's two phases as cells: the learning-rate sweep, then the seeds at the chosen rate.

One invocation's settings become a ``Plan`` first, so that each phase (and the summary after them) reads
the same resolved values instead of re-deriving them from the command line.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import aggregate, matrix
from benchmarks.matrix import Cell
from benchmarks.protocol import (
    ABLATIONS,
    FULL_ABLATION,
    METHODS,
    ROOT,
    WORLD_DETAIL,
    WORLD_SETTINGS,
    WORLD_TARGET,
    WORLDS,
)

Groups = dict[str, list[Cell]]


def say(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class Plan:
    """What one invocation runs, resolved once: the recipe, the shared overrides, rates, seeds, budgets."""

    args: argparse.Namespace
    recipe: Path
    out: Path
    common: list[str]
    lrs: list[float]
    sweep_seeds: list[int]
    sweep_iterations: int
    commit: str
    detail: str | None
    metric: str
    delta: float | None

    def run(self, cell: Cell, report: Callable[[str], None] = say) -> str:
        """Run (or skip) ``cell``; with ``--from-records`` only check that it finished."""
        if getattr(self.args, "from_records", False):
            return matrix.finished(cell, self.common, self.out)
        return matrix.run_cell(cell, self.recipe, self.common, self.out, self.commit, report)


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan of ``args``: a world's settings and target, or a recipe's (no detail, target on reward)."""
    from vgrpo_platform.config.recipe import resolve_recipe

    recipe = args.recipe or WORLDS[args.world]
    name = recipe.stem if args.recipe else args.world
    metric, delta = ("reward", None) if args.recipe else WORLD_TARGET[args.world]
    common = [
        *([] if args.recipe else WORLD_SETTINGS[args.world]),
        f"eval.every={args.eval_every}",
        f"eval.max_prompts={args.eval_prompts}",
        f"log.diagnostics_every={args.diagnostics_every}",
        f"log.checkpoint_every={args.eval_every}",  # an interruption loses at most one evaluation interval
        "log.keep_last=1",
        "log.save_grids=false",
        "log.progress='plain'",
        *args.overrides,
    ]
    out = args.out or ROOT / "benchmarks" / "results" / name
    out.mkdir(parents=True, exist_ok=True)
    return Plan(
        args=args,
        recipe=recipe,
        out=out,
        common=common,
        lrs=args.lrs or [resolve_recipe(recipe, common).recipe.train.lr],
        sweep_seeds=args.sweep_seeds or args.seeds[:1],
        sweep_iterations=args.sweep_iterations or max(1, args.iterations // 3),
        commit=matrix.git_commit(ROOT),
        detail=None if args.recipe else WORLD_DETAIL[args.world],
        metric=metric,
        delta=args.target_delta if args.target_delta is not None else delta,
    )


def sweep(plan: Plan) -> tuple[dict[str, float | None], dict[str, list[dict[str, Any]]]]:
    """Each method's chosen rate (``None`` if every rate failed) and its sweep table; one rate: no sweep."""
    chosen: dict[str, float | None] = {}
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for method in plan.args.methods:
        if len(plan.lrs) == 1:
            chosen[method] = plan.lrs[0]
            continue
        scores = {lr: [_sweep_score(plan, method, lr, seed) for seed in plan.sweep_seeds] for lr in plan.lrs}
        chosen[method] = matrix.choose_rate(scores)
        sweeps[method] = [
            {"lr": lr, "scores": dict(zip(plan.sweep_seeds, s, strict=True)), "mean": sum(s) / len(s)}
            for lr, s in scores.items()
        ]
        say(f"sweep {method}: chose lr {chosen[method]}")
    return chosen, sweeps


def _sweep_score(plan: Plan, method: str, lr: float, seed: int) -> float:
    """One sweep cell, run (or skipped) and scored by the selection rule; a failed cell scores ``-inf``."""
    cell = Cell(method, lr, seed, plan.sweep_iterations, tuple(METHODS[method]))
    plan.run(cell)
    _, records = matrix.read_cell(cell, plan.out)
    return aggregate.selection_score(records) if records else -math.inf


def seeds(plan: Plan, chosen: dict[str, float | None]) -> tuple[Groups, Groups]:
    """The final cells of each method at its rate and (``--ablations``) of V-GRPO's ablations, run."""
    args = plan.args

    def cells(label: str, overrides: list[str], lr: float) -> list[Cell]:
        return [Cell(label, lr, seed, args.iterations, tuple(overrides)) for seed in args.seeds]

    finals = {m: cells(m, METHODS[m], lr) for m, lr in chosen.items() if lr is not None}
    vgrpo_lr = chosen.get("vgrpo")
    ablations: Groups = {}
    if args.ablations and vgrpo_lr is not None:
        ablations = {label: cells(label, o, vgrpo_lr) for label, o in ABLATIONS.items()}
    for group in [*finals.values(), *ablations.values()]:
        for cell in group:
            if cell.method != FULL_ABLATION:  # V-GRPO itself: the methods block's vgrpo cells
                plan.run(cell)
    if FULL_ABLATION in ablations:
        ablations[FULL_ABLATION] = finals["vgrpo"]
    return finals, ablations
