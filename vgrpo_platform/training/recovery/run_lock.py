"""One live run per run directory: an exclusive lock held for the run's life.

Why: two processes training into one directory corrupt each other (one's checkpoint pruning deletes the
other's half-written checkpoint; ``metrics.jsonl`` gets every iteration twice), and ``--resume`` started
while the run still goes does the same. The lock is ``fcntl.flock`` on ``RUN/.vgrpo.lock``, which records
the holder's PID: the kernel drops it when the holder exits, however it exits (SIGKILL included), so a
stale file never blocks a resume. A second ``vgrpo run`` or ``--resume`` gets one line naming the PID.

Within one process the newest ``RunLock`` of a directory takes the lock over from an older one (runs in
one process follow each other; a ``Trainer`` that was built and never run leaves its lock to the next).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import IO

from vgrpo_platform.errors import RunFilesError

LOCK_FILE = ".vgrpo.lock"
_HELD: dict[Path, RunLock] = {}  # run directory (resolved) -> this process's lock of it


class RunLock:
    """The lock of one run directory; ``release`` (or process exit) frees it."""

    def __init__(self, run_dir: Path, handle: IO[str] | None) -> None:
        self.run_dir, self._handle = run_dir, handle

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take ``run_dir``'s lock (creating the folder) or raise ``RunFilesError`` naming its holder."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        key = run_dir.resolve()
        earlier = _HELD.pop(key, None)
        if earlier is not None:
            earlier.release()
        handle = (run_dir / LOCK_FILE).open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):  # no locks on this disk
                handle.close()
                return cls(run_dir, None)
            holder = _recorded_pid(run_dir)
            handle.close()
            raise RunFilesError(in_use(run_dir, holder)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        lock = cls(run_dir, handle)
        _HELD[key] = lock
        return lock

    def release(self) -> None:
        if self._handle is None:
            return
        try:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
        finally:
            self._handle.close()
            self._handle = None
            if _HELD.get(self.run_dir.resolve()) is self:
                del _HELD[self.run_dir.resolve()]


def holder(run_dir: Path) -> int | None:
    """The PID of another process that holds ``run_dir``'s lock now (0 where it recorded none), or None."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file() or Path(run_dir).resolve() in _HELD:
        return None
    with path.open("r") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                return _recorded_pid(Path(run_dir)) or 0
            return None
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


def in_use(run_dir: Path, pid: int | None) -> str:
    who = f"process {pid}" if pid else "another process"
    return (
        f"run directory {run_dir} is in use by {who} (it holds {run_dir / LOCK_FILE}); wait for that run "
        f"to end or stop it (kill {pid or '<pid>'}), then --resume; or start a new run with "
        "--set run.name=<new name>"
    )


def _recorded_pid(run_dir: Path) -> int | None:
    try:
        text = (run_dir / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
