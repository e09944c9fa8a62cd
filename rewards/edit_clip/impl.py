"""``edit_clip`` = ``cos(E(result) - E(source), T(target) - T(source caption))``
``+ preservation_weight * cos(E(result), E(source))``, CLIP image (``E``) and text (``T``) embeddings.

The text direction runs from the line's ``source_caption`` (default: the empty string) to its
``target_caption`` (default: the prompt, i.e. the instruction). Captions give the direction CLIP was
trained to read; an instruction alone ("make it snowy") still points the right way in practice but is
noisier. A result equal to its source has no direction (0) and full preservation: the trade-off the
weight sets, and the guard against a policy that learns to return the source unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from vgrpo_platform.protocols import Samples

from .._clip_bases import ClipEmbeddingReward
from .._condition import source_images

if TYPE_CHECKING:
    from . import Config

FIX = (
    "download it with `huggingface-cli download openai/clip-vit-large-patch14 --local-dir DIR` "
    "and set the reward's options.model to that folder"
)
MIN_CHANGE = 1e-4
"""Distance between unit image embeddings below which the result counts as the source unchanged."""


class EditClipReward(ClipEmbeddingReward):
    """``score`` with diagnostics ``direction`` and ``preservation`` (both cosines in [-1, 1])."""

    reward_name = "edit_clip"
    weights_name = "edit_clip CLIP"
    weights_fix = FIX

    def __init__(self, config: Config, context: Any) -> None:
        self.preservation_weight = config.preservation_weight
        super().__init__(config, context)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        result = self.embed_images(samples, prompts)  # [B, D] unit
        device = samples.data.device
        sources = source_images(metadata, self.reward_name)  # each [3, H, W], any size
        source = torch.cat([self.clip.embed(s[None].to(device), None)[0] for s in sources])  # [B, D]
        targets = [str(m.get("target_caption", p)) for p, m in zip(prompts, metadata, strict=True)]
        captions = [str(m.get("source_caption", "")) for m in metadata]
        text = self.clip.embed_texts([*targets, *captions], device)  # [2B, D]
        b = len(prompts)
        change = result - source
        moved = change.norm(dim=-1) > MIN_CHANGE  # below it the direction is float noise, not an edit
        text_dir = F.normalize(text[:b] - text[b:], dim=-1)
        direction = torch.where(moved, (F.normalize(change, dim=-1) * text_dir).sum(-1), 0.0)  # [B]
        preservation = (result * source).sum(-1)  # [B]
        return {
            "score": direction + self.preservation_weight * preservation,
            "direction": direction,
            "preservation": preservation,
        }
