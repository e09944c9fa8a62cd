"""Audio rewards on synthetic signals with known answers, and CLAP on a tiny random ClapModel."""

from __future__ import annotations

import math
import os

import pytest
import torch
from tiny_clip import save_clap
from vgrpo_rewards import audio as audio_rewards
from vgrpo_rewards.audio.impl import LoudnessReward, SilenceRatioReward, SpectralFlatnessReward

from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import BuildContext, Samples

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RATE = 48000


def sine(amplitude: float, seconds: float = 1.0, freq: float = 997.0, rate: int = RATE) -> torch.Tensor:
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    return (amplitude * torch.sin(2 * math.pi * freq * t)).float()


def audio(*waves: torch.Tensor, rate: int = RATE) -> Samples:
    return Samples("audio", torch.stack(waves)[:, None], sample_rate=rate)  # [B, 1, N]


def test_loudness_of_a_sine_follows_bs1770() -> None:
    # BS.1770: a full-scale 997 Hz sine in one channel reads -3.01 LUFS; amplitude A adds 20 log10 A
    samples = audio(sine(1.0), sine(0.1), torch.zeros(RATE))
    lufs = LoudnessReward(target_lufs=None).score(samples, ["a"] * 3, [])
    assert lufs[0].item() == pytest.approx(-3.01, abs=0.05)
    assert (lufs[0] - lufs[1]).item() == pytest.approx(20.0, abs=0.02)  # exactly 20 dB for a 10x amplitude
    assert lufs[2].item() == -70.0  # silence: the floor, not -inf
    targeted = LoudnessReward(target_lufs=-23.0).score(samples, ["a"] * 3, [])
    torch.testing.assert_close(targeted, -(lufs + 23.0).abs())


def test_silence_ratio_counts_quiet_frames() -> None:
    half = torch.cat([sine(0.5, 0.5), torch.zeros(RATE // 2)])
    quiet = sine(0.001)  # -63 dBFS RMS: silent at the -40 dB threshold
    ratio = SilenceRatioReward(threshold_db=-40.0, frame_ms=20.0).score(
        audio(sine(0.5), half, quiet), ["a"] * 3, []
    )
    torch.testing.assert_close(ratio, torch.tensor([0.0, -0.5, -1.0]))


def test_spectral_flatness_separates_tones_from_white_noise() -> None:
    noise = torch.randn(RATE, generator=torch.Generator().manual_seed(0)) * 0.1
    flat = SpectralFlatnessReward(target=None).flatness(audio(sine(0.5), noise))
    assert flat[0] < 0.02
    # a periodogram of white noise is exponential per bin: geometric / arithmetic mean = exp(-Euler gamma)
    assert flat[1].item() == pytest.approx(math.exp(-0.5772), abs=0.05)


def test_registered_and_reject_non_audio() -> None:
    registry = collect_components(
        build_plugin_manager(load_entry_points=False, extra_plugins=[audio_rewards])
    )
    assert {"clap", "loudness", "silence_ratio", "spectral_flatness"} <= set(registry.names("reward"))
    reward = registry.build("reward", "silence_ratio", {}, BuildContext())
    with pytest.raises(ValueError, match="audio"):
        reward.score(Samples("image", torch.rand(1, 3, 4, 4)), ["a"], [])


def test_clap_scores_cosine_similarity_of_its_own_embeddings(tmp_path) -> None:
    from transformers import ClapModel, ClapProcessor

    try:
        save_clap(tmp_path)
    except Exception as exc:
        pytest.skip(f"tiny CLAP could not be built: {exc}")
    registry = collect_components(
        build_plugin_manager(load_entry_points=False, extra_plugins=[audio_rewards])
    )
    reward = registry.build("reward", "clap", {"model": str(tmp_path)}, BuildContext())
    waves = audio(sine(0.5, 0.5, rate=8000), sine(0.2, 0.5, freq=300, rate=8000), rate=8000)
    got = reward.score(waves, ["a dog", "rain"], [{}, {}])
    # reference: the processor and model by hand, resampled by torchaudio to the extractor's 16 kHz
    import torchaudio.functional as AF

    model, processor = ClapModel.from_pretrained(tmp_path).eval(), ClapProcessor.from_pretrained(tmp_path)
    mono = AF.resample(waves.data[:, 0], 8000, 16000)
    inputs = processor(
        text=["a dog", "rain"],
        audio=list(mono.numpy()),
        sampling_rate=16000,
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        text = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        sound = model.get_audio_features(input_features=inputs["input_features"])
    text = text if isinstance(text, torch.Tensor) else text.pooler_output
    sound = sound if isinstance(sound, torch.Tensor) else sound.pooler_output
    expected = torch.nn.functional.cosine_similarity(text, sound, dim=-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got.shape == (2,) and (got.abs() <= 1).all()


def test_without_torchaudio_building_an_audio_reward_is_one_line_naming_the_extra(monkeypatch) -> None:
    """torchaudio is the `audio` extra (the core install keeps the machine's torch): without it the audio
    rewards' module refuses to load with the install line, not a bare ImportError."""
    import importlib
    import sys

    from vgrpo_platform.errors import RewardError

    monkeypatch.setitem(sys.modules, "torchaudio", None)  # `import torchaudio` now raises ImportError
    monkeypatch.setitem(sys.modules, "torchaudio.functional", None)
    monkeypatch.delitem(sys.modules, "vgrpo_rewards.audio.impl")
    with pytest.raises(RewardError) as excinfo:
        importlib.import_module("vgrpo_rewards.audio.impl")
    message = str(excinfo.value)
    assert "\n" not in message and "need torchaudio" in message and "vgrpo[audio]" in message
