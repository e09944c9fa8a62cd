"""The ``longcat_audio`` adapter on a tiny LongCatAudioDiTPipeline built from configs, saved, loaded by path.

Independent references: diffusers' ``LongCatAudioDiTPipeline.__call__`` (rollouts, which run time the
other way round), soundfile reading back the WAV that ``write_samples`` writes, and a short V-GRPO run.
"""

from __future__ import annotations

import json
import math
import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import pytest
import torch
from diffusers import LongCatAudioDiTPipeline
from diffusers.utils import logging as diffusers_logging
from tiny_pipelines import AUDIO_HOP, AUDIO_LATENT_DIM, AUDIO_RATE, AUDIO_TOKENS, build_tiny_longcat
from vgrpo_adapters import audio as audio_entry
from vgrpo_adapters.audio import LongCatAudioConfig
from vgrpo_adapters.audio.impl import LongCatAudioAdapter
from vgrpo_rewards import audio as audio_rewards

from vgrpo_platform import media
from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.cli.sample import write_samples
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import BuildContext, SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RATE, HOP, LATENT_DIM, TOKENS, SECONDS = AUDIO_RATE, AUDIO_HOP, AUDIO_LATENT_DIM, AUDIO_TOKENS, 0.5
LATENT = (LATENT_DIM, int(SECONDS * RATE // HOP))  # [8, 62]
LONG_PROMPT = "a dog barking loudly in a large empty hall"  # longer than TOKENS: both sides truncate


def config(model: Path, **options) -> LongCatAudioConfig:
    return LongCatAudioConfig(model=str(model), duration_s=SECONDS, max_sequence_length=TOKENS, **options)


def run_overrides(model: Path, tmp_path: Path, target_lufs: float, *run: str) -> list[str]:
    """A CPU run of the tiny pipeline toward one loudness target."""
    return [
        f'adapter.options.model="{model}"',
        f"adapter.options.duration_s={SECONDS}",
        f"adapter.options.max_sequence_length={TOKENS}",
        f'rewards=[{{name="loudness", options={{target_lufs={target_lufs}}}}}]',
        *checks.cpu_run(tmp_path, *run),
    ]


TINY_PIPELINE, ADAPTER = build_tiny_longcat, LongCatAudioAdapter  # the conftest's fixtures build these
noise = partial(checks.seeded_noise, LATENT)


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    built = checks.assert_registered(audio_entry, "longcat_audio", config(model_dir), LongCatAudioAdapter)
    assert built.modality == "audio"


def test_shapes_and_audio_samples(adapter) -> None:
    assert adapter.latent_shape() == LATENT and adapter.schedule.shift == 1.0
    cond = adapter.encode_prompts(["rain", "a dog barking"])
    assert cond["prompt_embeds"].shape == (2, TOKENS, 32) and cond["prompt_lengths"].tolist()[0] < TOKENS
    z = noise(2)
    assert adapter.predict(z, torch.rand(2), cond).shape == z.shape
    samples = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 2)))
    assert samples.modality == "audio" and samples.sample_rate == RATE
    assert samples.data.shape == (2, 1, LATENT[1] * HOP) and samples.data.abs().max() <= 1


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_rollout_equals_the_diffusers_pipeline(model_dir, cfg_scale) -> None:
    adapter = LongCatAudioAdapter.from_config(config(model_dir, cfg_scale=cfg_scale), BuildContext())
    z = noise(1, seed=2)
    wave = adapter.decode(
        adapter.sample(z, adapter.encode_prompts([LONG_PROMPT]), SamplerSpec("euler", 3))
    ).data
    pipe = LongCatAudioDiTPipeline.from_pretrained(model_dir)
    reference = pipe(
        LONG_PROMPT,
        latents=z.transpose(1, 2),
        num_inference_steps=3,
        guidance_scale=cfg_scale,
        output_type="pt",
    ).audios  # [1, 1, N]
    assert reference.std() > 1e-4
    torch.testing.assert_close(wave, reference.clamp(-1, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cfg", [{}, {"cfg_scale": 2.0, "cfg_in_training": True}], ids=["plain", "cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    checks.assert_micro_batch_equals_single_rows(
        ADAPTER, config(model_dir, **cfg), checks.MIXED_LENGTH_PROMPTS
    )


def test_decoded_audio_is_written_as_wav_that_reads_back(adapter, tmp_path) -> None:
    samples = adapter.decode(noise(2, seed=3))
    paths = write_samples(samples, tmp_path, ["a", "b"])
    assert [p.suffix for p in paths] == [".wav", ".wav"]
    wave, rate = media.read_audio(paths[1])
    assert rate == RATE and wave.shape == (1, LATENT[1] * HOP)
    assert (wave - samples.data[1]).abs().max() < 1e-4  # 16-bit PCM


def test_recipe_runs_v_grpo_iterations_and_exports_a_lora(model_dir, tmp_path) -> None:
    registry = checks.registry_of(audio_entry, audio_rewards, surrogates_plugin)
    overrides = [
        *run_overrides(model_dir, tmp_path, -10.0),
        *checks.lora_iterations(3, group_size=4, steps=2, micro_batch_size=8, lr="3e-2"),
        "eval.every=0",
    ]
    resolved = resolve_recipe(RECIPES / "audio_clap.toml", overrides, registry=registry)
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    records = checks.assert_trained(run_dir, 3)
    assert all(math.isfinite(rec["reward"]) for rec in records)
    adapter = trainer.session.adapter
    checks.assert_lora_moved(adapter)
    # the pipeline (and its transformer) has no diffusers LoRA loader: peft loads the export, as documented
    final, lora = run_dir / "final", resolved.recipe.train
    fresh = checks.adapter_from_config(LongCatAudioAdapter, config(model_dir, cfg_scale=1.0))

    def load() -> None:
        from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
        from safetensors.torch import load_file

        config = json.loads((final / "transformer_lora_config.json").read_text())
        assert (config["r"], config["lora_alpha"]) == (lora.lora_rank, lora.lora_alpha)  # nothing guessed
        inject_adapter_in_model(LoraConfig(**config), fresh.denoiser)
        loaded = set_peft_model_state_dict(fresh.denoiser, load_file(final / "transformer_lora.safetensors"))
        assert not loaded.unexpected_keys

    z, t = noise(2, seed=5), torch.tensor([0.3, 0.8])
    cond = adapter.encode_prompts(["a dog barking", "rain"])
    checks.assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5)


def test_shipped_recipe_passes_check_with_the_audio_rewards() -> None:
    resolved = resolve_recipe(
        RECIPES / "audio_clap.toml",
        registry=checks.registry_of(audio_entry, audio_rewards, surrogates_plugin),
    )
    assert (
        resolved.recipe.adapter.name == "longcat_audio" and not resolved.recipe.train.gradient_checkpointing
    )
    assert [r.key for r in resolved.rewards] == ["clap", "silence_ratio", "loudness"]


def test_v_grpo_moves_the_held_out_loudness_toward_its_target(model_dir, tmp_path) -> None:
    """The tiny VAE's loudness follows the latent scale (about -17 LUFS at 0.25x, -7 at 1x), so a few
    V-GRPO steps toward -20 LUFS must make the held-out clips (same eval seeds) quieter.
    Measured eval reward at 0 -> 4 (run seeds 0/1/2): -13.17 -> -12.48 / -11.41 / -11.35."""
    registry = checks.registry_of(audio_entry, audio_rewards, surrogates_plugin)
    overrides = [
        *run_overrides(model_dir, tmp_path, -20.0, "run.seed=0"),
        *checks.learning_run(4),
    ]
    run_dir = Trainer(resolve_recipe(RECIPES / "audio_clap.toml", overrides, registry=registry)).run()
    checks.assert_eval_gain(run_dir, 4, margin=0.3)  # in LU; the smallest measured gain was 0.68
