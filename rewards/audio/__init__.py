"""Entry module of the audio rewards: options and registration only, no torch at import time.

- ``clap``: CLAP text-audio cosine similarity (transformers ``ClapModel`` + ``ClapProcessor``).
- ``loudness``: integrated loudness (ITU-R BS.1770, LUFS) via ``torchaudio.functional.loudness``, or minus
  its distance to a target.
- ``silence_ratio``: minus the fraction of short frames quieter than a threshold (penalises silent clips).
- ``spectral_flatness``: minus the mean spectral flatness (1 = white noise, ~0 = a pure tone), or minus its
  distance to a target. Signal-level rewards are cheap and verifiable; see docs/video-audio.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig

from .._options import ModelRewardConfig

AUDIO = frozenset({"audio"})


class ClapConfig(ModelRewardConfig):
    """Options of the ``clap`` reward."""

    modalities: ClassVar[frozenset[str]] = AUDIO

    model: str = Field(
        "laion/larger_clap_general", description="Hub id or local folder of a transformers ClapModel."
    )
    processor: str | None = Field(None, description="Hub id or folder of its ClapProcessor; null = model.")


class LoudnessConfig(PluginConfig):
    """Options of the ``loudness`` reward."""

    modalities: ClassVar[frozenset[str]] = AUDIO

    target_lufs: float | None = Field(
        -16.0,
        le=0.0,
        description="Desired integrated loudness in LUFS: -|LUFS - target| (in LU); null = LUFS itself.",
    )
    floor_lufs: float = Field(
        -70.0, le=0.0, description="Loudness given to silent clips (BS.1770's absolute gate is -70 LUFS)."
    )


class SilenceRatioConfig(PluginConfig):
    """Options of the ``silence_ratio`` reward."""

    modalities: ClassVar[frozenset[str]] = AUDIO

    threshold_db: float = Field(-40.0, le=0.0, description="A frame is silent below this RMS level in dBFS.")
    frame_ms: float = Field(20.0, gt=0, description="Frame length in milliseconds.")


class SpectralFlatnessConfig(PluginConfig):
    """Options of the ``spectral_flatness`` reward."""

    modalities: ClassVar[frozenset[str]] = AUDIO

    target: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Desired flatness in [0, 1]: score = -|flatness - target|; "
        "null = -flatness (tonal beats noise-like).",
    )
    n_fft: int = Field(1024, ge=16, description="FFT size of the power spectrogram.")


def build_loudness(config: LoudnessConfig, context: Any = None) -> Any:
    from .impl import LoudnessReward

    return LoudnessReward(target_lufs=config.target_lufs, floor_lufs=config.floor_lufs)


def build_silence_ratio(config: SilenceRatioConfig, context: Any = None) -> Any:
    from .impl import SilenceRatioReward

    return SilenceRatioReward(threshold_db=config.threshold_db, frame_ms=config.frame_ms)


def build_spectral_flatness(config: SpectralFlatnessConfig, context: Any = None) -> Any:
    from .impl import SpectralFlatnessReward

    return SpectralFlatnessReward(target=config.target, n_fft=config.n_fft)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "clap",
            "vgrpo_rewards.audio.impl:ClapReward",
            ClapConfig,
            summary="CLAP text-audio cosine similarity (prompt-aware).",
        ),
        Component(
            "reward",
            "loudness",
            build_loudness,
            LoudnessConfig,
            summary="Minus the distance of BS.1770 loudness to a target LUFS.",
        ),
        Component(
            "reward",
            "silence_ratio",
            build_silence_ratio,
            SilenceRatioConfig,
            summary="Minus the fraction of frames quieter than a dBFS threshold.",
        ),
        Component(
            "reward",
            "spectral_flatness",
            build_spectral_flatness,
            SpectralFlatnessConfig,
            summary="Minus the mean spectral flatness (or its distance to a target): penalises noise-like "
            "audio.",
        ),
    ]
