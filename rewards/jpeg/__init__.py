"""Entry module of the ``jpeg`` reward: options and registration only, no torch at import time.

JPEG compressibility as in DDPO (Black et al. 2023): minus the size in kB (1000 bytes) of the image saved
by PIL as a JPEG at quality 95. ``incompressibility = true`` flips the sign (bigger files score higher).
No model, prompt-independent, CPU-bound (PIL encodes each image).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Config(PluginConfig):
    incompressibility: bool = Field(False, description="Reward large JPEG files instead of small ones.")
    quality: int = Field(95, ge=1, le=100, description="JPEG quality PIL encodes with (DDPO: 95).")


def build(config: Config, context: Any) -> Any:
    from .impl import JpegReward

    return JpegReward(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "jpeg",
            build,
            Config,
            summary="JPEG (in)compressibility: -/+ size in kB at quality 95 (DDPO).",
        ),
    ]
