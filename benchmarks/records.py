"""A finished cell's committed record: the columns of its ``metrics.jsonl`` that the figures are made of.

A run's ``metrics.jsonl`` logs ~45 numbers per iteration; the benchmark's figures (``aggregate.py``)
read a dozen of them. Committing the whole log made the results 15 MB, so a finished cell keeps
``records.json``: the kept fields, one column per line (values as logged, ``null`` where a record
lacks the field, the per-stage seconds rounded to the millisecond: printed to 18 digits they were
most of a cell's record, and no table shows them finer than a second), and the order of the
records' kinds, from which the records are rebuilt as ``aggregate`` would have read them from the
log. The full log stays beside it, out of git.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.aggregate import DIAGNOSTICS, TIMES

RECORDS = "records.json"
LOG = "metrics.jsonl"
KINDS = {"eval": "e", "train": "t"}
# what aggregate.seed_figures, selection_score and the target read; detail/* holds every world's
# detail and target metrics
TRAIN_FIELDS = ("iteration", "gradient_steps", *TIMES, *DIAGNOSTICS)
EVAL_FIELDS = ("iteration", "reward")
EVAL_PREFIXES = ("detail/", "monitor/")  # every world's detail metrics; the eval's own monitors (diversity)
SECONDS_DIGITS = 3  # the TIMES columns are kept to the millisecond


def _kept(field: str, value: Any) -> Any:
    if field in TIMES and isinstance(value, float):
        return round(value, SECONDS_DIGITS)
    return value


def _fields(kind: str, rows: list[dict[str, Any]]) -> list[str]:
    if kind == "train":
        return [f for f in TRAIN_FIELDS if any(f in r for r in rows)]
    prefixed = sorted({k for r in rows for k in r if k.startswith(EVAL_PREFIXES)})
    return [*(f for f in EVAL_FIELDS if any(f in r for r in rows)), *prefixed]


def compact(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"kinds": "ett...e", "eval:reward": [...], ...}``: the kept fields of the eval and train records."""
    kept = [r for r in records if r.get("kind") in KINDS]
    out: dict[str, Any] = {"kinds": "".join(KINDS[r["kind"]] for r in kept)}
    for kind in KINDS:
        rows = [r for r in kept if r["kind"] == kind]
        for field in _fields(kind, rows):
            out[f"{kind}:{field}"] = [_kept(field, r.get(field)) for r in rows]
    return out


def expand(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The records back, in the log's order, each with ``kind`` and the kept fields it had."""
    columns: dict[str, dict[str, list[Any]]] = {kind: {} for kind in KINDS}
    for key, values in table.items():
        if ":" in key:
            kind, field = key.split(":", 1)
            columns[kind][field] = values
    letters = {letter: kind for kind, letter in KINDS.items()}
    seen = dict.fromkeys(KINDS, 0)
    records = []
    for letter in table["kinds"]:
        kind = letters[letter]
        i = seen[kind]
        seen[kind] += 1
        row = {f: v[i] for f, v in columns[kind].items() if v[i] is not None}
        records.append({"kind": kind, **row})
    return records


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (one JSON object a line, as the trainer writes them)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(run_dir: Path, out_dir: Path | None = None) -> None:
    """``records.json`` (in ``out_dir``, default ``run_dir``) from ``run_dir``'s ``metrics.jsonl``: one
    column per line, for readable diffs."""
    table = compact(read_log(run_dir / LOG))
    lines = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in table.items()]
    (out_dir or run_dir).joinpath(RECORDS).write_text("{\n" + ",\n".join(lines) + "\n}\n")


def load(run_dir: Path) -> list[dict[str, Any]]:
    """A cell's records: from ``records.json``, or from the full log of a cell finished before it existed."""
    path = run_dir / RECORDS
    if path.exists():
        return expand(json.loads(path.read_text()))
    return expand(compact(read_log(run_dir / LOG)))
