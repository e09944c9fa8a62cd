"""Checkpoints that a crash cannot half-write: a temp folder renamed into place, the last K kept.

Layout of ``RUN/checkpoints/iter_000010/``: ``trainable.safetensors`` (the trained weights by name),
``optimizer.pt`` (optimizer and LR-schedule state, loaded with ``weights_only=True``),
``rng.safetensors`` (every generator's state) and ``state.json`` (iteration, prompt position,
recipe fingerprint), and with ``train.ema_decay`` also ``averaged.safetensors`` (the weights' moving
average, by name). Nothing is ever unpickled beyond tensors and plain containers.

A write goes to ``.tmp_iter_NNNNNN_PID`` and is renamed in; writing an iteration that exists again (a
fault's checkpoint, a resumed pending evaluation) first moves the old folder aside to
``.old_iter_NNNNNN_PID`` and deletes it only after the new one is in, so a kill at any point leaves a
complete checkpoint of the iteration (``list_checkpoints`` takes the aside folder where the new one never
arrived). Pruning deletes only temp and aside folders whose PID is this process's or no live process's.
Reading checks the contents too (``checkpoint_contents.py``): damage is a ``DamagedCheckpoint``, which
``latest_valid_checkpoint`` skips for the next older checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vgrpo_platform.errors import CheckpointError
from vgrpo_platform.training.recovery.checkpoint_contents import Expect, Problem, check
from vgrpo_platform.training.recovery.disk_space import write_failure

PREFIX = "iter_"
FILES = ("trainable.safetensors", "optimizer.pt", "rng.safetensors", "state.json")
AVERAGED = "averaged.safetensors"  # optional: only runs with train.ema_decay write it
TMP, ASIDE = f".tmp_{PREFIX}", f".old_{PREFIX}"  # + NNNNNN_PID: a write under way, an old copy moved aside
_OWNED = re.compile(rf"^(?:{re.escape(TMP)}|{re.escape(ASIDE)})(\d+)_(\d+)$")


class DamagedCheckpoint(CheckpointError):
    """A checkpoint that cannot be read or whose contents are wrong; ``reason`` says which file and how."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"checkpoint {path} is unusable: {reason}; name an older checkpoints/iter_* folder, or the run "
            f"directory {path.parent.parent}: --resume, sample and eval take its newest usable checkpoint"
        )
        self.path, self.reason = path, " ".join(reason.split())


@dataclass
class Checkpoint:
    path: Path
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, torch.Tensor]
    state: dict[str, Any]
    averaged: dict[str, torch.Tensor] | None = None  # the EMA weights, where the run kept them
    skipped: tuple[str, ...] = ()  # newer checkpoints of the run passed over, each "path: why"

    @property
    def served_weights(self) -> dict[str, torch.Tensor]:
        """What the run evaluated and exported: the moving average where there is one."""
        return self.averaged if self.averaged is not None else self.weights

    @property
    def iteration(self) -> int:
        return int(self.state["iteration"])


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
    """Write checkpoint ``iteration`` atomically and delete all but the newest ``keep_last``. A failed
    write (a full disk) is one ``RunFilesError`` naming the path and the free space; nothing saved before
    is touched."""
    root = checkpoint_dir(run_dir)
    final = root / f"{PREFIX}{iteration:06d}"
    tmp = root / f"{TMP}{iteration:06d}_{os.getpid()}"
    try:  # every step inline: tests/test_kill_resume.py kills before a random line of this function
        root.mkdir(parents=True, exist_ok=True)
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
    except Exception as exc:  # OSError, torch's RuntimeError, safetensors' own: write_failure sorts them
        shutil.rmtree(tmp, ignore_errors=True)
        failure = write_failure("checkpoint", final, exc)
        if failure is None:
            raise
        raise failure from exc
    # An iteration written again: its old folder is moved aside and deleted only once the new one is
    # in, so a complete copy is on disk at every moment (list_checkpoints finds an aside one).
    aside = root / f"{ASIDE}{iteration:06d}_{os.getpid()}" if final.exists() else None
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        _fsync_dir(root)
    os.replace(tmp, final)
    _fsync_dir(root)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    _prune(root, keep_last)
    return final


def _prune(root: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; also delete what killed writes left behind
    (temp and aside folders, half-deleted older checkpoints, which ``list_checkpoints`` never lists), so
    a run that is killed and resumed many times does not fill the disk. A temp or aside folder is only
    this process's or a dead one's: another live process's write is never touched."""
    complete = list_checkpoints(root.parent)
    kept = set(complete[-keep_last:])
    oldest_kept = min((_number(p) for p in kept), default=None)
    for path in root.iterdir():
        if not path.is_dir() or path in kept:
            continue
        owned = _OWNED.match(path.name)
        if owned:  # an aside folder still needed is the kept copy of its iteration, skipped above
            if int(owned.group(2)) == os.getpid() or not _alive(int(owned.group(2))):
                shutil.rmtree(path, ignore_errors=True)
        elif path.name.startswith(PREFIX) and oldest_kept is not None and _number(path) < oldest_kept:
            shutil.rmtree(path, ignore_errors=True)


def _number(path: Path) -> int:
    """The iteration a checkpoint folder (``iter_NNNNNN`` or ``.old_iter_NNNNNN_PID``) holds."""
    owned = _OWNED.match(path.name)
    digits = owned.group(1) if owned else path.name.removeprefix(PREFIX)
    return int(digits) if digits.isdigit() else -1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


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
    """Complete checkpoint folders, oldest first (temp folders of an interrupted write are skipped). An
    iteration whose re-save was cut between moving the old copy aside and renaming the new one in is
    listed by its aside folder."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and _number(p) >= 0 and not missing_files(p):
            found[_number(p)] = p
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(ASIDE) and _number(p) not in found and not missing_files(p):
            found[_number(p)] = p
    return [found[n] for n in sorted(found)]


def load_checkpoint(path: Path, expect: Expect | None = None) -> Checkpoint:
    """Read one checkpoint folder and check its contents for ``expect``'s reader (``Expect()``: sample,
    eval, export); a damaged file is a ``DamagedCheckpoint`` naming it and what is wrong."""
    path = Path(path)
    try:
        weights = load_file(str(path / "trainable.safetensors"))
        rng = load_file(str(path / "rng.safetensors"))
        optimizer = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        state = json.loads((path / "state.json").read_text())
        averaged = load_file(str(path / AVERAGED)) if (path / AVERAGED).is_file() else None
    except Exception as exc:  # safetensors, pickle and json each raise their own types
        raise DamagedCheckpoint(path, f"unreadable ({type(exc).__name__}: {exc})") from exc
    try:
        check(
            path,
            weights=weights,
            optimizer=optimizer,
            rng=rng,
            state=state,
            averaged=averaged,
            expect=expect or Expect(),
        )
    except Problem as problem:
        raise DamagedCheckpoint(path, str(problem)) from None
    return Checkpoint(
        path=path, weights=weights, optimizer=optimizer, rng=rng, state=state, averaged=averaged
    )


def latest_valid_checkpoint(
    run_dir: Path,
    on_skip: Callable[[str], None] | None = None,
    expect: Expect | None = None,
    use: Callable[[Checkpoint], None] | None = None,
) -> Checkpoint | None:
    """The newest checkpoint that loads, passes ``expect``'s checks and, where given, that ``use`` takes
    without raising ``DamagedCheckpoint``; damaged newer ones are skipped (``on_skip`` hears why, and the
    result's ``skipped`` lists them), never deleted, so nothing is lost if the damage was a passing I/O
    fault."""
    skipped: list[str] = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            ckpt = load_checkpoint(path, expect)
            if use is not None:
                use(ckpt)
        except DamagedCheckpoint as exc:
            skipped.append(f"{path.name}: {exc.reason}")
            if on_skip is not None:
                on_skip(f"skipping checkpoint {path}: {exc.reason}; trying an older one")
            continue
        ckpt.skipped = tuple(skipped)
        return ckpt
    return None
