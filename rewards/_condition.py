"""The source image of an editing prompt, read from its metadata: ``condition_image`` (a ``[3, H, W]``
tensor in ``[0, 1]``, what the rollout hands the rewards) or ``image`` (a file path, what a JSONL line names
and what travels over ``vgrpo serve-reward``, where tensors cannot)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vgrpo_platform.errors import RewardError


def source_images(metadata: Sequence[Mapping[str, Any]], reward: str) -> list[torch.Tensor]:
    """One ``[3, H, W]`` float tensor in ``[0, 1]`` (CPU) per sample; ``RewardError`` when one is missing."""
    out = []
    for i, meta in enumerate(metadata):
        image = meta.get("condition_image")
        if isinstance(image, torch.Tensor):
            if image.ndim != 3 or image.shape[0] != 3:
                shape = tuple(image.shape)
                raise RewardError(f"{reward}: metadata[{i}]['condition_image'] is {shape}, not [3, H, W]")
            out.append(image.detach().float().cpu().clamp(0, 1))
        elif isinstance(meta.get("image"), str):
            from PIL import Image

            try:
                with Image.open(meta["image"]) as pil:
                    array = np.asarray(pil.convert("RGB"))
            except OSError as exc:
                raise RewardError(
                    f"{reward}: cannot read the source image {meta['image']!r} ({exc}); fix the prompt "
                    "set's 'image' path"
                ) from None
            out.append(torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255)
        else:
            raise RewardError(
                f"{reward}: sample {i} has no source image (metadata 'condition_image' or 'image'); train "
                "on a JSONL prompt set whose lines name an 'image', with an editing adapter"
            )
    return out
