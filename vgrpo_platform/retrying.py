"""Retries with exponential backoff for the rewards that score over HTTP (``remote``, ``vlm_judge``).

A client raises ``TransientError`` for a failure worth trying again (no connection, a timeout, an
overloaded server); anything else propagates at once. After the last try the transient failure becomes
a one-line ``RewardError``, so a run handles it by ``train.on_fault``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from vgrpo_platform.errors import RewardError

T = TypeVar("T")


class TransientError(Exception):
    """A failure worth retrying; its message is the one-line error the last try reports."""


def with_retries(call: Callable[[], T], *, retries: int, backoff_s: float) -> T:
    """``call()``, tried up to ``retries`` more times on ``TransientError``, sleeping ``backoff_s * 2**k``
    after the k-th failure."""
    tries = retries + 1
    for attempt in range(tries):
        try:
            return call()
        except TransientError as exc:
            if attempt == tries - 1:
                raise RewardError(f"{exc} (after {tries} tries)") from None
            time.sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")
