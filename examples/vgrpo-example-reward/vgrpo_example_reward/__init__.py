"""Entry module of the ``colorfulness`` reward: options and registration only, no torch at import time."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Config(PluginConfig):
    """Options of ``[rewards.options]`` for ``name = "colorfulness"``."""

    modalities: ClassVar[frozenset[str]] = frozenset({"image", "video"})  # lets `vgrpo check` match adapters

    mean_weight: float = Field(
        0.3, ge=0, description="Weight of the mean opponent colour next to its spread (0.3 in the paper)."
    )
    scale: float = Field(
        1.0, gt=0, description="Multiplier of the score: 255 gives the paper's values for 8-bit images."
    )


def build(config: Config, context: Any) -> Any:
    """Factory: the torch implementation is imported only when a run builds the reward."""
    from vgrpo_example_reward.impl import Colorfulness

    return Colorfulness(mean_weight=config.mean_weight, scale=config.scale)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "colorfulness",
            build,
            Config,
            summary="Hasler-Suesstrunk colourfulness of images: higher is more vivid.",
        ),
    ]
