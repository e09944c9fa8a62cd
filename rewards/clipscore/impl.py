"""CLIPScore = ``scale * max(cos(image, text), 0)`` (Hessel et al. 2021, eq. 1), or the plain cosine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform.protocols import Samples

from .._clip_bases import ClipEmbeddingReward

if TYPE_CHECKING:
    from . import Config

FIX = (
    "download it with `huggingface-cli download openai/clip-vit-large-patch14 --local-dir DIR` "
    "and set the reward's options.model to that folder"
)


class ClipScoreReward(ClipEmbeddingReward):
    reward_name = "clipscore"
    weights_name = "CLIPScore"
    weights_fix = FIX

    def __init__(self, config: Config, context: Any) -> None:
        self.clamp, self.scale = config.clamp, config.scale
        super().__init__(config, context)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        img, txt = self.embed(samples, prompts)  # [B, D] each, unit norm
        cos = (img * txt).sum(-1)  # [B]
        return self.scale * (cos.clamp_min(0.0) if self.clamp else cos)
