"""The ``moving_shapes`` reward: a programmatic judge of the procedural moving-shapes video world.

Prompts follow the grammar of ``vgrpo_rewards.moving_shapes.world`` ("a red square moving left while a
blue circle rises"); the reward runs the image world's detector on every frame (colour, shape, count) and
tracks each object's colour-mask centroid over the frames (motion direction). Cheap to import: numpy and
torch load in the factory.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Weights(PluginConfig):
    """Weights of the per-criterion scores in ``objective = "partial"`` (a weighted mean) and exponents in
    ``objective = "product"``."""

    color: float = Field(1.0, ge=0)
    shape: float = Field(1.0, ge=0)
    count: float = Field(1.0, ge=0)
    motion: float = Field(1.0, ge=0)


class Config(PluginConfig):
    # "partial": weighted mean of the criteria; "correct": the 0/1 `correct`; "product": the criteria's
    # product (weights as exponents), dense like "partial" but, like "correct", high only when all are right
    objective: Literal["partial", "correct", "product"] = "partial"
    weights: Weights = Field(default_factory=Weights)
    value_threshold: float = Field(0.4, gt=0, lt=1)  # min max(R, G, B) of a shape's pixel, in [0, 1]
    saturation_threshold: float = Field(0.35, gt=0, lt=1)  # min (max - min) / max of a shape's pixel
    min_area_frac: float = Field(0.015, ge=0, lt=1)  # smaller components (fraction of a frame) are specks
    max_objects: int = Field(6, ge=1, le=8)  # largest components per frame matched to the prompt's objects
    # least distance an object's centroid must travel over the clip, as a fraction of the frame side
    # (rendered clips travel 0.2-0.28)
    min_travel_frac: float = Field(0.1, gt=0, lt=1)


def build(config: Config, context: Any) -> Any:
    from .impl import MovingShapesReward

    return MovingShapesReward(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "moving_shapes",
            build,
            Config,
            summary="colour/shape/count/motion judge of the moving-shapes video world",
        ),
    ]
