"""Run output for machines and people: ``metrics.jsonl`` and a progress display (rank 0 only)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        if resume_after is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _iteration(line) <= resume_after]
            _replace_text(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


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


class Progress:
    """A rich progress bar on a terminal, plain lines elsewhere, or nothing."""

    def __init__(self, mode: str, total: int, start: int = 0) -> None:
        if mode == "auto":
            mode = "rich" if sys.stdout.isatty() else "plain"
        self.mode, self.total = mode, total
        self._bar = None
        if mode == "rich":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]V-GRPO"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._task = self._bar.add_task("train", total=total, completed=start, info="")
            self._bar.start()
        self._t0 = time.perf_counter()

    def update(self, iteration: int, info: dict[str, float]) -> None:
        text = "  ".join(f"{k} {v:.4g}" for k, v in info.items())
        if self._bar is not None:
            self._bar.update(self._task, completed=iteration, info=text)
        elif self.mode == "plain":
            print(f"[{iteration}/{self.total}] {text}", flush=True)

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        elif self.mode != "none":
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
