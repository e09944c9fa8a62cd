"""A reward plugin whose worker process dies on demand: what ``scoring.isolation = "process"`` must survive.

Module-level factory and options, so the spawned reward worker can rebuild it (tests are on its path).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Config(PluginConfig):
    die_file: str  # while this file exists, scoring kills the process (exit code 9, no Python cleanup)
    once: bool = True  # delete the file before dying: the next worker scores normally
    hang_file: str | None = None  # while this file exists, scoring sleeps (a hung reward) instead of dying
    hang_seconds: float = 60.0


class CrashingBrightness:
    """Mean pixel value, like ``brightness``; ``os._exit`` while ``die_file`` exists, a long sleep while
    ``hang_file`` does."""

    modalities = frozenset({"image", "video"})

    def __init__(self, config: Config) -> None:
        self.config = config

    def score(self, samples: Any, prompts: Any, metadata: Any) -> Any:
        marker = Path(self.config.die_file)
        if marker.exists():
            if self.config.once:
                marker.unlink()
            os._exit(9)
        if self.config.hang_file is not None and Path(self.config.hang_file).exists():
            if self.config.once:
                Path(self.config.hang_file).unlink()
            time.sleep(self.config.hang_seconds)
        return samples.data.float().flatten(1).mean(1)


def build(config: Config, context: Any) -> CrashingBrightness:
    return CrashingBrightness(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward", "crashing_brightness", build, Config, "brightness whose process dies on demand (tests)"
        )
    ]
