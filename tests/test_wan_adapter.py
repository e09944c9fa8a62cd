"""The ``wan`` adapter on a tiny WanPipeline built from configs, saved, and loaded by path.

Independent references: diffusers' ``WanPipeline.__call__`` (the rollout), decord reading back the mp4
that ``write_samples`` writes, and a short V-GRPO run.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from diffusers import WanPipeline
from diffusers.utils import logging as diffusers_logging
from tiny_pipelines import WAN_FRAMES, WAN_SIDE, WAN_TOKENS, build_tiny_wan
from vgrpo_adapters import wan as wan_entry
from vgrpo_adapters.wan import WanAdapterConfig
from vgrpo_adapters.wan.impl import WanAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform import media
from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.cli.sample import write_samples
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
SIDE, FRAMES, TOKENS = WAN_SIDE, WAN_FRAMES, WAN_TOKENS
LATENT = (4, 2, SIDE // 8, SIDE // 8)  # z_dim 4, (5 - 1) / 4 + 1 latent frames, 8x spatial


def wan_options(model: Path) -> list[str]:
    """The recipe overrides that point a run at the tiny pipeline, with its brightness reward."""
    return [
        f'adapter.options.model="{model}"',
        f"adapter.options.resolution={SIDE}",
        f"adapter.options.num_frames={FRAMES}",
        f"adapter.options.max_sequence_length={TOKENS}",
        'rewards=[{name="brightness"}]',
    ]


def config(model: Path, **options) -> WanAdapterConfig:
    return WanAdapterConfig(
        model=str(model), resolution=SIDE, num_frames=FRAMES, max_sequence_length=TOKENS, **options
    )


TINY_PIPELINE, ADAPTER = build_tiny_wan, WanAdapter  # the conftest's model_dir and adapter fixtures
noise = partial(checks.seeded_noise, LATENT)


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    built = checks.assert_registered(wan_entry, "wan", config(model_dir), WanAdapter)
    assert built.modality == "video"
    with pytest.raises(ValueError, match="4k"):
        WanAdapterConfig(num_frames=6)


def test_shapes_shift_and_video_samples(adapter) -> None:
    assert adapter.latent_shape() == LATENT and adapter.schedule.shift == 3.0
    cond = adapter.encode_prompts(["a red cat", "a blue dog"])
    assert cond["prompt_embeds"].shape == (2, TOKENS, 32)
    z = noise(2)
    assert adapter.predict(z, torch.rand(2), cond).shape == z.shape
    samples = adapter.decode(adapter.sample(z, cond, SamplerSpec("unipc", 2)))
    assert samples.modality == "video" and samples.fps == 16.0
    assert (
        samples.data.shape == (2, FRAMES, 3, SIDE, SIDE)
        and 0 <= samples.data.min() <= samples.data.max() <= 1
    )


def test_rollout_equals_the_diffusers_pipeline(adapter, model_dir) -> None:
    z = noise(1, seed=2)
    clip = adapter.decode(
        adapter.sample(z, adapter.encode_prompts(["a red cat"]), SamplerSpec("euler", 3))
    ).data
    pipe = WanPipeline.from_pretrained(model_dir)
    pipe.scheduler.set_timesteps = _with_sigmas(pipe.scheduler.set_timesteps, np.linspace(1.0, 1 / 3, 3))
    reference = checks.pipeline_output(
        pipe,
        "a red cat",
        SIDE,
        z,
        num_frames=FRAMES,
        num_inference_steps=3,
        guidance_scale=1.0,
        max_sequence_length=TOKENS,
    ).frames  # [1, F, 3, H, W] in [0, 1]
    torch.testing.assert_close(clip, reference, atol=1e-5, rtol=1e-5)


def _with_sigmas(set_timesteps, sigmas):
    return lambda num_inference_steps, device=None, **kw: set_timesteps(sigmas=sigmas, device=device)


@pytest.mark.parametrize("cfg", [{}, {"cfg_scale": 2.0, "cfg_in_training": True}], ids=["plain", "cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    checks.assert_micro_batch_equals_single_rows(
        ADAPTER, config(model_dir, **cfg), checks.MIXED_LENGTH_PROMPTS
    )


def test_decoded_clips_are_written_as_mp4_that_decord_reads_back(adapter, tmp_path) -> None:
    samples = adapter.decode(noise(2, seed=3))
    paths = write_samples(samples, tmp_path, ["a", "b"])
    assert [p.suffix for p in paths] == [".mp4", ".mp4"]
    frames = media.read_video(paths[0])
    assert frames.shape == (FRAMES, 3, SIDE, SIDE)
    assert (frames - samples.data[0]).abs().mean() < 0.1  # lossy H.264, same content


def test_recipe_runs_v_grpo_iterations_and_exports_a_lora(model_dir, tmp_path) -> None:
    registry = checks.registry_of(wan_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *wan_options(model_dir),
        *checks.cpu_run(tmp_path),
        *checks.lora_iterations(4, group_size=4, steps=2, micro_batch_size=8, lr="3e-2"),
        "train.gradient_checkpointing=true",
        "eval.every=0",
    ]
    resolved = resolve_recipe(RECIPES / "wan_pickscore.toml", overrides, registry=registry)
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    checks.assert_trained(run_dir, 4)
    # the random tiny VAE decodes nearly uniform frames, so brightness barely varies: check that the
    # policy moved (LoRA B matrices start at zero) rather than the reward's direction
    adapter = trainer.session.adapter
    checks.assert_lora_moved(adapter)
    lora = resolved.recipe.train
    checks.assert_diffusers_lora_file(run_dir / "final", rank=lora.lora_rank, alpha=lora.lora_alpha)
    fresh = checks.adapter_from_config(WanAdapter, config(model_dir, cfg_scale=1.0))
    load = partial(fresh.pipe.load_lora_weights, run_dir / "final")
    z, t, cond = noise(2, seed=5), torch.tensor([0.3, 0.8]), adapter.encode_prompts(["a red cat", "a dog"])
    checks.assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5, moved=1e-4)


def test_shipped_recipe_passes_check_with_the_video_rewards() -> None:
    from vgrpo_rewards import pickscore, video

    registry = checks.registry_of(wan_entry, video, pickscore, surrogates_plugin)
    resolved = resolve_recipe(RECIPES / "wan_pickscore.toml", registry=registry)
    assert resolved.recipe.adapter.name == "wan" and [r.key for r in resolved.rewards] == [
        "framewise",
        "motion",
    ]
    assert resolved.adapter.config.num_frames == 33 and resolved.recipe.train.gradient_checkpointing
    # the frame-wise reward's inner options are those of the image reward it names
    registry.validate_options("reward", "pickscore", resolved.rewards[0].config.options)


def test_v_grpo_raises_the_held_out_brightness_with_a_responsive_vae(tmp_path) -> None:
    """With a decoder whose clip brightness follows the latents (``responsive_vae``; the default random
    one decodes nearly the same brightness for every latent), a few V-GRPO steps toward brighter clips
    must raise the held-out brightness (same eval seeds before and after).
    Measured eval reward at 0 -> 4 (run seeds 0/1/2): 0.593 -> 0.989 / 0.994 / 0.993."""
    model_dir = build_tiny_wan(tmp_path / "pipe", responsive_vae=True)
    registry = checks.registry_of(wan_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *wan_options(model_dir),
        *checks.cpu_run(tmp_path, "run.seed=0"),
        *checks.learning_run(8, "train.gradient_checkpointing=false"),
    ]
    run_dir = Trainer(resolve_recipe(RECIPES / "wan_pickscore.toml", overrides, registry=registry)).run()
    checks.assert_eval_gain(run_dir, 4, margin=0.2)  # the smallest measured gain was 0.40
