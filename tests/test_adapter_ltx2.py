"""The ``ltx2`` adapter on a tiny LTX2Pipeline built from configs, saved, and loaded through the real
``from_pretrained`` path; and the video ``Samples`` that carry their soundtrack.

Independent references: diffusers' own ``LTX2Pipeline.__call__`` (rollouts of both latents, decoded frames
and waveform, with and without CFG per modality), a direct call of the transformer as the pipeline makes
it (velocity at arbitrary ``(z_t, t)``), the scheduler's dynamic shift, and a freshly loaded pipeline with
``load_lora_weights`` (export). The reward side: an audio reward scores a video's soundtrack exactly as it
scores the same waveforms handed to it as audio.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from functools import partial
from pathlib import Path

import adapter_checks as checks
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline
from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift
from diffusers.utils import logging as diffusers_logging
from tiny_ltx2 import (
    AUDIO_LATENT,
    FLAT_LATENT,
    LTX2_FPS,
    LTX2_FRAMES,
    LTX2_SIDE,
    LTX2_TOKENS,
    VIDEO_LATENT,
    build_tiny_ltx2,
)
from vgrpo_adapters import ltx2 as ltx2_entry
from vgrpo_adapters.ltx2 import LTX2AdapterConfig
from vgrpo_adapters.ltx2.impl import LTX2Adapter
from vgrpo_rewards import audio as audio_rewards
from vgrpo_rewards import toy as toy_rewards
from vgrpo_rewards import video as video_rewards

from vgrpo_platform import finetune
from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import BuildContext, SamplerSpec, Samples
from vgrpo_platform.testing.adapter_kit import check_samples
from vgrpo_platform.training.iteration.scoring import WeightedReward, score_all
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()
diffusers_logging.set_verbosity_error()  # the pipeline warns that packed latents hide their shape

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "ltx2_clap_pickscore.toml"
PROMPTS = ["a red cat", "a blue dog on a hill", "a red cat"]
QUIET_GUIDANCE = dict(  # the pipeline's extra guidance terms, which the adapter does not reproduce, off
    stg_scale=0.0,
    modality_scale=1.0,
    guidance_rescale=0.0,
    audio_stg_scale=0.0,
    audio_modality_scale=1.0,
    audio_guidance_rescale=0.0,
)


def config(model: Path, **options) -> LTX2AdapterConfig:
    return LTX2AdapterConfig(
        model=str(model),
        resolution=LTX2_SIDE,
        num_frames=LTX2_FRAMES,
        fps=LTX2_FPS,
        max_sequence_length=LTX2_TOKENS,
        **options,
    )


TINY_PIPELINE, ADAPTER = build_tiny_ltx2, LTX2Adapter  # the conftest's fixtures build these
noise = partial(checks.seeded_noise, FLAT_LATENT)


def pipeline_inputs(adapter: LTX2Adapter, z: torch.Tensor) -> dict[str, torch.Tensor]:
    """The flat noise as the pipeline takes it: packed video tokens, and audio tokens in the audio VAE's
    raw scale (the pipeline normalises the audio latents it is given, never the video ones it gets packed)."""
    video, audio = adapter.split(z)
    stats = adapter.pipe.audio_vae
    audio = LTX2Pipeline._pack_audio_latents(audio) * stats.latents_std + stats.latents_mean
    return {"latents": LTX2Pipeline._pack_latents(video, 1, 1), "audio_latents": audio}


def pipeline_call(model: Path, prompt: str, z_inputs: dict, steps: int, **options):
    """``LTX2Pipeline.__call__`` with its scheduler rebuilt without the terminal stretch (the adapter uses
    the static shift ``e^mu`` alone, see the shift test)."""
    pipe = LTX2Pipeline.from_pretrained(model)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, shift_terminal=None)
    return pipe(
        prompt,
        height=LTX2_SIDE,
        width=LTX2_SIDE,
        num_frames=LTX2_FRAMES,
        frame_rate=LTX2_FPS,
        num_inference_steps=steps,
        max_sequence_length=LTX2_TOKENS,
        **z_inputs,
        **QUIET_GUIDANCE,
        **options,
    )


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(ltx2_entry, "ltx2", config(model_dir), LTX2Adapter)
    checks.assert_invalid(
        LTX2AdapterConfig,
        {"num_frames": 6},  # not 4k + 1
        {"audio_cfg_scale": 0.5},
        {"cfg_in_training": True},  # without any CFG scale above 1
        {"unknown": 1},
    )


def test_the_sample_is_both_latents_in_one_flat_vector(adapter) -> None:
    assert adapter.video_shape == VIDEO_LATENT and adapter.audio_shape == AUDIO_LATENT
    assert adapter.latent_shape() == FLAT_LATENT == (math.prod(VIDEO_LATENT) + math.prod(AUDIO_LATENT),)
    z = noise(2)
    video, audio = adapter.split(z)
    assert video.shape == (2, *VIDEO_LATENT) and audio.shape == (2, *AUDIO_LATENT)
    assert torch.equal(adapter.join(video, audio), z)
    assert torch.equal(video[1].flatten(), z[1, : video[1].numel()])  # video first, then audio, per sample
    assert torch.equal(audio[0].flatten(), z[0, video[0].numel() :])
    cond = adapter.encode_prompts(PROMPTS)
    assert set(cond) == {"video_text", "audio_text", "text_mask"}
    assert cond["video_text"].shape[:2] == (3, LTX2_TOKENS) and cond["text_mask"].shape == (3, LTX2_TOKENS)
    torch.testing.assert_close(cond["video_text"][0], cond["video_text"][2])
    frozen = [adapter.pipe.connectors, adapter.pipe.audio_vae, adapter.pipe.vocoder]
    assert all(not p.requires_grad for module in frozen for p in module.parameters())
    checks.assert_frozen_text_encoders_and_vae(adapter)


def test_velocity_at_any_point_is_the_transformers_two_predictions_joined(adapter) -> None:
    """``predict(z, t)`` is the transformer's video and audio velocities at ``timestep = sigma = 1000 t``,
    called with the pipeline's own packing and position ids, unpacked and joined, at arbitrary points."""
    z, t = noise(2, seed=2), torch.tensor([0.137, 0.861])
    cond = adapter.encode_prompts(PROMPTS[:2])
    pipe, (_, f, h, w) = adapter.pipe, VIDEO_LATENT
    inputs = pipeline_inputs(adapter, z)
    audio = LTX2Pipeline._pack_audio_latents(adapter.split(z)[1])
    with torch.no_grad():
        video_v, audio_v = pipe.transformer(
            hidden_states=inputs["latents"],
            audio_hidden_states=audio,
            encoder_hidden_states=cond["video_text"],
            audio_encoder_hidden_states=cond["audio_text"],
            timestep=1000 * t,
            sigma=1000 * t,
            encoder_attention_mask=cond["text_mask"],
            audio_encoder_attention_mask=cond["text_mask"],
            video_coords=pipe.transformer.rope.prepare_video_coords(2, f, h, w, z.device, fps=LTX2_FPS),
            audio_coords=pipe.transformer.audio_rope.prepare_audio_coords(2, AUDIO_LATENT[1], z.device),
            use_cross_timestep=True,
            return_dict=False,
        )
        expected = adapter.join(
            LTX2Pipeline._unpack_latents(video_v, f, h, w),
            LTX2Pipeline._unpack_audio_latents(audio_v, AUDIO_LATENT[1], num_mel_bins=AUDIO_LATENT[2]),
        )
        torch.testing.assert_close(adapter.predict(z, t, cond), expected)


def test_dynamic_shift_is_the_static_shift_without_the_terminal_stretch(adapter, model_dir) -> None:
    cfg = adapter.pipe.scheduler.config
    assert cfg.shift_terminal == 0.1 and cfg.base_shift == 0.95  # the LTX family's scheduler
    tokens = VIDEO_LATENT[1] * VIDEO_LATENT[2] * VIDEO_LATENT[3]
    mu = calculate_shift(tokens, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift)
    assert adapter.schedule.shift == pytest.approx(math.exp(mu))
    plain = FlowMatchEulerDiscreteScheduler.from_config(cfg, shift_terminal=None)
    grid = torch.linspace(1.0, 1 / 6, 6)
    plain.set_timesteps(sigmas=grid.tolist(), mu=mu)
    torch.testing.assert_close(plain.sigmas[:-1], adapter.schedule.warp(grid), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("scales", [(1.0, None), (2.0, 3.0)], ids=["no-cfg", "cfg-per-modality"])
def test_rollout_and_decode_equal_the_diffusers_pipeline(model_dir, scales) -> None:
    """From the same noise, the adapter's Euler rollout equals ``LTX2Pipeline.__call__``'s, video and audio
    latents alike, and so do the decoded frames and the vocoder's waveform (atol 1e-5). With CFG, the
    video is guided with ``cfg_scale`` and the audio with ``audio_cfg_scale``, as the pipeline's
    ``guidance_scale`` and ``audio_guidance_scale``."""
    video_scale, audio_scale = scales
    adapter = LTX2Adapter.from_config(
        config(model_dir, cfg_scale=video_scale, audio_cfg_scale=audio_scale), BuildContext()
    )
    z = noise(1, seed=3)
    latents = adapter.sample(z, adapter.encode_prompts(["a red cat"]), SamplerSpec("euler", 3))
    samples = adapter.decode(latents)
    guidance = dict(guidance_scale=video_scale, audio_guidance_scale=audio_scale or video_scale)
    call = partial(pipeline_call, model_dir, "a red cat", pipeline_inputs(adapter, z), 3, **guidance)
    raw = call(output_type="latent")  # the pipeline's denormalised latents
    video, audio = adapter.split(latents)
    vae, audio_vae = adapter.vae, adapter.pipe.audio_vae
    expected_video = LTX2Pipeline._normalize_latents(
        raw.frames, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
    )
    packed = LTX2Pipeline._pack_audio_latents(raw.audio)
    expected_audio = LTX2Pipeline._normalize_audio_latents(
        packed, audio_vae.latents_mean, audio_vae.latents_std
    )
    torch.testing.assert_close(video, expected_video, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(LTX2Pipeline._pack_audio_latents(audio), expected_audio, atol=1e-5, rtol=1e-5)
    decoded = call(output_type="pt")
    torch.testing.assert_close(samples.data, decoded.frames, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(samples.audio, decoded.audio, atol=1e-5, rtol=1e-5)
    assert samples.modality == "video" and samples.fps == LTX2_FPS
    assert samples.sample_rate == adapter.pipe.vocoder.config.output_sampling_rate
    if video_scale > 1:  # guidance changes both latents
        plain = LTX2Adapter.from_config(config(model_dir), BuildContext())
        other = plain.sample(z, plain.encode_prompts(["a red cat"]), SamplerSpec("euler", 3))
        assert all(
            (a - b).abs().max() > 1e-4 for a, b in zip(plain.split(other), (video, audio), strict=True)
        )


def test_cfg_in_training_guides_each_modality_with_its_own_scale(model_dir) -> None:
    plain = LTX2Adapter.from_config(config(model_dir), BuildContext())
    trained = LTX2Adapter.from_config(
        config(model_dir, cfg_scale=2.0, audio_cfg_scale=4.0, cfg_in_training=True), BuildContext()
    )
    z, t = noise(2, seed=4), torch.tensor([0.3, 0.9])
    cond, null = plain.encode_prompts(PROMPTS[:2]), plain.encode_prompts(["", ""])
    with torch.no_grad():
        (vc, ac), (vn, an) = plain.split(plain.predict(z, t, cond)), plain.split(plain.predict(z, t, null))
        expected = plain.join(vn + 2.0 * (vc - vn), an + 4.0 * (ac - an))
        torch.testing.assert_close(trained.predict(z, t, cond), expected, atol=1e-5, rtol=1e-5)
    trained.predict(z, t, cond).square().mean().backward()
    assert trained.denoiser.proj_out.weight.grad.abs().sum() > 0
    assert trained.denoiser.audio_proj_out.weight.grad.abs().sum() > 0


def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir) -> None:
    checks.assert_micro_batch_equals_single_rows(LTX2Adapter, config(model_dir), checks.MIXED_LENGTH_PROMPTS)


def test_audio_rewards_score_the_soundtrack_and_video_rewards_the_frames(adapter) -> None:
    """Scoring a decoded clip: ``loudness`` (audio) sees exactly the soundtrack, ``temporal_consistency``
    (video) the frames; a batch split and joined again keeps each soundtrack with its clip."""
    samples = adapter.decode(
        adapter.sample(noise(3), adapter.encode_prompts(PROMPTS), SamplerSpec("euler", 2))
    )
    assert samples.audio.shape[:2] == (3, 2) and samples.modalities == {"video", "audio"}
    registry = checks.registry_of(audio_rewards, video_rewards)
    loudness = registry.build("reward", "loudness", {}, BuildContext())
    consistency = registry.build("reward", "temporal_consistency", {}, BuildContext())
    rewards = [WeightedReward("loudness", loudness, 1.0), WeightedReward("temporal", consistency, 1.0)]
    terms, _ = score_all(rewards, samples, PROMPTS)
    alone = Samples("audio", samples.audio, sample_rate=samples.sample_rate)
    torch.testing.assert_close(terms["loudness"], torch.as_tensor(loudness.score(alone, PROMPTS, [{}] * 3)))
    frames_only = Samples("video", samples.data, fps=samples.fps)
    torch.testing.assert_close(
        terms["temporal"], torch.as_tensor(consistency.score(frames_only, PROMPTS, [{}] * 3))
    )
    joined = Samples.concat([samples.select(slice(0, 1)), samples.select(slice(1, 3))])
    assert torch.equal(joined.audio, samples.audio) and torch.equal(joined.data, samples.data)
    assert Samples("image", samples.data[:, 0]).for_modalities({"audio"}) is None
    check_samples(samples, batch=3)  # the conformance kit checks the soundtrack too
    with pytest.raises(AssertionError, match="audio must be finite and lie in"):
        check_samples(replace(samples, audio=samples.audio * 0 + 2))


def test_check_accepts_audio_and_video_rewards_and_refuses_others() -> None:
    from vgrpo_rewards import vlm_judge

    registry = checks.registry_of(ltx2_entry, surrogates_plugin, audio_rewards, video_rewards, vlm_judge)
    resolve_recipe(RECIPE, ['rewards=[{name="loudness"}, {name="motion"}]'], registry=registry)
    judge = 'rewards=[{name="vlm_judge", options={model="m", base_url="http://127.0.0.1:1/v1"}}]'
    with pytest.raises(RecipeError, match="reward 'vlm_judge' scores image but adapter 'ltx2' makes video"):
        resolve_recipe(RECIPE, [judge], registry=registry)


def test_lora_targets_are_the_28_linear_layers_of_every_block(model_dir) -> None:
    adapter = LTX2Adapter.from_config(config(model_dir), BuildContext())
    assert len(adapter.lora_target_modules) == 28
    finetune.attach_lora(adapter.denoiser, rank=2, alpha=2, target_modules=adapter.lora_target_modules)
    wrapped = {n for n, m in adapter.denoiser.named_modules() if hasattr(m, "lora_A")}
    blocks = len(adapter.denoiser.transformer_blocks)
    assert len(wrapped) == 28 * blocks and all(n.startswith("transformer_blocks.") for n in wrapped)


def test_lora_export_loads_into_a_fresh_pipeline_with_the_same_predictions(model_dir, tmp_path) -> None:
    adapter = LTX2Adapter.from_config(config(model_dir), BuildContext())
    checks.attach_trained_lora(adapter)
    checks.export_lora(adapter, tmp_path / "final")
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    cond = adapter.encode_prompts(PROMPTS[:2])
    fresh = LTX2Adapter(
        LTX2Pipeline.from_pretrained(model_dir), **LTX2Adapter.options_from_config(config(model_dir))
    )
    load = partial(fresh.pipe.load_lora_weights, tmp_path / "final")
    checks.assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5)


def test_full_finetune_export_is_a_transformer_folder(model_dir, tmp_path) -> None:
    checks.assert_full_export_reloads(LTX2Adapter, config(model_dir), tmp_path / "final")


def test_recipe_runs_two_iterations_end_to_end_and_exports_a_loadable_lora(model_dir, tmp_path) -> None:
    """The shipped recipe (LoRA r64 / a128, gradient checkpointing, global std, normalise-then-sum) with
    the tiny weights and a video and an audio reward substituted by ``--set``-style overrides; the
    exported LoRA reproduces the trained predictions and ``vgrpo sample`` writes each clip's soundtrack."""
    from vgrpo_platform.cli.sample import sample_to_folder

    registry = checks.registry_of(ltx2_entry, toy_rewards, audio_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path, f"adapter.options.resolution={LTX2_SIDE}"),
        f"adapter.options.num_frames={LTX2_FRAMES}",
        f"adapter.options.fps={LTX2_FPS}",
        f"adapter.options.max_sequence_length={LTX2_TOKENS}",
        'rewards.1={name="loudness"}',
        *checks.two_iterations(micro_batch_size=2),
        "train.warmup_steps=0",
        "eval.max_prompts=1",
        "eval.every=0",
    ]
    resolved = resolve_recipe(RECIPE, overrides, registry=registry)
    r = resolved.recipe
    assert (r.train.lora_alpha, r.grpo.std, r.train.gradient_checkpointing) == (128, "global", True)
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    records = checks.assert_trained(run_dir, 2)
    assert {"reward/brightness", "reward/loudness"} <= set(records[0])
    z, t = noise(2, seed=7), torch.tensor([0.5, 0.7])
    options = resolved.adapter.config
    checks.assert_run_export_reloads(
        trainer.session.adapter, LTX2Pipeline, model_dir, options, run_dir, PROMPTS[:2], z, t
    )
    files = sample_to_folder(
        resolved, out_dir=tmp_path / "samples", checkpoint=run_dir, prompts=["a red cat"]
    )
    assert files[0].suffix == ".mp4" and files[0].with_suffix(".wav").exists()
    assert (tmp_path / "samples" / "grid.png").is_file()  # the clip as a filmstrip
    # beside each evaluation's grid: its prompt's first clip and soundtrack, to play
    assert sorted(p.name for p in (run_dir / "samples" / "eval_000002").iterdir()) == ["0_0.mp4", "0_0.wav"]


def test_shipped_recipe_passes_check_with_the_real_reward_plugins() -> None:
    registry = checks.registry_of(
        ltx2_entry, surrogates_plugin, audio_rewards, video_rewards, checks.reward_plugin_or_skip("pickscore")
    )
    resolved = resolve_recipe(RECIPE, registry=registry)
    r, options = resolved.recipe, resolved.adapter.config
    # Flow-Factory's LTX-2 t2av GRPO LoRA: 512 x 768, 121 frames at 24 fps, 24 steps, guidance 1, 16 per group
    assert (options.height, options.width, options.num_frames, options.fps) == (512, 768, 121, 24.0)
    assert (r.rollout.steps, options.cfg_scale, r.rollout.group_size, r.grpo.std) == (24, 1.0, 16, "global")
    assert (r.train.lora_rank, r.train.lora_alpha, r.train.lr, r.train.grad_clip) == (64, 128, 3e-4, 1.0)
    assert [w.name for w in r.rewards] == ["clap", "framewise"] and options.offload_text_encoders


@pytest.mark.gpu
def test_real_ltx2_on_cuda() -> None:
    """LTX-2 (or VGRPO_LTX2_MODEL) at 256 x 384 px, 25 frames: a LoRA rollout of both latents decodes to a
    clip with sound, and a gradient reaches the LoRA."""
    model = os.environ.get("VGRPO_LTX2_MODEL", "Lightricks/LTX-2")
    adapter = checks.cuda_adapter_or_skip(
        LTX2Adapter,
        LTX2AdapterConfig(model=model, height=256, width=384, num_frames=25, offload_text_encoders=True),
    )
    finetune.attach_lora(adapter.denoiser, rank=8, alpha=16, target_modules=adapter.lora_target_modules)
    cond = adapter.encode_prompts(["a dog barking in a park"])
    z = torch.randn(1, *adapter.latent_shape(), device="cuda")
    samples = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 8)))
    assert samples.data.shape == (1, 25, 3, 256, 384) and samples.audio is not None
    adapter.predict(z, torch.tensor([0.5], device="cuda"), cond).float().square().mean().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in adapter.denoiser.parameters())
