"""Does the quickstart keep its samples diverse? The shipped recipe beside the same recipe with the group
``diversity`` reward and with the data anchor, from committed records (the runs are
``benchmarks/quickstart_seeds.py``'s variants).

Why: RL toward one reward collapses a prompt's samples onto one layout (the quickstart's held-out
diversity falls by about a third) and can lose prompts it once drew right while the mean rises. The
question is whether a diversity bonus or a flow-matching loss on data keeps diversity at a small cost in
accuracy. The screen, the finalists and the goal are fixed in ``DIVERSITY_RULE`` before the runs.

    python -m benchmarks.quickstart_seeds run --variant screen_diversity_0.1 --threads 1   # ... each run
    python -m benchmarks.diversity                     # the screen, the finalists, the comparison
    python -m benchmarks.diversity --write-doc         # ... written into docs/quickstart.md
    python -m benchmarks.diversity --picture 1         # seed 1's samples side by side (docs/img/)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks import quickstart_seeds as qs

DIVERSITY_RULE = """Written 2026-12-07, before any of these runs. **Screen**: run seed 1 for 100
iterations with the `diversity` reward at weight 0.1 and 0.3 (beside `shapes` at 1) and with the data
anchor at weight 0.1 and 0.5 (`vgrpo shapes-anchor-data`'s 256 rendered scenes). In each family the
finalist is the weight whose held-out diversity at iteration 100 is at least 90% of the base model's, the
higher held-out `correct` gain among those; if neither keeps it, the one with the higher diversity.
**Finalists** run seeds 0-4 for the shipped 200 iterations; the shipped recipe's own seeds are the
comparison. **Goal** (issue 38): over seeds 0-4, mean held-out `correct` gain at the last evaluation at
least +18 points, every seed's last evaluation within 2 points of its best, and mean held-out diversity at
the last evaluation at least 90% of the base model's."""

SCREENS = {
    "diversity": ("screen_diversity_0.1", "screen_diversity_0.3"),
    "anchor": ("screen_anchor_0.1", "screen_anchor_0.5"),
}
KEEP = 0.9  # diversity kept: at least this fraction of the base model's
GOAL_GAIN = 18.0
GOAL_DROP = 2.0
BEGIN = "<!-- quickstart-diversity:begin (python -m benchmarks.diversity --write-doc) -->"
END = "<!-- quickstart-diversity:end -->"


@dataclass(frozen=True)
class SeedResult:
    """One finished seed of a variant: gains in points, diversity at the last evaluation, falls."""

    seed: int
    last: float
    best: float
    diversity: float | None  # held-out diversity at the last evaluation
    fell: int | None  # evaluated prompts with fewer correct samples than the base model had


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def base_record() -> dict[str, Any]:
    record = _load(qs.BASE_PER_PROMPT)
    if record is None:
        raise SystemExit(f"{qs.BASE_PER_PROMPT} missing: run `python -m benchmarks.quickstart_seeds base`")
    return record


def prompts_fell(base: dict[str, Any], after: dict[str, Any]) -> int:
    """How many evaluated prompts have fewer correct samples after training than before."""
    if len(base["correct"]) != len(after["correct"]):
        raise ValueError("per-prompt records of different prompt sets")
    return sum(a < b for a, b in zip(after["correct"], base["correct"], strict=True))


def seed_results(variant: qs.Variant, base: dict[str, Any]) -> list[SeedResult]:
    """Each finished seed of ``variant`` (seeds without a record are left out)."""
    rows = {r["seed"]: r for r in qs.seed_rows(variant)}
    out = []
    for seed, row in sorted(rows.items()):
        after = _load(qs.cell_dir(variant.name, seed) / qs.PER_PROMPT)
        out.append(
            SeedResult(
                seed=seed,
                last=row["last"],
                best=row["best"],
                diversity=mean(after["diversity"]) if after else None,
                fell=prompts_fell(base, after) if after else None,
            )
        )
    return out


def keeps_diversity(result: SeedResult, base: dict[str, Any]) -> bool:
    return result.diversity is not None and result.diversity >= KEEP * mean(base["diversity"])


def finalist(family: str, base: dict[str, Any]) -> str | None:
    """The rule's finalist of a family, or None while its screen is unfinished."""
    screened = {}
    for name in SCREENS[family]:
        results = seed_results(qs.VARIANTS[name], base)
        if not results or results[0].diversity is None:
            return None
        screened[name] = results[0]
    kept = [n for n, r in screened.items() if keeps_diversity(r, base)]
    if kept:
        pick = max(kept, key=lambda n: screened[n].last)
    else:
        pick = max(screened, key=lambda n: screened[n].diversity or 0.0)
    return pick.removeprefix("screen_")


def _span(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(mean(values), fmt)} [{format(min(values), fmt)}, {format(max(values), fmt)}]"


def _partial(values: list[float], fmt: str, of: int) -> str:
    """``_span``, saying over how many seeds when some seeds lack the per-prompt record."""
    text = _span(values, fmt)
    return text if not values or len(values) == of else f"{text} ({len(values)} seeds)"


def row(name: str, results: list[SeedResult], base: dict[str, Any], seeds: tuple[int, ...]) -> str:
    chosen = [r for r in results if r.seed in seeds]
    if not chosen:
        return f"| `{name}` | not run yet | - | - | - | - |"
    base_div = mean(base["diversity"])
    kept = [100 * r.diversity / base_div for r in chosen if r.diversity is not None]
    fell = [float(r.fell) for r in chosen if r.fell is not None]
    drop = min(r.last - r.best for r in chosen)
    return (
        f"| `{name}` | {', '.join(str(r.seed) for r in chosen)} | {_span([r.last for r in chosen], '+.1f')} "
        f"| {drop:+.1f} | {_partial(kept, '.1f', len(chosen))} | {_partial(fell, '.1f', len(chosen))} |"
    )


def meets_goal(results: list[SeedResult], base: dict[str, Any]) -> bool | None:
    """The rule's goal over the final seeds; None while a seed is missing."""
    misses = goal_misses(results, base)
    return None if misses is None else not misses


def goal_misses(results: list[SeedResult], base: dict[str, Any]) -> list[str] | None:
    """Which parts of the goal the final seeds miss, each with its figure ([] = met); None while a seed
    is missing."""
    chosen = [r for r in results if r.seed in qs.FINAL_SEEDS]
    if len(chosen) < len(qs.FINAL_SEEDS) or any(r.diversity is None for r in chosen):
        return None
    misses = []
    gain = mean(r.last for r in chosen)
    if gain < GOAL_GAIN:
        misses.append(f"mean gain {gain:+.2f} < +{GOAL_GAIN:g}")
    fell_back = [r for r in chosen if r.last < r.best - GOAL_DROP]
    if fell_back:
        named = ", ".join(f"seed {r.seed} {r.last - r.best:+.2f}" for r in fell_back)  # -2.04 is not -2.0
        misses.append(f"ended more than {GOAL_DROP:g} points below its best: {named}")
    kept = mean(r.diversity or 0.0 for r in chosen) / mean(base["diversity"])
    if kept < KEEP:
        misses.append(f"diversity {100 * kept:.1f}% of the base model's < {100 * KEEP:.0f}%")
    return misses


HEAD = (
    "| setting | seeds | held-out `correct` gain at the last evaluation (points), mean [range] "
    "| worst last - best | held-out diversity at the last evaluation, % of the base model's "
    "| prompts whose correct count fell (of 99) |\n|---|---|---|---|---|---|"
)


SCREEN_ITERATION = 100


def shipped_at(seed: int, iteration: int) -> tuple[float, float] | None:
    """The shipped recipe's gain (points) and diversity (% of iteration 0's) at ``iteration`` of ``seed``,
    from its records' evaluation rows; None without a record or without the eval monitors."""
    path = qs.cell_dir("shipped", seed)
    if not (path / qs.records.RECORDS).exists():
        return None
    rows = {r["iteration"]: r for r in qs.records.load(path) if r["kind"] == "eval"}
    if 0 not in rows or iteration not in rows or rows[iteration].get(qs.DIVERSITY) is None:
        return None
    first, then = rows[0], rows[iteration]
    gain = 100 * (then[qs.METRIC] - first[qs.METRIC])
    return gain, 100 * then[qs.DIVERSITY] / first[qs.DIVERSITY]


def report() -> str:
    """The screen, the finalists and the comparison, as markdown, from the committed records."""
    base = base_record()
    lines = [f"Base model: held-out diversity {mean(base['diversity']):.4f} (mean over the 99 prompts).", ""]
    lines += ["Screen (seed 1, 100 iterations):", "", HEAD]
    for names in SCREENS.values():
        for name in names:
            lines.append(row(name, seed_results(qs.VARIANTS[name], base), base, (1,)))
    reference = shipped_at(1, SCREEN_ITERATION)
    if reference is not None:
        gain, kept = reference
        lines += [
            "",
            f"For reference, the shipped recipe's seed 1 at iteration {SCREEN_ITERATION} (its records): gain "
            f"{gain:+.1f}, held-out diversity {kept:.0f}% of the base model's.",
        ]
    lines += ["", "Finalists and the shipped recipe (200 iterations):", "", HEAD]
    shipped = seed_results(qs.VARIANTS["shipped"], base)
    lines.append(row("shipped", shipped, base, qs.FINAL_SEEDS))
    lines.append(row("shipped", shipped, base, tuple(range(10))).replace("`shipped`", "`shipped`, all seeds"))
    verdicts = []
    for family in SCREENS:
        pick = finalist(family, base)
        if pick is None:
            verdicts.append(f"{family}: screen unfinished.")
            continue
        results = seed_results(qs.VARIANTS[pick], base)
        lines.append(row(pick, results, base, qs.FINAL_SEEDS))
        misses = goal_misses(results, base)
        if misses is None:
            state = "seeds 0-4 not all run yet"
        else:
            state = f"misses the goal ({'; '.join(misses)})" if misses else "meets the goal"
        verdicts.append(f"{family}: finalist `{pick}`, {state}.")
    return "\n".join(lines) + "\n\n" + " ".join(verdicts) + "\n"


PICTURE = qs.ROOT / "docs" / "img" / "quickstart_diversity.png"
PICTURE_PROMPTS = 8


def picture(seed: int, scratch: Path = qs.SCRATCH, out: Path = PICTURE) -> Path:
    """The base model, the shipped recipe and each family's finalist on the same held-out prompts and
    noise, side by side: the last evaluation grid of each run of ``seed`` (run folders under ``scratch``,
    kept by ``quickstart_seeds run``), the base model's from the shipped run's iteration 0."""
    from PIL import Image

    from vgrpo_platform.training.observe.grids import save_side_by_side

    base = base_record()
    names = ["shipped", *(pick for family in SCREENS if (pick := finalist(family, base)) is not None)]
    runs = [scratch / name / f"seed{seed}" / "samples" for name in names]
    lasts = [max(run.glob("eval_*.png"), default=None) for run in runs]
    missing = [str(run) for run, last in zip(runs, lasts, strict=True) if last is None]
    if missing:
        raise SystemExit(f"no evaluation grids in {', '.join(missing)}: run those seeds first")
    finals = [last for last in lasts if last is not None]
    grids = [runs[0] / "eval_000000.png", *finals]
    at = [int(last.stem.split("_")[1]) for last in finals]  # eval_000200 -> 200
    labels = ["base model", *(f"{name} @{i}" for name, i in zip(names, at, strict=True))]
    written = save_side_by_side(grids, out, keep=PICTURE_PROMPTS, labels=labels)
    if written is None:
        raise SystemExit(f"the grids of seed {seed} do not show the same prompts: {grids}")
    Image.open(written).quantize(colors=64).save(written, optimize=True)  # flat colours: a small file
    return written


def write_doc(text: str, path: Path = qs.ROOT / "docs" / "quickstart.md") -> None:
    qs.replace_block(path, BEGIN, END, text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-doc", action="store_true", help="write it into docs/quickstart.md")
    parser.add_argument("--picture", type=int, metavar="SEED", help="draw SEED's runs side by side")
    args = parser.parse_args(argv)
    if args.picture is not None:
        print(f"wrote {picture(args.picture)}")
        return
    text = report()
    print(text)
    if args.write_doc:
        write_doc(text)


if __name__ == "__main__":
    main()
