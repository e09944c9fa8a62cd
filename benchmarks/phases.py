"""The method matrix's phases as cells: the learning-rate sweep, the seeds at the chosen rate, and
(``--extend``) the baselines' seeds that did not hold the target, run on to a larger budget.

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
    EXTEND_FACTOR,
    FULL_ABLATION,
    METHODS,
    RATE_GRIDS,
    ROOT,
    WORLD_DETAIL,
    WORLD_EVAL_FILES,
    WORLD_METHODS,
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
    lrs: list[float]  # every rate any method sweeps, ascending
    sweep_seeds: list[int]
    sweep_iterations: int
    commit: str
    detail: str | None
    metric: str
    delta: float | None
    methods: dict[str, list[str]]  # name -> recipe overrides, the world's (protocol.WORLD_METHODS)
    grids: dict[str, list[float]]  # name -> the rates its sweep tries
    sweep_eval: tuple[str, ...] = ()  # the sweep's cells' prompt override: the validation file
    seeds_eval: tuple[str, ...] = ()  # the seeds phase's: the reported file
    sweep_root: str = "runs"  # where the sweep's cells live under ``out``

    def sweep_cell(self, method: str, lr: float, seed: int) -> Cell:
        """A sweep cell: the method's overrides, then the validation prompts where the world has them."""
        overrides = (*self.methods[method], *self.sweep_eval)
        return Cell(method, lr, seed, self.sweep_iterations, overrides, self.sweep_root)

    def seeds_cell(self, label: str, overrides: list[str], lr: float, seed: int, iterations: int) -> Cell:
        """A seeds-phase cell (or its extension): the overrides, then the reported prompts."""
        return Cell(label, lr, seed, iterations, (*overrides, *self.seeds_eval))

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
    methods = METHODS if args.recipe else WORLD_METHODS[args.world]
    unknown = [m for m in args.methods or [] if m not in methods]
    if unknown:
        raise SystemExit(
            f"--methods {' '.join(unknown)}: not in this world's protocol; choose from {' '.join(methods)}"
        )
    chosen = {m: methods[m] for m in args.methods or methods}
    files = None if args.recipe else WORLD_EVAL_FILES.get(args.world)
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
    world_grids = {} if args.recipe or args.lrs else RATE_GRIDS.get(args.world, {})
    default = args.lrs or [resolve_recipe(recipe, common).recipe.train.lr]
    grids = {m: list(world_grids.get(m, default)) for m in chosen}
    return Plan(
        args=args,
        recipe=recipe,
        out=out,
        common=common,
        lrs=sorted({lr for grid in grids.values() for lr in grid}),
        sweep_seeds=args.sweep_seeds or args.seeds[:1],
        sweep_iterations=args.sweep_iterations or max(1, args.iterations // 3),
        commit=matrix.git_commit(ROOT),
        detail=None if args.recipe else WORLD_DETAIL[args.world],
        metric=metric,
        delta=args.target_delta if args.target_delta is not None else delta,
        methods=chosen,
        grids=grids,
        sweep_eval=(f"prompts.eval_file={files[0]!r}",) if files else (),
        seeds_eval=(f"prompts.eval_file={files[1]!r}",) if files else (),
        sweep_root="sweep" if files else "runs",
    )


def sweep(plan: Plan) -> tuple[dict[str, float | None], dict[str, list[dict[str, Any]]]]:
    """Each method's chosen rate (``None`` if every rate failed) and its sweep table; one rate: no sweep."""
    chosen: dict[str, float | None] = {}
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for method, grid in plan.grids.items():
        if len(grid) == 1:
            chosen[method] = grid[0]
            continue
        scores = {lr: [_sweep_score(plan, method, lr, seed) for seed in plan.sweep_seeds] for lr in grid}
        chosen[method] = matrix.choose_rate(scores)
        sweeps[method] = [
            {"lr": lr, "scores": dict(zip(plan.sweep_seeds, s, strict=True)), "mean": sum(s) / len(s)}
            for lr, s in scores.items()
        ]
        say(f"sweep {method}: chose lr {chosen[method]}")
    return chosen, sweeps


def _sweep_score(plan: Plan, method: str, lr: float, seed: int) -> float:
    """One sweep cell, run (or skipped) and scored by the selection rule; a failed cell scores ``-inf``."""
    cell = plan.sweep_cell(method, lr, seed)
    plan.run(cell)
    _, records = matrix.read_cell(cell, plan.out)
    return aggregate.selection_score(records) if records else -math.inf


def seeds(plan: Plan, chosen: dict[str, float | None]) -> tuple[Groups, Groups]:
    """The final cells of each method at its rate and (``--ablations``) of V-GRPO's ablations, run."""
    args = plan.args

    def cells(label: str, overrides: list[str], lr: float) -> list[Cell]:
        return [plan.seeds_cell(label, overrides, lr, seed, args.iterations) for seed in args.seeds]

    finals = {m: cells(m, plan.methods[m], lr) for m, lr in chosen.items() if lr is not None}
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


def extension_budget(plan: Plan) -> int:
    """The budget an extended seed runs to: ``EXTEND_FACTOR`` times the seeds phase's."""
    return EXTEND_FACTOR * plan.args.iterations


def to_extend(plan: Plan, finals: Groups) -> dict[str, dict[int, Cell]]:
    """``{method: {seed: the seed's final cell}}`` of the baselines' seeds that did not hold the target
    (``aggregate.needs_extension``): every method but V-GRPO, whose budget is what the factor is of."""
    out: dict[str, dict[int, Cell]] = {}
    for method, group in finals.items():
        if method == "vgrpo":
            continue
        for cell in group:
            _, records = matrix.read_cell(cell, plan.out)
            if records and aggregate.needs_extension(records, plan.metric, plan.delta, plan.args.target):
                out.setdefault(method, {})[cell.seed] = cell
    return out


def extend(plan: Plan, finals: Groups) -> dict[str, dict[int, Cell]]:
    """The third phase (``--extend``): each seed of ``to_extend`` runs on, from its last checkpoint, to
    ``extension_budget`` in a cell of its own; ``{method: {seed: extended cell}}``."""
    if not getattr(plan.args, "extend", False):
        return {}
    budget = extension_budget(plan)
    extended: dict[str, dict[int, Cell]] = {}
    for method, seeds in to_extend(plan, finals).items():
        for seed, base in seeds.items():
            cell = Cell(base.method, base.lr, base.seed, budget, base.overrides, base.root)
            if not getattr(plan.args, "from_records", False) and matrix.start_from(base, cell, plan.out):
                say(f"cell {method} lr={base.lr:g} seed={seed}: extending from {base.iterations} to {budget}")
            plan.run(cell)
            extended.setdefault(method, {})[seed] = cell
    return extended
