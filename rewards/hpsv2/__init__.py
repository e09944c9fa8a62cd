"""Entry module of the ``hpsv2`` reward: options and registration only, no torch at import time.

HPSv2.1 (Human Preference Score v2.1, Wu et al. 2023): an open_clip ViT-H-14 fine-tuned on the HPD v2
preference dataset; the score is the cosine of the unit image and text embeddings (about 0.25-0.35),
as ``hpsv2.score`` computes it. Needs the ``open_clip_torch`` package (with torchvision and timm).
"""

from __future__ import annotations

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

from .._options import ModelRewardConfig


class Config(ModelRewardConfig):
    model: str = Field(
        "xswu/HPSv2",
        description="The HPS checkpoint: a .pt file, a folder holding `filename`, or a hub repo with it.",
    )
    filename: str = Field(
        "HPS_v2.1_compressed.pt",
        description="Checkpoint file name in the folder or repo (v2.0: HPS_v2_compressed.pt).",
    )
    arch: str = Field("ViT-H-14", description="open_clip architecture the checkpoint was trained on.")


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "hpsv2",
            "vgrpo_rewards.hpsv2.impl:HpsV2Reward",
            Config,
            summary="HPSv2.1 human-preference score (open_clip ViT-H-14), cosine.",
        ),
    ]
