"""The ``geneval`` Reward: detect, keep GenEval's detections, judge each image against its metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

from .._clip_common import check_images, load_clip
from .rules import CRITERIA, Detection, Spec, Thresholds, judge, keep, parse_spec

if TYPE_CHECKING:
    from . import Config
    from .detectors import Detector

CLIP_FIX = (
    "download it with `huggingface-cli download openai/clip-vit-large-patch14 --local-dir DIR` and set the "
    "reward's options.clip_model to that folder, or set options.color = 'pixels'"
)
METADATA_FIX = (
    "train on a JSONL prompt set whose lines carry GenEval's 'tag', 'include' and 'exclude' "
    "(python -m vgrpo_rewards.geneval.make_prompts writes one)"
)


class ColorNamer(Protocol):
    def name(self, image: np.ndarray, objects: Sequence[Detection], cls: str) -> list[str]: ...


class _ImageColors:
    """One image's colour namer for ``rules.judge``: the same objects are named once."""

    def __init__(self, colors: ColorNamer, image: np.ndarray) -> None:
        self.colors, self.image = colors, image
        self.memo: dict[tuple[int, ...], list[str]] = {}

    def __call__(self, objects: Sequence[Detection], cls: str) -> list[str]:
        key = tuple(id(o) for o in objects)
        if key not in self.memo:
            self.memo[key] = self.colors.name(self.image, objects, cls)
        return self.memo[key]


class GenEvalReward:
    """``score`` is GenEval's 1/0 (``objective = "strict"``) or Flow-GRPO's partial credit (``"graded"``);
    both are returned, with each criterion's share of satisfied clauses, as diagnostics.

    ``detector`` and ``colors`` replace the ones the options name (tests hand in doubles there)."""

    modalities = frozenset({"image"})

    def __init__(
        self, config: Config, context: Any, detector: Detector | None = None, colors: ColorNamer | None = None
    ) -> None:
        from .colors import ClipColors, PixelColors
        from .detectors import load_detector

        assert config.threshold is not None and config.counting_threshold is not None
        assert config.max_overlap is not None and config.model is not None  # filled by the Config
        self.objective = config.objective
        self.thresholds = Thresholds(
            config.threshold, config.counting_threshold, config.max_objects, config.max_overlap,
            config.position_margin,
        )  # fmt: skip
        self.floor = min(config.threshold, config.counting_threshold)
        self.detector = detector or load_detector(
            config.detector, config.model, config.dtype, config.batch_size, context
        )
        if colors is None:
            if config.color == "pixels":
                colors = PixelColors()
            else:
                clip = load_clip(
                    config.clip_model, config.clip_processor, config.dtype, config.batch_size, context,
                    "GenEval colour CLIP", CLIP_FIX,
                )  # fmt: skip
                colors = ClipColors(clip)
        self.colors = colors

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        data = check_images(samples, prompts, "geneval")  # [B, 3, H, W]
        if len(metadata) != len(prompts):
            raise RewardError(f"geneval: {len(metadata)} metadata entries for {len(prompts)} prompts")
        specs = [self._spec(p, m) for p, m in zip(prompts, metadata, strict=True)]
        images = (data.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        images_np = images.permute(0, 2, 3, 1).cpu().numpy()  # [B, H, W, 3]
        classes = sorted({c.cls for s in specs for c in (*s.include, *s.exclude)})
        detections = self.detector.detect(images_np, classes, self.floor) if len(specs) else []
        rows: dict[str, list[float]] = {k: [] for k in ("score", "correct", "graded", *CRITERIA)}
        for image, spec, dets in zip(images_np, specs, detections, strict=True):
            name = _ImageColors(self.colors, image)
            verdict = judge(
                keep(dets, spec.tag, self.thresholds), spec, name, self.thresholds.position_margin
            )
            rows["correct"].append(float(verdict.correct))
            rows["graded"].append(verdict.graded)
            rows["score"].append(float(verdict.correct) if self.objective == "strict" else verdict.graded)
            for k in CRITERIA:
                rows[k].append(verdict.criteria[k])
        return {k: torch.tensor(v, dtype=torch.float32, device=data.device) for k, v in rows.items()}

    @staticmethod
    def _spec(prompt: str, meta: Mapping[str, Any]) -> Spec:
        try:
            return parse_spec(meta)
        except ValueError as exc:
            raise RewardError(f"geneval: prompt {prompt[:60]!r}: {exc}; {METADATA_FIX}") from None
