"""Base classes of the CLIP-style image rewards: the scoring loop each family shares, written once.

``ClipEmbeddingReward`` serves the rewards read off a transformers CLIP model's unit image (and
prompt) embeddings (``clipscore``, ``pickscore``, ``aesthetic``); ``PromptedImageReward`` the rewards
that run their own model on CLIP-preprocessed image batches with the prompts (``hpsv2``,
``imagereward``). A subclass keeps only what makes its score its own. Heavy imports (torch) happen
here, so only ``impl.py`` modules import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from vgrpo_platform.protocols import Samples

from ._clip_common import ImageTransform, batches, check_images, clip_preprocess, load_clip


class ClipEmbeddingReward:
    """Loads ``config.model`` (and ``config.processor``) as a CLIP model and embeds checked image batches."""

    modalities = frozenset({"image"})
    reward_name: ClassVar[str]
    """The reward's registered name, in errors about the samples."""
    weights_name: ClassVar[str]
    """What the weights are called in the weights-not-found error (e.g. ``"CLIPScore"``)."""
    weights_fix: ClassVar[str]
    """How to get the weights, appended to that error."""

    def __init__(self, config: Any, context: Any) -> None:
        self.clip = load_clip(
            config.model,
            config.processor,
            config.dtype,
            config.batch_size,
            context,
            self.weights_name,
            self.weights_fix,
        )

    def embed(self, samples: Samples, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit-norm image and prompt embeddings, ``[B, D]`` each, float32."""
        images = check_images(samples, prompts, self.reward_name)  # [B, 3, H, W]
        img, txt = self.clip.embed(images, prompts)
        assert txt is not None  # prompts were given
        return img, txt

    def embed_images(self, samples: Samples, prompts: Sequence[str]) -> torch.Tensor:
        """Unit-norm image embeddings ``[B, D]``, float32 (``prompts`` are only counted against them)."""
        images = check_images(samples, prompts, self.reward_name)  # [B, 3, H, W]
        img, _ = self.clip.embed(images, None)
        return img


class PromptedImageReward:
    """Scores checked images in batches of ``batch_size``, preprocessed by ``transform`` on their device.

    The subclass sets ``model`` (moved to the samples' device before scoring), ``transform``, ``dtype``
    and ``batch_size`` in its constructor and scores one batch in ``score_batch``.
    """

    modalities = frozenset({"image"})
    reward_name: ClassVar[str]
    """The reward's registered name, in errors about the samples."""
    model: torch.nn.Module
    transform: ImageTransform
    dtype: torch.dtype
    batch_size: int

    def score_batch(self, pixels: torch.Tensor, prompts: list[str], device: torch.device) -> torch.Tensor:
        """``[b]`` scores of preprocessed ``pixels`` ``[b, 3, S, S]`` and their prompts, on ``device``."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_batch()")

    @torch.no_grad()
    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        images = check_images(samples, prompts, self.reward_name)  # [B, 3, H, W]
        self.model.to(images.device)
        out = []
        for sl in batches(images.shape[0], self.batch_size):
            pixels = clip_preprocess(images[sl], self.transform, self.dtype)  # [b, 3, S, S]
            out.append(self.score_batch(pixels, list(prompts[sl]), images.device))
        return torch.cat(out)  # [B]
