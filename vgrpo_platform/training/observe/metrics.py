"""Run output for machines and people: ``metrics.jsonl`` and a progress display (rank 0 only)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vgrpo_platform.training.recovery.disk_space import write_failure

if TYPE_CHECKING:
    import torch


def accumulate(
    sums: dict[str, float], extremes: dict[str, float], metrics: dict[str, float], share: float
) -> None:
    """Fold one micro-batch's metrics in: ``*_max`` / ``*_min`` keys by max / min, the rest weighted
    by ``share`` (the micro-batch's part of the batch), so the sums are the batch's means."""
    for key, value in metrics.items():
        if key.endswith("_max"):
            extremes[key] = max(extremes.get(key, -math.inf), value)
        elif key.endswith("_min"):
            extremes[key] = min(extremes.get(key, math.inf), value)
        else:
            sums[key] = sums.get(key, 0.0) + value * share


class MetricsWriter:
    """Appends one JSON object per line. On resume, lines after the checkpoint are dropped first,
    so an interrupted-and-resumed run's file equals an uninterrupted run's."""

    def __init__(self, path: Path, *, resume_after: int | None = None) -> None:
        self.path = Path(path)
        with self._failures():
            if resume_after is None:
                self.path.write_text("")
            elif self.path.exists():
                lines = self.path.read_text().splitlines()
                kept = "".join(line + "\n" for line in lines if _iteration(line) <= resume_after)
                _replace_text(self.path, kept)

    def write(self, record: dict[str, Any]) -> None:
        with self._failures(), self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """A failed write (a full disk) as one line naming the file and the free space."""
        try:
            yield
        except OSError as exc:
            failure = write_failure("records", self.path, exc)
            if failure is None:
                raise
            raise failure from exc


def _replace_text(path: Path, text: str) -> None:
    """Write via a temp file and a rename: a kill mid-write must not lose the records already saved."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _iteration(line: str) -> int:
    try:
        return int(json.loads(line).get("iteration", 0))
    except (ValueError, AttributeError):
        return 1 << 60  # a torn last line from a killed run is dropped


EVAL_STATS = "eval_stats.jsonl"  # beside metrics.jsonl: each evaluation's standard errors and counts


def stats_record(iteration: int, summary: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One ``eval_stats.jsonl`` line: per metric its ``mean``, ``sem`` (None below two values) and ``n``.

    Apart from ``metrics.jsonl``, whose evaluation records hold the means alone, so that file stays
    what it always was (``tests/test_behaviour_record.py`` pins it to the bit).
    """
    stats = {
        key: {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}
        for key, values in summary.items()
    }
    return {"iteration": iteration, "stats": stats}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def reward_metrics(
    total: torch.Tensor,  # [N] the weighted reward of the global batch
    terms: dict[str, torch.Tensor],  # each reward's [N] scores
    details: dict[str, torch.Tensor],  # each reward's [N] detail values (e.g. shapes' criteria)
    advantages: torch.Tensor,  # [N]
    group_ids: torch.Tensor,  # [N]
) -> dict[str, float]:
    """A training record's reward and advantage fields: means, spreads and the share of groups whose
    samples all scored alike (they carry no learning signal)."""
    from vgrpo_platform.algo.grpo import zero_std_fraction

    record = {"reward": total.mean().item()}
    for key, value in terms.items():
        record[f"reward/{key}"] = value.mean().item()
        record[f"reward_std/{key}"] = value.std(unbiased=False).item()
    for key, value in details.items():
        record[f"detail/{key}"] = value.mean().item()
    record["advantage_mean"] = advantages.mean().item()
    record["advantage_std"] = advantages.std(unbiased=False).item()
    record["advantage_abs_max"] = advantages.abs().max().item()
    record["zero_std_fraction"] = zero_std_fraction(total, group_ids)
    return record


def is_timing(key: str) -> bool:
    """Measured, not computed: ``time_*`` and ``wall_seconds`` differ between two runs of one recipe,
    every other field of a record is reproducible to the last bit."""
    return key.startswith("time_") or key == "wall_seconds"


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with their timing fields dropped: what two runs of one recipe must agree on."""
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in records]


def clock_text(seconds: float) -> str:
    """``H:MM:SS`` (``D days, H:MM:SS`` past a day): what a person reads in a log."""
    return str(timedelta(seconds=max(0, round(seconds))))


class Progress:
    """A rich progress bar on a terminal, plain lines elsewhere (SLURM logs, pipes), or nothing.

    The bar and the lines name the method (``label``: the surrogate's name). Plain lines end with the
    elapsed time and an ETA from this process's pace, since a log file has no bar to show them.
    """

    def __init__(
        self,
        mode: str,
        total: int,
        start: int = 0,
        label: str = "vgrpo",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if mode == "auto":
            mode = "rich" if sys.stdout.isatty() else "plain"
        self.mode, self.total, self.start, self.label = mode, total, start, label
        self._clock = clock
        self._bar = None
        if mode == "rich":
            from rich.markup import escape
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn(f"[bold]{escape(label)}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._task = self._bar.add_task("train", total=total, completed=start, info="")
            self._bar.start()
        self._t0 = clock()

    def timing(self, iteration: int) -> str:
        """``elapsed H:MM:SS  ETA H:MM:SS``: the ETA at this process's pace so far (a resumed run's
        earlier iterations are not in it)."""
        elapsed = self._clock() - self._t0
        done = iteration - self.start
        text = f"elapsed {clock_text(elapsed)}"
        if done > 0:
            text += f"  ETA {clock_text(elapsed / done * max(0, self.total - iteration))}"
        return text

    def update(self, iteration: int, info: dict[str, float]) -> None:
        text = "  ".join(f"{k} {v:.4g}" for k, v in info.items())
        if self._bar is not None:
            self._bar.update(self._task, completed=iteration, info=text)
        elif self.mode == "plain":
            print(f"{self.label} [{iteration}/{self.total}] {text}  | {self.timing(iteration)}", flush=True)

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        elif self.mode != "none":
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
