"""The ``tones`` Reward object: batch checks, per-clip detection, weighting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

try:
    import torchaudio  # noqa: F401  (the judge's spectrogram)
except ImportError as exc:  # the `audio` extra: not in the core install, which keeps the machine's torch
    raise RewardError(
        f"the tones reward needs torchaudio, which failed to import ({exc}); install the torchaudio "
        "of your torch's version: pip install 'vgrpo[audio]' with the README's torch constraint"
    ) from None

from .._criteria import objective_score, score_tensors
from .detect import CRITERIA, DetectorParams, applicable, score_clip
from .world import SAMPLE_RATE, parse_prompt

if TYPE_CHECKING:
    from . import Config


class TonesReward:
    """Scores clips against tones-world prompts; ``score`` is the weighted mean of the applicable
    criteria (``objective="partial"``), their weighted product (``"product"``) or ``correct``."""

    modalities = frozenset({"audio"})

    def __init__(self, config: Config) -> None:
        self.config = config
        self.params = DetectorParams(
            rel_db=config.rel_db,
            floor_db=config.floor_db,
            click_max_s=config.click_max_s,
            sweep_octaves=config.sweep_octaves,
            tonal_share=config.tonal_share,
            max_tone_s=config.max_tone_s,
            max_events=config.max_events,
        )
        self.weights = config.weights.model_dump()

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> Mapping[str, torch.Tensor]:
        data = samples.data  # [B, channels, samples]
        if samples.modality != "audio" or data.ndim != 3:
            raise ValueError(f"tones reward expects audio [B, channels, samples], got {tuple(data.shape)}")
        if samples.sample_rate != SAMPLE_RATE:
            raise ValueError(
                f"tones reward expects {SAMPLE_RATE} Hz audio (the tones world's), got {samples.sample_rate}"
            )
        if len(prompts) != data.shape[0]:
            raise ValueError(f"{len(prompts)} prompts for {data.shape[0]} clips")
        rows = []
        for wave, prompt in zip(data.float().mean(1), prompts, strict=True):  # channels mixed to mono
            spec = parse_prompt(prompt)
            s = score_clip(wave, spec, self.params)
            applies = [c for c in CRITERIA if applicable(spec)[c]]
            s["score"] = objective_score(s, self.weights, applies, self.config.objective)
            rows.append(s)
        return score_tensors(rows, ("score", *CRITERIA, "correct"), data.device)  # [B] each
