"""Entry module of the ``pickscore`` reward: options and registration only, no torch at import time.

PickScore (Kirstain et al. 2023, "Pick-a-Pic") is a CLIP ViT-H/14 fine-tuned on human preferences
between generated images; its score is ``logit_scale * cos(text, image)``, about 18-23 for typical
Stable Diffusion images. See docs/rewards.md for weights and memory.
"""

from __future__ import annotations

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

from .._options import ModelRewardConfig


class Config(ModelRewardConfig):
    model: str = Field(
        "yuvalkirstain/PickScore_v1", description="Hub id or local folder of the PickScore CLIPModel weights."
    )
    processor: str = Field(
        "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        description="Hub id or local folder of the CLIP processor (tokenizer) PickScore uses.",
    )
    divisor: float = Field(
        1.0, gt=0, description="Scores are divided by this: 1 = raw PickScore, 100 = the [0, ~0.25] scale."
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "pickscore",
            "vgrpo_rewards.pickscore.impl:PickScoreReward",
            Config,
            summary="PickScore_v1 human-preference score (CLIP-H, prompt-aware).",
        ),
    ]
