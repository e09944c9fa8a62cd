"""Entry module of the ``imagereward`` reward: options and registration only, no torch at import time.

ImageReward (Xu et al. 2023): BLIP (ViT-L/16 image encoder + BERT-base text encoder with cross-attention
to the image) and an MLP head on the [CLS] feature, trained on 137k expert comparisons; scores are
standardised (mean 0, std 1 over its training prompts). The ``image-reward`` package pins timm 0.6 and
an old transformers, so this plugin loads the original ``ImageReward.pt`` into transformers' BLIP classes.
"""

from __future__ import annotations

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

from .._options import ModelRewardConfig


class Config(ModelRewardConfig):
    model: str = Field(
        "THUDM/ImageReward",
        description="Hub repo or local folder holding ImageReward.pt and med_config.json, or the .pt file "
        "itself (med_config.json beside it).",
    )
    tokenizer: str = Field(
        "google-bert/bert-base-uncased", description="Hub id or folder of the BERT tokenizer BLIP uses."
    )
    max_length: int = Field(35, ge=4, description="Prompt tokens kept (ImageReward pads/truncates to 35).")


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "imagereward",
            "vgrpo_rewards.imagereward.impl:ImageRewardReward",
            Config,
            summary="ImageReward v1.0 (BLIP + MLP head) preference score.",
        ),
    ]
