"""Entry module of the ``clipscore`` reward: options and registration only, no torch at import time.

CLIPScore (Hessel et al. 2021, "CLIPScore: A Reference-free Evaluation Metric for Image Captioning"):
``w * max(cos(E_image, E_text), 0)``. The paper uses ``w = 2.5``; torchmetrics reports
``max(100 * cos, 0)``. Our default ``scale = 1`` gives ``max(100 * cos, 0) / 100``, the cosine in [0, 1].
"""

from __future__ import annotations

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

from .._options import ModelRewardConfig


class Config(ModelRewardConfig):
    model: str = Field(
        "openai/clip-vit-large-patch14", description="Hub id or local folder of a transformers CLIPModel."
    )
    processor: str | None = Field(None, description="Processor hub id or folder; null = the model's own.")
    clamp: bool = Field(
        True, description="Clip negative cosines to 0 as CLIPScore does; false = plain cosine."
    )
    scale: float = Field(1.0, gt=0, description="Multiplier w (2.5 in Hessel et al., 100 in torchmetrics).")


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "clipscore",
            "vgrpo_rewards.clipscore.impl:ClipScoreReward",
            Config,
            summary="CLIPScore: w * max(cos(image, prompt), 0) with a CLIP model.",
        ),
    ]
