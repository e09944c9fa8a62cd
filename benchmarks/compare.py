"""V-GRPO against its baselines on one adapter, reward and budget: a learning-rate sweep per method, then
seeds at the chosen rate, every run a resumable cell (docs/benchmarks.md).

    python benchmarks/compare.py --world shapes --lrs 3e-4 1e-3 3e-3 --seeds 0 1 2 --iterations 150 \
        --sweep-iterations 150 --eval-every 15 --eval-prompts 189 --set eval.samples_per_prompt=4 \
        --ablations                                                       # the full matrix
    python benchmarks/compare.py --world toy --methods vgrpo flow_grpo --seeds 0 1 --lrs 1e-3 1e-2 \
        --iterations 3                                                                 # the smoke test's
    python benchmarks/compare.py --tables-from benchmarks/results/shapes/summary.json \
        --write-doc docs/benchmarks.md                                 # the docs' tables, from a summary

Every cell is a real run of its own surrogate through the same loop (``vgrpo_platform.training.loop``): same
recipe, prompts, rollout batch and evaluation; only ``[surrogate]`` (and, for the MDP baselines, the
Euler SDE grid they need), the rate and the seed differ. Cells live under ``OUT/runs`` and a second
invocation skips the finished ones (``matrix.py``). The sweep picks each method's rate with the rule
of ``aggregate.selection_score``, fixed before any run; ``OUT/summary.json`` holds each method's sweep
table, every seed's figures, their means and 95% t-intervals and the commit, ``OUT/curves.png`` the
held-out reward against network evaluations (``nfe.py``), the same x axis for every method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however this file is loaded

import aggregate  # noqa: E402
import matrix  # noqa: E402
import nfe  # noqa: E402
import render  # noqa: E402
from render import print_table  # noqa: E402, F401  (the table printer, kept under its old name)

ROOT = Path(__file__).resolve().parents[1]
WORLDS = {"shapes": ROOT / "benchmarks" / "worlds" / "shapes.toml", "toy": ROOT / "recipes" / "toy.toml"}
# per world: the batch every cell shares (the quickstart's own KL, schedule, two steps per rollout and
# weight average are left out: every method trains with the same plain AdamW at its own rate)
WORLD_SETTINGS: dict[str, list[str]] = {
    "shapes": [
        "rollout.prompts_per_iteration=4",
        "train.lr=2e-3",
        "train.lr_schedule='constant'",
        "train.gradient_steps_per_iteration=1",  # fully on-policy
        "train.ema_decay=0",  # evaluated on the raw weights
        "eval.samples_per_prompt=2",
    ],
    "toy": [],
}
WORLD_DETAIL = {"shapes": "detail/shapes/correct", "toy": None}
# the target every method races to, fixed before the runs: the base model's value plus this much
WORLD_TARGET = {"shapes": ("detail/shapes/correct", 0.10), "toy": ("reward", 0.2)}

# name -> recipe overrides (surrogate options are replaced whole, so the recipe's own never leak in)
METHODS: dict[str, list[str]] = {
    "vgrpo": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4}"],
    "elbo_naive": ["surrogate.name='elbo_naive'", "surrogate.options={n_mc=4}"],
    # Flow-GRPO as shipped: its KL form (no |dt|) and the last step left untrained (timestep_fraction 0.99)
    "flow_grpo": [
        "surrogate.name='flow_grpo'",
        "surrogate.options={kl_include_dt=false, train_last_step=false}",
    ],
    "mixgrpo": ["surrogate.name='flow_grpo'", "surrogate.options={window_size=4, window_shift_every=25}"],
    "dance_grpo": ["surrogate.name='dance_grpo'", "surrogate.options={}"],
    "flow_grpo_fast": ["surrogate.name='flow_grpo_fast'", "surrogate.options={}"],
    "diffusion_nft": ["surrogate.name='diffusion_nft'", "surrogate.options={n_timesteps=4}"],
    "awm": ["surrogate.name='awm'", "surrogate.options={n_mc=4}"],
    "awm_authors": ["surrogate.name='awm_authors'", "surrogate.options={}"],
}
ABLATIONS: dict[str, list[str]] = {
    "vgrpo (all)": METHODS["vgrpo"],
    "- shared pairs": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, pair_scope='sample'}"],
    "- stratified t": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, stratified=false}"],
    "- adaptive weight": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=4, adaptive_weighting=false}"],
    "N_MC 2": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=2}"],
    "N_MC 8": ["surrogate.name='vgrpo'", "surrogate.options={n_mc=8}"],
}
SELECTION_RULE = "best mean held-out reward over the last two evaluations, mean over sweep seeds"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", choices=sorted(WORLDS), default="shapes")
    parser.add_argument("--recipe", type=Path, help="any recipe instead of a world's (real scale)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lrs", nargs="+", type=float, help="rates to sweep; default: the world's one rate")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds of the final runs")
    parser.add_argument(
        "--sweep-seeds", nargs="+", type=int, help="seeds of the sweep; default: the first seed"
    )
    parser.add_argument("--iterations", type=int, default=150, help="budget of the final runs")
    parser.add_argument("--sweep-iterations", type=int, help="budget of the sweep; default: a third of it")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument(
        "--diagnostics-every", type=int, default=25, help="surrogate diagnostics (ELBO methods)"
    )
    parser.add_argument(
        "--target", type=float, help="absolute target of the target metric (default: base + delta)"
    )
    parser.add_argument("--target-delta", type=float, help="target = the base model's value + this")
    parser.add_argument("--ablations", action="store_true", help="also V-GRPO's ablations, at V-GRPO's rate")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/<world or recipe name>")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra recipe override")
    parser.add_argument("--tables-from", type=Path, help="print the tables of a summary.json; runs nothing")
    parser.add_argument("--write-doc", type=Path, help="replace the generated block of this Markdown file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.tables_from is not None:
        summary = json.loads(args.tables_from.read_text())
        render.print_summary(summary)
        if args.write_doc is not None:
            _write_doc(args.write_doc, summary, args.tables_from)
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    summary, out = run_matrix(args)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    render.plot_curves(summary, out / "curves.png")
    render.print_summary(summary)
    if args.write_doc is not None:
        _write_doc(args.write_doc, summary, out / "summary.json")
    print(f"\ncurves: {out / 'curves.png'}\nsummary: {out / 'summary.json'}")
    return 0


def run_matrix(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """Both phases (running, resuming or skipping each cell), then the summary of every finished cell."""
    from vgrpo_platform.config.recipe import resolve_recipe

    recipe = args.recipe or WORLDS[args.world]
    name = recipe.stem if args.recipe else args.world
    out = args.out or ROOT / "benchmarks" / "results" / name
    world = [] if args.recipe else WORLD_SETTINGS[args.world]
    detail = None if args.recipe else WORLD_DETAIL[args.world]
    metric, delta = ("reward", None) if args.recipe else WORLD_TARGET[args.world]
    delta = args.target_delta if args.target_delta is not None else delta
    common = [
        *world,
        f"eval.every={args.eval_every}",
        f"eval.max_prompts={args.eval_prompts}",
        f"log.diagnostics_every={args.diagnostics_every}",
        f"log.checkpoint_every={args.eval_every}",  # an interruption loses at most one evaluation interval
        "log.keep_last=1",
        "log.save_grids=false",
        "log.progress='plain'",
        *args.overrides,
    ]
    lrs = args.lrs or [resolve_recipe(recipe, common).recipe.train.lr]
    sweep_seeds = args.sweep_seeds or args.seeds[:1]
    sweep_iterations = args.sweep_iterations or max(1, args.iterations // 3)
    commit = matrix.git_commit(ROOT)
    out.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        print(line, flush=True)

    def cell_of(label: str, overrides: list[str], lr: float, seed: int, iterations: int) -> matrix.Cell:
        return matrix.Cell(label, lr, seed, iterations, tuple(overrides))

    chosen: dict[str, float | None] = {}
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for method in args.methods:
        if len(lrs) == 1:
            chosen[method] = lrs[0]
            continue
        scores: dict[float, list[float]] = {}
        for lr in lrs:
            for seed in sweep_seeds:
                cell = cell_of(method, METHODS[method], lr, seed, sweep_iterations)
                matrix.run_cell(cell, recipe, common, out, commit, say)
                _, records = matrix.read_cell(cell, out)
                scores.setdefault(lr, []).append(
                    aggregate.selection_score(records) if records else -float("inf")
                )
        chosen[method] = matrix.choose_rate(scores)
        sweeps[method] = [
            {"lr": lr, "scores": dict(zip(sweep_seeds, s, strict=True)), "mean": sum(s) / len(s)}
            for lr, s in scores.items()
        ]
        say(f"sweep {method}: chose lr {chosen[method]}")
    finals = {
        m: [cell_of(m, METHODS[m], lr, seed, args.iterations) for seed in args.seeds]
        for m, lr in chosen.items()
        if lr is not None
    }
    ablations: dict[str, list[matrix.Cell]] = {}
    if args.ablations and chosen.get("vgrpo") is not None:
        ablations = {
            label: [cell_of(label, o, chosen["vgrpo"], seed, args.iterations) for seed in args.seeds]
            for label, o in ABLATIONS.items()
        }
    for cells in [*finals.values(), *ablations.values()]:
        for cell in cells:
            if cell.method == "vgrpo (all)":  # the vgrpo cells themselves
                continue
            matrix.run_cell(cell, recipe, common, out, commit, say)
    if "vgrpo (all)" in ablations:
        ablations["vgrpo (all)"] = finals["vgrpo"]

    summary: dict[str, Any] = {
        "recipe": _shown(recipe),
        "world": None if args.recipe else args.world,
        "commit": commit,
        "settings": {
            "iterations": args.iterations,
            "sweep_iterations": sweep_iterations,
            "seeds": args.seeds,
            "sweep_seeds": sweep_seeds,
            "lrs": lrs,
            "eval_every": args.eval_every,
            "eval_prompts": args.eval_prompts,
            "overrides": common,
        },
        "selection_rule": SELECTION_RULE,
        "detail": detail,
        "methods": {},
        "ablations": {},
    }
    target_info = {"metric": metric, "delta": delta, "value": args.target, "rule": _rule(args.target, delta)}
    cell_commits: set[str] = set()
    for block, groups in (("methods", finals), ("ablations", ablations)):
        for label, cells in groups.items():
            per_seed, failed = [], []
            for cell in cells:
                marker, records = matrix.read_cell(cell, out)
                if marker is not None:
                    cell_commits.add(marker["commit"])
                if not records:
                    failed.append(cell.seed)
                    continue
                resolved = resolve_recipe(recipe, cell.recipe_overrides(common, out))
                target = _target(records, metric, delta, args.target)
                if target_info["value"] is None:
                    target_info["value"] = target
                figures = aggregate.seed_figures(
                    records,
                    nfe.cumulative_nfe(resolved, cell.iterations),
                    detail=detail,
                    target_metric=metric,
                    target=target,
                )
                per_seed.append({"seed": cell.seed, **figures})
            entry: dict[str, Any] = {
                "seeds": per_seed,
                "failed_seeds": failed,
                "summary": aggregate.across_seeds(per_seed) if per_seed else None,
            }
            if block == "methods":
                entry = {"chosen_lr": chosen[label], "sweep": sweeps.get(label, []), **entry}
            else:
                entry = {"lr": chosen["vgrpo"], **entry}
            summary[block][label] = entry
    for method, lr in chosen.items():
        if lr is None:  # every rate of the sweep failed
            summary["methods"][method] = {
                "chosen_lr": None,
                "sweep": sweeps.get(method, []),
                "seeds": [],
                "summary": None,
            }
    summary["target"] = target_info
    summary["cell_commits"] = sorted(cell_commits)
    return summary, out


def _write_doc(doc: Path, summary: dict[str, Any], source: Path) -> None:
    """The doc's generated block from ``summary``, linking the ``curves.png`` beside ``source``."""
    curves = source.parent / "curves.png"
    link = (
        Path(os.path.relpath(curves.resolve(), doc.resolve().parent)).as_posix() if curves.exists() else None
    )
    render.write_doc(doc, render.markdown(summary, _shown(source), link))


def _target(
    records: list[dict[str, Any]], metric: str, delta: float | None, absolute: float | None
) -> float | None:
    """The target of one run: ``absolute``, or its own base value (iteration 0) plus ``delta``."""
    if absolute is not None:
        return absolute
    first = next((r for r in records if r.get("kind") == "eval"), None)
    if delta is None or first is None or metric not in first:
        return None
    return first[metric] + delta


def _rule(absolute: float | None, delta: float | None) -> str:
    if absolute is not None:
        return "given with --target"
    return (
        f"the base model's value + {delta:g}"
        if delta is not None
        else "none: give --target or --target-delta"
    )


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (summaries move between machines)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


if __name__ == "__main__":
    sys.exit(main())
