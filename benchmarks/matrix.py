"""The benchmark as resumable cells: one run directory per (method, learning rate, budget, seed).

A cell runs once. Its directory ``OUT/runs/<method>/lr<lr>/it<iterations>/seed<seed>`` holds the run
and, when it finished, ``cell.json`` (the settings it ran with, the commit, ``done`` or ``failed``) and,
when done, ``records.json`` (``records.py``: the figures' columns of its log; what git keeps of a run).
A later invocation skips every cell with a matching ``cell.json``, resumes a cell that has checkpoints
but no marker through the trainer's ``--resume`` path (``Trainer(resolved, resume=True)``), and starts
the others. A run that stops on a training fault (for example a non-finite loss at a too high rate)
is marked ``failed`` and scores ``-inf`` in the sweep; Ctrl-C leaves it resumable.

Two phases, and a third on request. The sweep runs every learning rate on the sweep seeds with the
short budget and picks each method's rate by ``aggregate.selection_score`` (mean held-out reward of
the last two evaluations), averaged over the sweep seeds; ties go to the smaller rate. The seeds phase
runs the chosen rate on every seed with the full budget. Cells with the same method, rate, budget and seed are
the same directory, so a sweep cell is reused when the two budgets agree (in a world with a validation
split the sweep's cells evaluate other prompts and live under ``OUT/sweep``, so nothing is shared). The
extension (``--extend``) runs a baseline's seed that did not hold the target on to a larger budget, in a
cell of its own that starts from the seed's last checkpoint (``start_from``).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import records

MARKER = "cell.json"


@dataclass(frozen=True)
class Cell:
    """One run of the matrix; ``overrides`` are the method's own recipe overrides."""

    method: str
    lr: float
    seed: int
    iterations: int
    overrides: tuple[str, ...]
    root: str = "runs"  # the folder under OUT: a world with a validation split keeps its sweep apart

    def directory(self, out: Path) -> Path:
        where = out / self.root / slug(self.method)
        return where / f"lr{self.lr:g}" / f"it{self.iterations}" / f"seed{self.seed}"

    def settings(self, common: Sequence[str]) -> list[str]:
        """The recipe overrides that define the run: the shared settings, then the cell's own."""
        return [
            *common,
            f"train.iterations={self.iterations}",
            f"train.lr={self.lr!r}",
            f"run.seed={self.seed}",
            *self.overrides,
        ]

    def recipe_overrides(self, common: Sequence[str], out: Path) -> list[str]:
        """``settings`` plus where the run lives."""
        run_dir = self.directory(out)
        where = [f"run.output_dir={run_dir.parent.as_posix()!r}", f"run.name={run_dir.name!r}"]
        return [*where, *self.settings(common)]


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_")


def git_commit(root: Path) -> str:
    """``HEAD``'s hash, with ``-dirty`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / MARKER
    return json.loads(path.read_text()) if path.exists() else None


def status(cell: Cell, settings: list[str], out: Path) -> str:
    """``done``, ``failed`` (finished: skipped), ``resume`` (checkpoints, no marker) or ``new``."""
    from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

    run_dir = cell.directory(out)
    marker = read_marker(run_dir)
    if marker is not None:
        if marker["settings"] != settings:
            raise SystemExit(
                f"{run_dir} finished with other settings than this invocation's "
                f"({sorted(set(marker['settings']) ^ set(settings))}); choose another --out"
            )
        return marker["status"]
    return "resume" if list_checkpoints(run_dir) else "new"


def finished(cell: Cell, common: Sequence[str], out: Path) -> str:
    """``done`` or ``failed`` of a finished cell; any other cell stops a rebuild that must not train."""
    state = status(cell, cell.settings(common), out)
    if state not in ("done", "failed"):
        raise SystemExit(
            f"{cell.directory(out)} has not finished ({state}); --from-records runs nothing: "
            "run the matrix without it first"
        )
    return state


def run_cell(
    cell: Cell, recipe: Path, common: Sequence[str], out: Path, commit: str, say: Callable[[str], None]
) -> str:
    """Bring one cell to an end: skip it, resume it or run it; returns its final status."""
    from vgrpo_platform.config.recipe import resolve_recipe
    from vgrpo_platform.errors import VgrpoError
    from vgrpo_platform.training.loop import Trainer

    settings = cell.settings(common)
    state = status(cell, settings, out)
    label = f"{cell.method} lr={cell.lr:g} seed={cell.seed} ({cell.iterations} it)"
    if state in ("done", "failed"):
        say(f"cell {label}: {state}")
        return state
    say(f"cell {label}: {'resuming' if state == 'resume' else 'running'}")
    run_dir = cell.directory(out)
    start = time.perf_counter()
    try:
        Trainer(resolve_recipe(recipe, cell.recipe_overrides(common, out)), resume=state == "resume").run()
        records.write(run_dir)  # before the marker: a done cell always has its records
        result, error = "done", None
    except VgrpoError as fault:  # a training fault (non-finite loss, ...): this rate fails the cell
        result, error = "failed", str(fault)
        say(f"cell {label}: failed ({fault})")
    marker = {
        "status": result,
        "cell": asdict(cell),
        "settings": settings,
        "commit": commit,
        "seconds_this_invocation": time.perf_counter() - start,
        "error": error,
    }
    (run_dir / MARKER).write_text(json.dumps(marker, indent=1))
    return result


def start_from(base: Cell, cell: Cell, out: Path) -> bool:
    """Let ``cell`` (``base`` with a larger budget) go on from ``base``'s run instead of from scratch: copy
    ``base``'s run directory (checkpoints, log, recipe; not its marker or records) into ``cell``'s, so
    the trainer's ``--resume`` continues from its last checkpoint with ``train.iterations`` raised (a
    change ``recipe_changes.SAFE_ON_RESUME`` allows under a constant rate). Does nothing, and says so,
    when ``cell`` has begun already or ``base`` kept no checkpoint (a fresh clone): then ``cell`` runs
    from iteration 0, which the trainer's exact resume makes the same run."""
    from vgrpo_platform.training.recovery.checkpoint import list_checkpoints

    source, target = base.directory(out), cell.directory(out)
    if target.exists() or not list_checkpoints(source):
        return False
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(MARKER, records.RECORDS))
    return True


def read_cell(cell: Cell, out: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``(marker, metrics records)`` of a finished cell; records are empty for a failed one."""
    run_dir = cell.directory(out)
    marker = read_marker(run_dir)
    if marker is None or marker["status"] != "done":
        return marker, []
    return marker, records.load(run_dir)


def choose_rate(scores: dict[float, list[float]]) -> float | None:
    """The sweep's pick: the best mean score over sweep seeds, the smaller rate on a tie; ``None`` if
    every rate failed."""
    means = {lr: sum(s) / len(s) for lr, s in scores.items() if s}
    finite = {lr: m for lr, m in means.items() if math.isfinite(m)}
    if not finite:
        return None
    best = max(finite.values())
    return min(lr for lr, m in finite.items() if m == best)
