"""Write GenEval's prompt set as a JSONL prompt file whose lines carry the ``geneval`` reward's metadata.

    python -m vgrpo_rewards.geneval.make_prompts --out recipes/prompts/geneval.jsonl
    python -m vgrpo_rewards.geneval.make_prompts --seed 0 --per-task 1000 \\
        --exclude recipes/prompts/geneval.jsonl --out train.jsonl   # a training set disjoint from it

GenEval's six task templates over its 80 COCO object names (``prompts/create_prompts.py`` of its
repository): every class once as ``a photo of a <class>``; then, ``per-task`` times each, two different
classes (``a photo of a <A> and a <B>``), a count of 2 to 4 (``a photo of three <A>s``, with an exclude
clause for one more), one of ten colours (``a photo of a red <A>``), a relation (``a photo of a <A> left of
a <B>``) and two colours on two classes (``a photo of a red <A> and a blue <B>``); no colour for
``person``; duplicates dropped, first kept. The random draws are GenEval's, in its order, on numpy's
``default_rng(seed)``: seed 43 with 100 per task is the procedure GenEval's published set comes from.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .classes import COLORS, NUMBERS, OBJECTS, RELATIONS, plural, with_article

Row = dict[str, Any]


def _no_person(rng: np.random.Generator, size: int | None = None) -> Any:
    """Class indices drawn from every class but ``person`` (GenEval writes no "<colour> person")."""
    n = len(OBJECTS)
    person = OBJECTS.index("person")
    if size is None:
        return (int(rng.choice(n - 1)) + 1 + person) % n
    return (rng.choice(n - 1, size=size, replace=False) + 1 + person) % n


def _draws(rng: np.random.Generator, per_task: int, max_count: int) -> Iterator[Row]:
    n = len(OBJECTS)
    for i in rng.choice(n, size=n, replace=False):
        yield {"tag": "single_object", "include": [{"class": OBJECTS[i], "count": 1}],
               "prompt": f"a photo of {with_article(OBJECTS[i])}"}  # fmt: skip
    for _ in range(per_task):
        a, b = (OBJECTS[i] for i in rng.choice(n, size=2, replace=False))
        yield {"tag": "two_object", "include": [{"class": a, "count": 1}, {"class": b, "count": 1}],
               "prompt": f"a photo of {with_article(a)} and {with_article(b)}"}  # fmt: skip
    for _ in range(per_task):
        a = OBJECTS[rng.choice(n)]
        k = int(rng.integers(2, max_count, endpoint=True))
        yield {"tag": "counting", "include": [{"class": a, "count": k}],
               "exclude": [{"class": a, "count": k + 1}],
               "prompt": f"a photo of {NUMBERS[k]} {plural(a)}"}  # fmt: skip
    for _ in range(per_task):
        a = OBJECTS[_no_person(rng)]
        color = COLORS[rng.choice(len(COLORS))]
        yield {"tag": "colors", "include": [{"class": a, "count": 1, "color": color}],
               "prompt": f"a photo of {with_article(color)} {a}"}  # fmt: skip
    for _ in range(per_task):
        a, b = (OBJECTS[i] for i in rng.choice(n, size=2, replace=False))
        rel = RELATIONS[rng.choice(len(RELATIONS))]
        yield {"tag": "position",
               "include": [{"class": b, "count": 1}, {"class": a, "count": 1, "position": [rel, 0]}],
               "prompt": f"a photo of {with_article(a)} {rel} {with_article(b)}"}  # fmt: skip
    for _ in range(per_task):
        a, b = (OBJECTS[i] for i in _no_person(rng, 2))
        ca, cb = (COLORS[i] for i in rng.choice(len(COLORS), size=2, replace=False))
        yield {"tag": "color_attr",
               "include": [{"class": a, "count": 1, "color": ca}, {"class": b, "count": 1, "color": cb}],
               "prompt": f"a photo of {with_article(ca)} {a} and {with_article(cb)} {b}"}  # fmt: skip


def generate(
    seed: int = 43, per_task: int = 100, max_count: int = 4, exclude: set[str] | None = None
) -> list[Row]:
    """GenEval's prompt rows (``prompt`` first), duplicates and prompts in ``exclude`` dropped."""
    rows, seen = [], set(exclude or ())
    for row in _draws(np.random.default_rng(seed), per_task, max_count):
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append({"prompt": row["prompt"], **{k: v for k, v in row.items() if k != "prompt"}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--seed", type=int, default=43, help="numpy seed (GenEval's set: 43)")
    parser.add_argument("--per-task", type=int, default=100, help="prompts drawn per task but single_object")
    parser.add_argument("--max-count", type=int, default=4, help="largest count of the counting task (<= 10)")
    parser.add_argument(
        "--exclude", type=Path, action="append", default=[], help="drop prompts of this JSONL"
    )
    args = parser.parse_args(argv)
    if not 2 <= args.max_count < len(NUMBERS) - 1:
        parser.error(f"--max-count must be 2 to {len(NUMBERS) - 2}")
    exclude = {
        json.loads(line)["prompt"] for path in args.exclude for line in path.read_text().splitlines() if line
    }
    rows = generate(args.seed, args.per_task, args.max_count, exclude)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
