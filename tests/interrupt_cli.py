"""``vgrpo run`` whose run is stopped by Ctrl-C at once, and a second Ctrl-C that comes while the command
reports the first (``reporting``) or while the process exits (``exiting``: joining worker threads); or
stopped by SIGTERM as the loop stops on it (``sigterm``).

    python interrupt_cli.py reporting|exiting|sigterm RECIPE
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import types
from typing import Any

from vgrpo_platform.cli import app


class _PressingAgain:
    """stderr that receives a second Ctrl-C before each write."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, text: str) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        return self.real.write(text)

    def flush(self) -> None:
        self.real.flush()


def main(case: str, recipe: str) -> None:
    def run(resolved: Any, resume: bool) -> None:
        if case == "sigterm":
            from vgrpo_platform.training.recovery.interrupts import Interrupted

            raise Interrupted("SIGTERM")  # what the loop raises once it saved on SIGTERM
        if case == "reporting":
            sys.stderr = _PressingAgain(sys.stderr)
        else:
            atexit.register(os.kill, os.getpid(), signal.SIGINT)
        raise KeyboardInterrupt  # the first Ctrl-C

    fake = types.ModuleType("vgrpo_platform.training.loop")
    fake.run = run  # type: ignore[attr-defined]
    sys.modules["vgrpo_platform.training.loop"] = fake
    sys.argv = ["vgrpo", "run", recipe]
    app.main()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
