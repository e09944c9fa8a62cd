"""Naming an object's colour: GenEval's CLIP zero-shot classifier, or a pixel rule for runs without weights.

GenEval's rule: paste the object (its mask, where the detector segments) on a grey ``#999999`` canvas,
crop its box, and pick the colour whose text embedding is nearest the crop's CLIP embedding; each colour's
text embedding is the normalised mean of the normalised embeddings of ``"a photo of a {c} {class}"``,
``"a photo of a {c}-colored {class}"`` and ``"a photo of a {c} object"`` (clip_benchmark's zero-shot
classifier). GenEval uses OpenAI's CLIP ViT-L/14.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .._clip_common import ClipBundle, batches, clip_preprocess, features
from .classes import COLORS
from .rules import Detection

GREY = 0x99 / 255
TEMPLATES = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")

# sRGB anchors of the ten colours for the pixel rule (CSS named colours; brown is CSS "saddlebrown")
ANCHORS = np.array(
    [
        [255, 0, 0],  # red
        [255, 165, 0],  # orange
        [255, 255, 0],  # yellow
        [0, 128, 0],  # green
        [0, 0, 255],  # blue
        [128, 0, 128],  # purple
        [255, 192, 203],  # pink
        [139, 69, 19],  # brown
        [0, 0, 0],  # black
        [255, 255, 255],  # white
    ],
    dtype=np.float64,
)


def object_pixels(image: np.ndarray, det: Detection) -> np.ndarray:
    """The object's pixels ``[N, 3]`` uint8: its mask's inside its box (the whole box without a mask)."""
    x0, y0, x1, y1 = (int(round(v)) for v in det.box)
    crop = image[y0:y1, x0:x1]
    if det.mask is None:
        return crop.reshape(-1, 3)
    return crop[np.asarray(det.mask)[y0:y1, x0:x1]]


class PixelColors:
    """The colour anchor nearest (in sRGB) to the object's median pixel: exact on flat-coloured objects,
    a cheap stand-in for CLIP where no weights are at hand; not GenEval's rule."""

    def name(self, image: np.ndarray, objects: Sequence[Detection], cls: str) -> list[str]:
        out = []
        for det in objects:
            pixels = object_pixels(image, det)
            median = np.median(pixels, axis=0) if len(pixels) else np.full(3, 153.0)
            out.append(COLORS[int(np.argmin(((ANCHORS - median) ** 2).sum(-1)))])
        return out


class ClipColors:
    """GenEval's CLIP colour classifier (see the module docstring) on a transformers CLIP model."""

    def __init__(self, clip: ClipBundle) -> None:
        self.clip = clip
        self.classifiers: dict[str, torch.Tensor] = {}  # class name -> [10, D] unit colour embeddings

    @torch.no_grad()
    def _classifier(self, cls: str, device: torch.device) -> torch.Tensor:
        if cls not in self.classifiers:
            texts = [t.format(c=c, cls=cls) for c in COLORS for t in TEMPLATES]
            emb = self.clip.embed_texts(texts, device)  # [30, D] unit
            emb = emb.view(len(COLORS), len(TEMPLATES), -1).mean(1)  # [10, D]
            self.classifiers[cls] = F.normalize(emb, dim=-1)
        return self.classifiers[cls]

    @torch.no_grad()
    def name(self, image: np.ndarray, objects: Sequence[Detection], cls: str) -> list[str]:
        if not objects:
            return []
        device = next(self.clip.model.parameters()).device
        picture = torch.from_numpy(image).to(device).permute(2, 0, 1).float() / 255  # [3, H, W]
        crops = []
        for det in objects:
            x = picture
            if det.mask is not None:
                mask = torch.as_tensor(np.asarray(det.mask), device=device)
                x = torch.where(mask, picture, torch.full_like(picture, GREY))
            x0, y0, x1, y1 = (int(round(v)) for v in det.box)
            x0, y0 = min(max(x0, 0), x.shape[2] - 1), min(max(y0, 0), x.shape[1] - 1)
            crop = x[:, y0 : max(y1, y0 + 1), x0 : max(x1, x0 + 1)]
            crops.append(clip_preprocess(crop[None], self.clip.transform, self.clip.dtype))  # [1, 3, S, S]
        pixels = torch.cat(crops)
        emb = torch.cat(
            [
                features(self.clip.model.get_image_features(pixel_values=pixels[sl])).float()
                for sl in batches(len(pixels), self.clip.batch_size)
            ]
        )
        scores = F.normalize(emb, dim=-1) @ self._classifier(cls, device).T  # [N, 10]
        return [COLORS[int(i)] for i in scores.argmax(-1).tolist()]
