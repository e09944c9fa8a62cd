"""Checkpoints that a crash cannot half-write: a temp folder renamed into place, the last K kept.

Layout of ``RUN/checkpoints/iter_000010/``: ``trainable.safetensors`` (the trained weights by name),
``optimizer.pt`` (optimizer and LR-schedule state, loaded with ``weights_only=True``),
``rng.safetensors`` (every generator's state) and ``state.json`` (iteration, prompt position,
recipe fingerprint), and with ``train.ema_decay`` also ``averaged.safetensors`` (the weights' moving
average, by name). Nothing is ever unpickled beyond tensors and plain containers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vgrpo_platform.errors import CheckpointError

PREFIX = "iter_"
FILES = ("trainable.safetensors", "optimizer.pt", "rng.safetensors", "state.json")
AVERAGED = "averaged.safetensors"  # optional: only runs with train.ema_decay write it


@dataclass
class Checkpoint:
    path: Path
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, torch.Tensor]
    state: dict[str, Any]
    averaged: dict[str, torch.Tensor] | None = None  # the EMA weights, where the run kept them

    @property
    def served_weights(self) -> dict[str, torch.Tensor]:
        """What the run evaluated and exported: the moving average where there is one."""
        return self.averaged if self.averaged is not None else self.weights


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    run_dir: Path,
    iteration: int,
    *,
    weights: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    rng: dict[str, torch.Tensor],
    state: dict[str, Any],
    keep_last: int,
    averaged: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write checkpoint ``iteration`` atomically and delete all but the newest ``keep_last``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{iteration:06d}"
    tmp = root / f".tmp_{PREFIX}{iteration:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / "trainable.safetensors")
    )
    if averaged is not None:
        save_file({k: v.contiguous().cpu() for k, v in averaged.items()}, str(tmp / AVERAGED))
    torch.save(optimizer, tmp / "optimizer.pt")
    save_file({k: v.contiguous() for k, v in rng.items()}, str(tmp / "rng.safetensors"))
    (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, indent=1))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    _prune(root, keep_last)
    return final


def _prune(root: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; also delete what killed writes left behind
    (temp folders, and half-deleted older checkpoints, which ``list_checkpoints`` never lists), so a
    run that is killed and resumed many times does not fill the disk."""
    complete = list_checkpoints(root.parent)
    kept = {p.name for p in complete[-keep_last:]}
    for path in root.iterdir():
        stale_tmp = path.name.startswith(f".tmp_{PREFIX}")
        older = path.name.startswith(PREFIX) and path.name not in kept and path.name < min(kept)
        if path.is_dir() and (stale_tmp or older):
            shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    for f in [*path.iterdir(), path] if path.is_dir() else [path]:
        if f.is_file() or f == path:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def missing_files(path: Path) -> list[str]:
    """The files of a complete checkpoint that ``path`` lacks (all of them: not a checkpoint folder)."""
    return [f for f in FILES if not (Path(path) / f).is_file()]


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (temp folders of an interrupted write are skipped)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    return sorted((p for p in found if not missing_files(p)), key=lambda p: p.name)


def load_checkpoint(path: Path) -> Checkpoint:
    """Read one checkpoint folder; a damaged file is a CheckpointError naming it."""
    path = Path(path)
    try:
        weights = load_file(str(path / "trainable.safetensors"))
        rng = load_file(str(path / "rng.safetensors"))
        optimizer = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        state = json.loads((path / "state.json").read_text())
        averaged = load_file(str(path / AVERAGED)) if (path / AVERAGED).is_file() else None
    except Exception as exc:  # safetensors, pickle and json each raise their own types
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); name an older "
            f"checkpoints/iter_* folder, or the run directory {path.parent.parent}: --resume, sample and "
            "eval take its newest readable checkpoint"
        ) from exc
    return Checkpoint(
        path=path, weights=weights, optimizer=optimizer, rng=rng, state=state, averaged=averaged
    )


def latest_valid_checkpoint(run_dir: Path, on_skip: Callable[[str], None] | None = None) -> Checkpoint | None:
    """The newest checkpoint that loads; damaged newer ones are skipped (``on_skip`` hears why), never
    deleted, so nothing is lost if the damage was a passing I/O fault."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return load_checkpoint(path)
        except CheckpointError as exc:
            if on_skip is not None:
                cause = exc.__cause__
                on_skip(
                    f"skipping checkpoint {path}: unreadable ({type(cause).__name__}: {cause}); "
                    "trying an older one"
                )
    return None
