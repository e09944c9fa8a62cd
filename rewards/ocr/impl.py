"""OCR reward (Flow-GRPO's ``OcrScorer`` scoring rule, Tesseract as the engine)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

from .._clip_common import check_images

if TYPE_CHECKING:
    from . import Config

QUOTED = re.compile(r'"([^"]+)"')
FIX = "install the engine: `apt-get install -y tesseract-ocr` (Debian/Ubuntu) and `pip install pytesseract`"


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each), O(len(a) len(b))."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def text_reward(recognised: str, target: str) -> float:
    """Flow-GRPO's rule: normalise (no spaces, lower case); 1 if the target occurs in the recognised text,
    else ``1 - min(levenshtein, len(target)) / len(target)``."""
    rec, tgt = recognised.replace(" ", "").replace("\n", "").lower(), target.replace(" ", "").lower()
    if not tgt:
        raise ValueError("empty target text")
    dist = 0 if tgt in rec else min(levenshtein(rec, tgt), len(tgt))
    return 1.0 - dist / len(tgt)


def target_text(prompt: str, meta: Mapping[str, Any], key: str) -> str:
    if meta.get(key):
        return str(meta[key])
    match = QUOTED.search(prompt)
    if match is None:
        raise RewardError(
            f"ocr reward: no text to check in prompt {prompt!r}; put it in double quotes or in "
            f"metadata[{key!r}]"
        )
    return match.group(1)


class OcrReward:
    modalities = frozenset({"image"})

    def __init__(self, config: Config) -> None:
        try:
            import pytesseract
        except ImportError as exc:
            raise RewardError(f"ocr reward: pytesseract is not installed; {FIX}") from exc
        if shutil.which(pytesseract.pytesseract.tesseract_cmd) is None:
            raise RewardError(f"ocr reward: the tesseract binary is not on PATH; {FIX}")
        self.tesseract = pytesseract
        self.config = config

    def recognise(self, image: Image.Image) -> str:
        options = f"--psm {self.config.psm}"
        return self.tesseract.image_to_string(image, lang=self.config.lang, config=options)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        images = check_images(samples, prompts, "ocr")  # [B, 3, H, W]
        metas = list(metadata) if len(metadata) == len(prompts) else [{}] * len(prompts)
        targets = [target_text(p, m, self.config.text_key) for p, m in zip(prompts, metas, strict=True)]
        pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        pil = [Image.fromarray(a) for a in pixels.permute(0, 2, 3, 1).cpu().numpy()]  # [H, W, 3] each
        with ThreadPoolExecutor(self.config.workers) as pool:  # tesseract is a subprocess: threads overlap
            texts = list(pool.map(self.recognise, pil))
        scores = [text_reward(t, g) for t, g in zip(texts, targets, strict=True)]
        return torch.tensor(scores, dtype=torch.float32, device=images.device)  # [B]
