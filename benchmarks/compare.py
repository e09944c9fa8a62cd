"""V-GRPO against its baselines on one adapter, reward and budget: a learning-rate sweep per method, then
seeds at the chosen rate, every run a resumable cell (docs/benchmarks.md).

    python -m benchmarks.compare --world shapes --lrs 3e-4 1e-3 3e-3 --seeds 0 1 2 --iterations 150 \
        --sweep-iterations 150 --eval-every 15 --eval-prompts 189 --set eval.samples_per_prompt=4 \
        --ablations                                       # the first protocol's matrix (committed)
    python -m benchmarks.compare --world shapes_v2 --seeds 0 1 2 --iterations 150 \
        --sweep-iterations 150 --eval-every 15 --eval-prompts 189 --set eval.samples_per_prompt=4 \
        --ablations --extend                              # issue 37's: validation split, per-method grids
    python -m benchmarks.compare --world video --seeds 0 1 2 --iterations 150 --sweep-iterations 150 \
        --eval-every 15 --eval-prompts 264 --extend       # issue 40's worlds (--world audio: 54 prompts)
    python -m benchmarks.compare --world toy --methods vgrpo flow_grpo --seeds 0 1 --lrs 1e-3 1e-2 \
        --iterations 3                                                                 # the smoke test's
    python -m benchmarks.compare --tables-from benchmarks/results/shapes/summary.json \
        --write-doc docs/benchmarks.md                                 # the docs' tables, from a summary

The full matrix's command with ``--from-records`` rebuilds its ``summary.json`` from the committed
cells alone (after a change to how figures are read): it trains nothing, and stops naming a cell that
has not finished.

Every cell is a real run of its own surrogate through the same loop (``vgrpo_platform.training.loop``):
same recipe, prompts, rollout batch and evaluation; only ``[surrogate]`` (and, for the MDP baselines, the
Euler SDE grid they need), the rate and the seed differ; what is compared is fixed in ``protocol.py``.
Cells live under ``OUT/runs`` (a world with a validation split: its sweep under ``OUT/sweep``) and a
second invocation skips the finished ones (``matrix.py``); the phases are ``phases.py``. The sweep
picks each method's rate with the rule of ``aggregate.selection_score``, fixed before any run, on the
world's validation prompts where it has them (``protocol.WORLD_EVAL_FILES``); ``--extend`` runs the
baselines' seeds that did not hold the target on to ``EXTEND_FACTOR`` times the budget;
``OUT/summary.json`` (``summary.py``) holds each method's sweep table, every seed's figures, their
means and 95% t-intervals and the commit,
``OUT/curves.png`` the held-out reward against network evaluations (``nfe.py``), the same x axis for
every method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks import phases, render
from benchmarks.protocol import EXTEND_FACTOR, WORLD_METHODS, WORLDS
from benchmarks.summary import shown, summarise


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", choices=sorted(WORLDS), default="shapes")
    parser.add_argument("--recipe", type=Path, help="any recipe instead of a world's (real scale)")
    every = list(dict.fromkeys(m for methods in WORLD_METHODS.values() for m in methods))
    parser.add_argument(
        "--methods", nargs="+", choices=every, help="default: every method of the world's protocol"
    )
    parser.add_argument(
        "--lrs",
        nargs="+",
        type=float,
        help="rates every method sweeps; default: each method's grid (protocol.RATE_GRIDS), else the "
        "world's one rate",
    )
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
    parser.add_argument(
        "--extend",
        action="store_true",
        help=f"a third phase: each baseline seed that did not hold the target runs on, from its last "
        f"checkpoint, to {EXTEND_FACTOR}x --iterations (its own cell), so its cost to the target is measured",
    )
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/<world or recipe name>")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra recipe override")
    parser.add_argument(
        "--from-records",
        action="store_true",
        help="rebuild summary.json (and the tables) from the finished cells' records; runs nothing and "
        "stops at the first cell that has not finished",
    )
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
    """The phases (running, resuming or skipping each cell), then the summary of every finished cell."""
    plan = phases.make_plan(args)
    chosen, sweeps = phases.sweep(plan)
    finals, ablations = phases.seeds(plan, chosen)
    extended = phases.extend(plan, finals)
    return summarise(plan, chosen, sweeps, finals, ablations, extended), plan.out


def _write_doc(doc: Path, summary: dict[str, Any], source: Path) -> None:
    """The doc's generated block from ``summary``, linking the ``curves.png`` beside ``source``."""
    curves = source.parent / "curves.png"
    link = (
        Path(os.path.relpath(curves.resolve(), doc.resolve().parent)).as_posix() if curves.exists() else None
    )
    render.write_doc(doc, render.markdown(summary, shown(source), link))


if __name__ == "__main__":
    sys.exit(main())
