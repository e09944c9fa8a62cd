"""Entry module of the ``aesthetic`` reward: options and registration only, no torch at import time.

The LAION aesthetic predictor v2 ("improved-aesthetic-predictor", C. Schuhmann): a linear MLP head on
the unit-norm CLIP ViT-L/14 image embedding, trained on SAC + LOGOS + AVA ratings (1-10 scale).
Prompt-independent. DDPO's aesthetic reward.
"""

from __future__ import annotations

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

from .._options import ModelRewardConfig


class Config(ModelRewardConfig):
    model: str = Field(
        "openai/clip-vit-large-patch14", description="Hub id or local folder of the CLIP ViT-L/14 CLIPModel."
    )
    processor: str | None = Field(None, description="Processor hub id or folder; null = the model's own.")
    head: str = Field(
        description="The MLP head weights: a .pth or .safetensors file (sac+logos+ava1-l14-linearMSE.pth), "
        "a folder holding it, or a hub repo id holding `head_filename`."
    )
    head_filename: str = Field(
        "sac+logos+ava1-l14-linearMSE.pth", description="File name looked up when `head` is a folder or repo."
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "aesthetic",
            "vgrpo_rewards.aesthetic.impl:AestheticReward",
            Config,
            summary="LAION aesthetic predictor v2 (CLIP ViT-L/14 + MLP head), 1-10.",
        ),
    ]
