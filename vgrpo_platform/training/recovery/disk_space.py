"""A failed write of a run's files as one line: the path, the error, and how much space is left.

Why: on a full disk torch reports ``PytorchStreamWriter failed writing file data/0: file write failed``
(twice, from C++) and never says "No space left on device"; safetensors and Python's own writes each
word it their own way. ``write_failure`` turns any of them into one ``RunFilesError`` naming what was
being written, the cause and the free space (``shutil.disk_usage``), so the fix is plain.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from vgrpo_platform.errors import RunFilesError

NEARLY_FULL = 256 * 2**20  # below this much free space a failed write is taken for a full disk


def write_failure(what: str, path: Path, exc: BaseException) -> RunFilesError | None:
    """``exc`` raised while writing ``path`` as one line, or None where it is no write failure (a bug,
    which keeps its traceback)."""
    text = " ".join(str(exc).split())
    free = free_bytes(path)
    full = free is not None and free < NEARLY_FULL
    if isinstance(exc, OSError):
        cause = exc.strerror or text or type(exc).__name__
        if exc.errno == errno.ENOSPC:
            cause = "No space left on device"
    elif "No space left" in text or "StorageFull" in text:  # safetensors wraps the OS error in its own
        cause = "No space left on device"
    elif "write" in text.lower():  # torch: "PytorchStreamWriter failed writing file ...: file write failed"
        cause = "No space left on device" if full else f"the write failed ({text[:120]})"
    else:
        return None
    room = "unknown space" if free is None else _size(free)
    return RunFilesError(
        f"could not write {what} {path}: {cause} ({room} free on its disk); free some space or point "
        "run.output_dir at another disk, then continue with --resume: the checkpoints saved before are intact"
    )


def free_bytes(path: Path) -> int | None:
    """Free bytes on the disk holding ``path`` (its nearest existing folder), None if unknown."""
    for folder in [Path(path), *Path(path).parents]:
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def _size(count: int) -> str:
    if count < 2**20:
        return f"{count / 1024:.1f} KiB"
    if count < 2**30:
        return f"{count / 2**20:.1f} MiB"
    return f"{count / 2**30:.1f} GiB"
