"""Ctrl-C and SIGTERM as a request to stop: the loop finishes its iteration, saves and exits."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """A stop by a signal, naming it, so the command can say which one (SIGTERM is a scheduler's, not
    a Ctrl-C). A ``KeyboardInterrupt``, so whatever handles Ctrl-C handles it."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class StopFlag:
    """Set by SIGINT/SIGTERM; the loop stops cleanly at the end of the current iteration."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum: int, frame: object) -> None:
            if self.requested:  # second signal: stop now, the last checkpoint stays valid
                raise Interrupted(signal.Signals(signum).name)
            self.requested, self.signal_name = True, signal.Signals(signum).name

        try:
            for s in previous:
                signal.signal(s, handler)
        except ValueError:  # not the main thread: leave signals alone
            yield
            return
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
