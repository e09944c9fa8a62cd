"""Entry module of the built-in toy rewards: options and registration only, no torch at import time.

``brightness`` and ``target_color`` score pixels directly: cheap, exact and with a known optimum,
so a short CPU run can show that training moves the reward (the quickstart recipe's job).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig

UnitFloat = Annotated[float, Field(ge=0.0, le=1.0)]


class BrightnessConfig(PluginConfig):
    """Options of the ``brightness`` reward."""

    target: UnitFloat | None = Field(
        None,
        description="Desired mean pixel value in [0, 1]: the score is -|mean - target|; null = the score is "
        "the mean pixel value itself (brighter is better).",
    )


class TargetColorConfig(PluginConfig):
    """Options of the ``target_color`` reward."""

    rgb: tuple[UnitFloat, UnitFloat, UnitFloat] = Field(
        (1.0, 0.0, 0.0),
        description="Target colour (red, green, blue) in [0, 1]; the score is minus the mean distance of "
        "the pixels to it divided by sqrt(3): in [-1, 0], 0 for a uniform image of that colour.",
    )


def build_brightness(config: BrightnessConfig, context: Any = None) -> Any:
    """Factory: imports the torch implementation only when a run builds the reward."""
    from vgrpo_rewards.toy.impl import BrightnessReward

    return BrightnessReward(target=config.target)


def build_target_color(config: TargetColorConfig, context: Any = None) -> Any:
    from vgrpo_rewards.toy.impl import TargetColorReward

    return TargetColorReward(rgb=config.rgb)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "brightness",
            build_brightness,
            BrightnessConfig,
            summary="Mean pixel value in [0, 1], or minus its distance to a target value.",
        ),
        Component(
            "reward",
            "target_color",
            build_target_color,
            TargetColorConfig,
            summary="Minus the mean RGB distance of the pixels to a target colour, scaled to [-1, 0].",
        ),
    ]
