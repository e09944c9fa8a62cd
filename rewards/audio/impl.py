"""Audio rewards on ``[B, channels, samples]`` waveforms in ``[-1, 1]``: CLAP and signal-level scores."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

try:
    import torchaudio.functional as AF
except ImportError as exc:  # the `audio` extra: not in the core install, which keeps the machine's torch
    raise RewardError(
        f"the audio rewards need torchaudio, which failed to import ({exc}); install the torchaudio "
        "of your torch's version: pip install 'vgrpo[audio]' with the README's torch constraint"
    ) from None

from .._target import toward_target

HEADROOM = 0.5
"""Gain applied before BS.1770 filtering (see ``LoudnessReward.lufs``)."""


def _waves(samples: Samples) -> tuple[torch.Tensor, int]:
    """``(float32 [B, C, N], sample_rate)``, or a clear error."""
    if samples.modality != "audio" or samples.data.ndim != 3 or not samples.sample_rate:
        raise ValueError(
            f"audio rewards need audio samples [B, C, N] with a sample_rate, got {samples.modality} "
            f"{tuple(samples.data.shape)} at {samples.sample_rate}"
        )
    return samples.data.float(), int(samples.sample_rate)


class LoudnessReward:
    """BS.1770 integrated loudness (LUFS), or ``-|LUFS - target|``; silent clips get ``floor_lufs``."""

    modalities = frozenset({"audio"})

    def __init__(self, target_lufs: float | None = -16.0, floor_lufs: float = -70.0) -> None:
        self.target_lufs = target_lufs
        self.floor_lufs = floor_lufs

    def lufs(self, samples: Samples) -> torch.Tensor:
        waves, rate = _waves(samples)
        if waves.shape[-1] < round(0.4 * rate):
            raise ValueError("loudness needs clips of at least 0.4 s (one BS.1770 gating block)")
        # torchaudio's K-weighting filters clamp their output to [-1, 1], which reads near-full-scale audio
        # too quiet (a 0 dBFS sine: -3.28 instead of -3.01 LUFS); loudness is scale-equivariant, so measure
        # 6 dB down, where the +4 dB high shelf cannot clip, and add the 6 dB back
        values = AF.loudness(waves * HEADROOM, rate) - 20 * math.log10(HEADROOM)  # [B]
        values = torch.where(torch.isfinite(values), values, torch.full_like(values, self.floor_lufs))
        return values.clamp(min=self.floor_lufs)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        return toward_target(self.lufs(samples), self.target_lufs)


class SilenceRatioReward:
    """``-`` the fraction of ``frame_ms`` frames (channels mixed) whose RMS is below ``threshold_db`` dBFS."""

    modalities = frozenset({"audio"})

    def __init__(self, threshold_db: float = -40.0, frame_ms: float = 20.0) -> None:
        self.threshold_db = threshold_db
        self.frame_ms = frame_ms

    def ratio(self, samples: Samples) -> torch.Tensor:
        waves, rate = _waves(samples)
        mono = waves.mean(1)  # [B, N]
        size = max(1, round(self.frame_ms * rate / 1000))
        frames = mono[:, : mono.shape[1] // size * size].reshape(mono.shape[0], -1, size)  # [B, n, size]
        rms_db = 10 * torch.log10(frames.square().mean(-1).clamp(min=1e-12))  # [B, n]
        return (rms_db < self.threshold_db).float().mean(1)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        return -self.ratio(samples)


class SpectralFlatnessReward:
    """Mean over frames of (geometric mean / arithmetic mean) of the power spectrum; scored as its negative
    or minus its distance to ``target``."""

    modalities = frozenset({"audio"})

    def __init__(self, target: float | None = None, n_fft: int = 1024, eps: float = 1e-10) -> None:
        self.target = target
        self.n_fft = n_fft
        self.eps = eps

    def flatness(self, samples: Samples) -> torch.Tensor:
        from torchaudio.transforms import Spectrogram

        waves, _ = _waves(samples)
        n_fft = min(self.n_fft, waves.shape[-1])
        power = Spectrogram(n_fft=n_fft, power=2.0).to(waves.device)(waves.mean(1)) + self.eps  # [B, F, n]
        flat = power.log().mean(1).exp() / power.mean(1)  # [B, n]
        return flat.mean(1)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        flat = self.flatness(samples)
        return -flat if self.target is None else -(flat - self.target).abs()


class ClapReward:
    """Cosine similarity of CLAP's text and audio embeddings (mono, resampled to the processor's rate)."""

    modalities = frozenset({"audio"})

    def __init__(self, config: Any, context: Any = None) -> None:
        from transformers import ClapModel, ClapProcessor

        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        device = torch.device(getattr(context, "device", "cpu") or "cpu")
        dtype = dtypes[config.dtype] if config.dtype else (getattr(context, "dtype", None) or torch.float32)
        self.processor = ClapProcessor.from_pretrained(config.processor or config.model)
        self.model = (
            ClapModel.from_pretrained(config.model, dtype=dtype).to(device).eval().requires_grad_(False)
        )
        self.device, self.dtype, self.batch_size = device, dtype, config.batch_size
        self.rate = int(self.processor.feature_extractor.sampling_rate)

    @torch.no_grad()
    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        waves, rate = _waves(samples)
        mono = waves.mean(1)  # [B, N]
        if rate != self.rate:
            mono = AF.resample(mono, rate, self.rate)
        scores = []
        for start in range(0, len(mono), self.batch_size):
            part = mono[start : start + self.batch_size].cpu().numpy()
            inputs = self.processor(
                text=list(prompts[start : start + self.batch_size]),
                audio=list(part),
                sampling_rate=self.rate,
                return_tensors="pt",
                padding=True,
            )
            inputs = {
                k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device))
                for k, v in inputs.items()
            }
            text = self.model.get_text_features(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
            )
            audio_kw = {k: inputs[k] for k in ("input_features", "is_longer") if k in inputs}
            audio = self.model.get_audio_features(**audio_kw)
            text, audio = _tensor(text), _tensor(audio)
            scores.append(torch.nn.functional.cosine_similarity(text.float(), audio.float(), dim=-1))
        return torch.cat(scores).to(samples.data.device)


def _tensor(out: Any) -> torch.Tensor:
    """transformers 5 may return a model output instead of the pooled tensor."""
    if isinstance(out, torch.Tensor):
        return out
    return out.pooler_output
