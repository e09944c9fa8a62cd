"""The ``sd3`` adapter on a tiny StableDiffusion3Pipeline built from configs, saved, and loaded by path.

Independent references: diffusers' ``StableDiffusion3Pipeline.__call__`` (rollouts with and without
true CFG), a hand-written CFG combination, and a fresh pipeline with ``load_lora_weights`` (export).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from diffusers import StableDiffusion3Pipeline
from diffusers.utils import logging as diffusers_logging
from tiny_pipelines import RESOLUTION, build_tiny_sd3
from vgrpo_adapters import sd3 as sd3_entry
from vgrpo_adapters._diffusers_common import ModelWeightsError
from vgrpo_adapters.sd3 import SD3AdapterConfig
from vgrpo_adapters.sd3.impl import SD3Adapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import BuildContext, SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TOKENS = 16
PROMPTS = ["a red cat", "a blue dog", "a red cat"]
LATENT = (4, RESOLUTION // 2, RESOLUTION // 2)


def config(model: Path, **options) -> SD3AdapterConfig:
    return SD3AdapterConfig(model=str(model), resolution=RESOLUTION, max_sequence_length=TOKENS, **options)


TINY_PIPELINE, ADAPTER = build_tiny_sd3, SD3Adapter  # the conftest's model_dir and adapter fixtures
noise = partial(checks.seeded_noise, LATENT)


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(sd3_entry, "sd3", config(model_dir), SD3Adapter)
    with pytest.raises(ValueError):
        SD3AdapterConfig(cfg_scale=0.5)


def test_shapes_shift_and_conditioning(adapter) -> None:
    assert adapter.latent_shape() == LATENT and adapter.schedule.shift == 3.0  # the scheduler's static shift
    cond = adapter.encode_prompts(PROMPTS)
    # CLIP-L|G states (32 tokens, 32 + 32 wide, padded to T5's 64) followed by the T5 tokens
    assert cond["prompt_embeds"].shape == (3, 32 + TOKENS, 64) and cond["pooled_prompt_embeds"].shape == (
        3,
        64,
    )
    assert not torch.allclose(cond["pooled_prompt_embeds"][0], cond["pooled_prompt_embeds"][1])
    z = noise(3)
    assert adapter.predict(z, torch.rand(3), cond).shape == z.shape
    images = adapter.decode(adapter.sample(z, cond, SamplerSpec("unipc", 2))).data
    assert images.shape == (3, 3, RESOLUTION, RESOLUTION) and 0 <= images.min() and images.max() <= 1


@pytest.mark.parametrize("cfg_scale", [1.0, 2.5])
def test_rollout_equals_the_diffusers_pipeline_with_and_without_cfg(model_dir, cfg_scale) -> None:
    adapter = SD3Adapter.from_config(config(model_dir, cfg_scale=cfg_scale), BuildContext())
    z = noise(1, seed=2)
    image = adapter.decode(
        adapter.sample(z, adapter.encode_prompts(["a red cat"]), SamplerSpec("euler", 4))
    ).data
    pipe = StableDiffusion3Pipeline.from_pretrained(model_dir)
    reference = checks.pipeline_output(
        pipe,
        "a red cat",
        RESOLUTION,
        z,
        num_inference_steps=4,
        guidance_scale=cfg_scale,
        max_sequence_length=TOKENS,
        sigmas=np.linspace(1.0, 0.25, 4),
    ).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)


def test_cfg_in_training_guides_predict_and_is_off_by_default(model_dir) -> None:
    plain = SD3Adapter.from_config(config(model_dir), BuildContext())
    rollout_only = SD3Adapter.from_config(config(model_dir, cfg_scale=3.0), BuildContext())
    trained = SD3Adapter.from_config(config(model_dir, cfg_scale=3.0, cfg_in_training=True), BuildContext())
    cond = plain.encode_prompts(PROMPTS[:2])
    negative = plain.encode_prompts(["", ""])
    z, t = noise(2, seed=3), torch.tensor([0.3, 0.9])
    with torch.no_grad():
        v_cond, v_neg = plain.predict(z, t, cond), plain.predict(z, t, negative)
        torch.testing.assert_close(rollout_only.predict(z, t, cond), v_cond)
        torch.testing.assert_close(
            trained.predict(z, t, cond), v_neg + 3.0 * (v_cond - v_neg), atol=1e-5, rtol=1e-5
        )
    trained.predict(z, t, cond).square().mean().backward()  # differentiable through both passes
    assert trained.denoiser.proj_out.weight.grad.abs().sum() > 0


def test_cache_serves_repeated_prompts_and_the_negative_prompt(model_dir) -> None:
    adapter = SD3Adapter.from_config(
        config(model_dir, cfg_scale=2.0, text_cache_device="device"), BuildContext()
    )
    adapter.sample(noise(3), adapter.encode_prompts(PROMPTS), SamplerSpec("euler", 3))
    # 2 distinct prompts + the empty negative prompt, encoded once although used at every step
    assert len(adapter.prompt_cache) == 3 and adapter.prompt_cache.misses == 3
    assert adapter.prompt_cache.hits == 1 + 2  # the repeated "a red cat" + the negative at steps 2 and 3


def test_resolution_is_checked_against_vae_patch_and_position_table(model_dir) -> None:
    pipe = StableDiffusion3Pipeline.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="divisible by 4"):
        SD3Adapter(pipe, resolution=34)
    with pytest.raises(ValueError, match="position table"):
        SD3Adapter(pipe, resolution=128)  # pos_embed_max_size 16 x patch 2 x VAE 2 = 64 px
    assert SD3Adapter(pipe, resolution=64).latent_shape() == (4, 32, 32)


@pytest.mark.parametrize("cfg", [{}, {"cfg_scale": 2.0, "cfg_in_training": True}], ids=["plain", "cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    checks.assert_micro_batch_equals_single_rows(
        ADAPTER, config(model_dir, **cfg), checks.MIXED_LENGTH_PROMPTS
    )


def test_lora_export_loads_into_a_fresh_pipeline_with_the_same_predictions(model_dir, tmp_path) -> None:
    adapter = SD3Adapter.from_config(config(model_dir), BuildContext())
    checks.attach_trained_lora(adapter, rank=4, alpha=2, std=0.2)
    checks.export_lora(adapter, tmp_path / "final", rank=4, alpha=2)
    cond = adapter.encode_prompts(PROMPTS[:2])
    z, t = noise(2, seed=4), torch.tensor([0.2, 0.6])
    fresh = SD3Adapter(
        StableDiffusion3Pipeline.from_pretrained(model_dir), resolution=RESOLUTION, max_sequence_length=TOKENS
    )
    load = partial(fresh.pipe.load_lora_weights, tmp_path / "final")
    checks.assert_reload_matches(
        adapter, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5
    )  # alpha / rank = 0.5 kept


def test_missing_weights_name_the_model_and_the_fix() -> None:
    with pytest.raises(ModelWeightsError, match="StableDiffusion3Pipeline.*no/such-sd3"):
        SD3Adapter.from_config(SD3AdapterConfig(model="no/such-sd3"), BuildContext())


def test_recipe_runs_two_iterations_end_to_end_and_exports_a_loadable_lora(model_dir, tmp_path) -> None:
    registry = checks.registry_of(sd3_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(
            model_dir,
            tmp_path,
            *checks.size_options(RESOLUTION, TOKENS),
            "adapter.options.cfg_scale=2.0",
            "adapter.options.cfg_in_training=true",
        ),
        *checks.two_iterations(group_size=3, micro_batch_size=3),
        "eval.max_prompts=1",
        "eval.every=0",
    ]
    resolved = resolve_recipe(RECIPES / "sd35_pickscore.toml", overrides, registry=registry)
    r = resolved.recipe
    assert (r.rollout.sampler, r.rollout.steps, r.train.lora_rank, r.train.lora_alpha) == ("euler", 3, 4, 64)
    assert r.grpo.soft_clip_eta == 3.0 and r.train.gradient_steps_per_iteration == 1 and r.train.lr == 1e-2
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    records = checks.assert_trained(run_dir, 2)
    assert all(rec["gradient_steps"] == 1 for rec in records)
    adapter = trainer.session.adapter
    cond = adapter.encode_prompts(PROMPTS[:2])
    z, t = noise(2, seed=5), torch.tensor([0.5, 0.8])
    fresh = SD3Adapter(
        StableDiffusion3Pipeline.from_pretrained(model_dir),
        resolution=RESOLUTION,
        max_sequence_length=TOKENS,
        cfg_scale=2.0,
    )
    with torch.no_grad():
        trained, base = adapter.predict(z, t, cond), fresh.guided_velocity(z, t, cond)
        fresh.pipe.load_lora_weights(run_dir / "final")
        loaded = fresh.guided_velocity(z, t, cond)
    assert (trained - base).abs().max() > 1e-4
    torch.testing.assert_close(loaded, trained, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("recipe", ["sd35_pickscore.toml", "sd35_multireward.toml"])
def test_shipped_recipes_pass_check_with_the_real_reward_plugins(recipe) -> None:
    modules = [checks.reward_plugin_or_skip(name) for name in ("pickscore", "hpsv2", "clipscore")]
    registry = checks.registry_of(sd3_entry, surrogates_plugin, *modules)
    resolved = resolve_recipe(RECIPES / recipe, registry=registry)
    assert resolved.recipe.adapter.name == "sd3" and len(resolved.train_prompts) >= 32
    assert resolved.adapter.config.cfg_scale == 1.0 and resolved.recipe.train.lora_rank == 32


@pytest.mark.gpu
def test_real_sd35_medium_on_cuda() -> None:
    """SD3.5-M (or VGRPO_SD3_MODEL) at 512 px: a rollout with CFG and a LoRA gradient on the real model."""
    model = os.environ.get("VGRPO_SD3_MODEL", "stabilityai/stable-diffusion-3.5-medium")
    adapter = checks.cuda_adapter_or_skip(SD3Adapter, SD3AdapterConfig(model=model, cfg_scale=4.5))
    assert adapter.latent_shape() == (16, 64, 64) and adapter.schedule.shift == 3.0
    checks.assert_lora_rollout_and_gradient_on_cuda(adapter, SamplerSpec("euler", 10))
