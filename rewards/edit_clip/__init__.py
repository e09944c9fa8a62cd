"""Entry module of the ``edit_clip`` reward: options and registration only, no torch at import time.

A cheap score for instruction-based editing from one CLIP model: how far the image moved in the
direction the text asks (directional CLIP similarity, Gal et al. 2021 "StyleGAN-NADA", used as
"CLIP direction similarity" by Brooks et al. 2023, "InstructPix2Pix") plus how much of the source it kept
(the cosine of the source's and the result's image embeddings, InstructPix2Pix's "CLIP image
similarity"). The source image comes from the prompt's metadata (``condition_image`` or ``image``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

from .._options import ModelRewardConfig


class Config(ModelRewardConfig):
    model: str = Field(
        "openai/clip-vit-large-patch14", description="Hub id or local folder of a transformers CLIPModel."
    )
    processor: str | None = Field(None, description="Processor hub id or folder; null = the model's own.")
    preservation_weight: float = Field(
        0.5,
        ge=0,
        description="Weight of the source-preservation term (cosine of source and result image "
        "embeddings) added to the direction term; 0 = direction only.",
    )


def build(config: Config, context: Any) -> Any:
    """Factory: CLIP and torch load only when a run builds the reward."""
    from .impl import EditClipReward

    return EditClipReward(config, context)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "edit_clip",
            build,
            Config,
            summary="Editing: CLIP direction similarity (image vs. text change) + source preservation.",
        ),
    ]
