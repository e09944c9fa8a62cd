"""PickScore as its reference code computes it: ``logit_scale.exp() * <text_emb, image_emb>`` on unit
embeddings (github.com/yuvalkirstain/PickScore, README "Inference with PickScore")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform.protocols import Samples

from .._clip_bases import ClipEmbeddingReward

if TYPE_CHECKING:
    from . import Config

FIX = (
    "download it with `huggingface-cli download yuvalkirstain/PickScore_v1 --local-dir DIR` (and "
    "`laion/CLIP-ViT-H-14-laion2B-s32B-b79K` for the processor) and set the reward's options.model "
    "(options.processor) to that folder"
)


class PickScoreReward(ClipEmbeddingReward):
    reward_name = "pickscore"
    weights_name = "PickScore"
    weights_fix = FIX

    def __init__(self, config: Config, context: Any) -> None:
        self.divisor = config.divisor
        super().__init__(config, context)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        img, txt = self.embed(samples, prompts)  # [B, D] each, unit norm
        scale = self.clip.model.logit_scale.exp().float()
        return scale * (img * txt).sum(-1) / self.divisor  # [B]
