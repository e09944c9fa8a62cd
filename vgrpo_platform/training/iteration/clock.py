"""Seconds of one iteration by stage, kept beside the steps instead of woven through them.

The loop marks where each stage ends (``lap``). Time spent on a measurement that is not the method's
cost (the surrogate diagnostics, a lossy backend's mismatch check) is set aside and left out of the
stage it fell in, so methods compare on their own cost; ``set_aside`` reports it for ``wall_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StageClock:
    """Started at construction; ``record()`` gives the ``time_*`` metrics of ``metrics.jsonl``."""

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.stages: dict[str, float] = {}
        self.set_aside = 0.0

    def lap(self, stage: str) -> None:
        """``stage`` ends now: the seconds since the previous lap (or the start) are its own."""
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self._last
        self._last = now

    @contextmanager
    def aside(self) -> Iterator[None]:
        """A measurement inside the current stage, not counted in it."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.set_aside += time.perf_counter() - began

    def add_aside(self, seconds: float) -> None:
        """A measurement timed elsewhere (e.g. inside the rollout source)."""
        self.set_aside += seconds

    def record(self) -> dict[str, float]:
        """``time_rollout`` (the rollout), ``time_reward`` (what scoring added: the wait after the rollout),
        ``time_train`` (surrogate and update, measurements left out), ``time_iteration`` (all of it)."""
        return {
            "time_rollout": self.stages.get("rollout", 0.0),
            "time_reward": self.stages.get("reward", 0.0),
            "time_train": self.stages.get("train", 0.0) - self.set_aside,
            "time_iteration": self._last - self.start,
        }
