"""OCR reward (Flow-GRPO's ``OcrScorer`` scoring rule; RapidOCR (PP-OCR) or Tesseract as the engine)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import sys
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
RAPIDOCR_FIX = 'pip install rapidocr-onnxruntime (a dependency of vgrpo) or use engine = "tesseract"'
TESSERACT_FIX = 'install tesseract-ocr (apt-get install tesseract-ocr) or use engine = "rapidocr"'


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


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class RapidOcrEngine:
    """PP-OCRv4 detection and recognition (ONNX, shipped in the ``rapidocr-onnxruntime`` wheel), no angle
    classifier (Flow-GRPO's ``use_angle_cls=False``); boxes below 0.5 confidence are dropped as PaddleOCR's
    ``drop_score`` does. One engine per worker: RapidOCR's detector keeps per-call state."""

    def __init__(self, workers: int) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:
            if exc.name in ("rapidocr_onnxruntime", "onnxruntime"):
                new_python = " (no release for Python 3.13+)" if sys.version_info >= (3, 13) else ""
                raise RewardError(
                    f"ocr reward: rapidocr-onnxruntime is not installed{new_python}; {RAPIDOCR_FIX}"
                ) from exc
            libgl = "libGL" in str(exc)  # opencv-python needs the system's libGL
            hint = "; apt-get install libgl1, or pip install opencv-python-headless" if libgl else ""
            raise RewardError(f"ocr reward: rapidocr-onnxruntime fails to import ({exc}){hint}") from exc
        threads = max(1, _cpu_cores() // workers)  # the workers share the cores
        self.engines: queue.Queue[Any] = queue.Queue()
        for _ in range(workers):
            self.engines.put(
                RapidOCR(use_cls=False, text_score=0.5, intra_op_num_threads=threads, inter_op_num_threads=1)
            )

    def __call__(self, image: Image.Image) -> str:
        engine = self.engines.get()
        try:
            result, _ = engine(image)  # a PIL image: RapidOCR converts RGB to the models' BGR itself
        finally:
            self.engines.put(engine)
        return "\n".join(line[1] for line in result or [])  # [box, text, confidence] per line, reading order


class TesseractEngine:
    def __init__(self, lang: str, psm: int) -> None:
        try:
            import pytesseract
        except ImportError as exc:
            raise RewardError(
                f"ocr reward: pytesseract is not installed; pip install pytesseract, {TESSERACT_FIX}"
            ) from exc
        if shutil.which(pytesseract.pytesseract.tesseract_cmd) is None:
            raise RewardError(f"ocr reward: the tesseract binary is not on PATH; {TESSERACT_FIX}")
        self.tesseract, self.lang, self.options = pytesseract, lang, f"--psm {psm}"

    def __call__(self, image: Image.Image) -> str:
        return self.tesseract.image_to_string(image, lang=self.lang, config=self.options)


class OcrReward:
    modalities = frozenset({"image"})

    def __init__(self, config: Config) -> None:
        if config.engine == "rapidocr":
            self.recognise: Any = RapidOcrEngine(config.workers)
        else:
            self.recognise = TesseractEngine(config.lang, config.psm)
        self.config = config

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        images = check_images(samples, prompts, "ocr")  # [B, 3, H, W]
        metas = list(metadata) if len(metadata) == len(prompts) else [{}] * len(prompts)
        targets = [target_text(p, m, self.config.text_key) for p, m in zip(prompts, metas, strict=True)]
        pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        pil = [Image.fromarray(a) for a in pixels.permute(0, 2, 3, 1).cpu().numpy()]  # [H, W, 3] each
        with ThreadPoolExecutor(self.config.workers) as pool:  # both engines release the GIL: threads overlap
            texts = list(pool.map(self.recognise, pil))
        scores = [text_reward(t, g) for t, g in zip(texts, targets, strict=True)]
        return torch.tensor(scores, dtype=torch.float32, device=images.device)  # [B]
