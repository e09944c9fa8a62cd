"""The ``flux`` adapter on a tiny FluxPipeline built from configs, saved, and loaded through the real path.

Independent references: diffusers' own ``FluxPipeline.__call__`` (rollouts), the scheduler's dynamic
shift (timestep grid), finite differences (gradients), and a freshly loaded pipeline with
``load_lora_weights`` (export).
"""

from __future__ import annotations

import math
import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
from diffusers.utils import logging as diffusers_logging
from PIL import Image
from tiny_pipelines import RESOLUTION, build_tiny_flux
from vgrpo_adapters import flux as flux_entry
from vgrpo_adapters._diffusers_common import ModelWeightsError, static_shift
from vgrpo_adapters.flux import FluxAdapterConfig
from vgrpo_adapters.flux.impl import FluxAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.cli.sample import sample_to_folder
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import BuildContext, SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "flux_pickscore.toml"
TOKENS = 16  # T5 tokens per prompt in the tests
PROMPTS = ["a red cat", "a blue dog on a hill", "a red cat"]
LATENT = (4, RESOLUTION // 2, RESOLUTION // 2)  # tiny VAE: 4 channels, factor 2


def config(model: Path, **options) -> FluxAdapterConfig:
    return FluxAdapterConfig(model=str(model), resolution=RESOLUTION, max_sequence_length=TOKENS, **options)


TINY_PIPELINE, ADAPTER = build_tiny_flux, FluxAdapter  # the conftest's model_dir and adapter fixtures
noise = partial(checks.seeded_noise, LATENT)


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(flux_entry, "flux", config(model_dir), FluxAdapter)
    checks.assert_invalid(FluxAdapterConfig, {"resolution": 520}, {"unknown": 1})  # 520: not a multiple of 16


def test_shapes_dtype_and_frozen_parts(adapter) -> None:
    assert adapter.latent_shape() == LATENT
    assert adapter.dtype == torch.float32  # "auto" on the CPU
    cond = adapter.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape == (3, TOKENS, 32) and cond["pooled_prompt_embeds"].shape == (3, 32)
    torch.testing.assert_close(cond["prompt_embeds"][0], cond["prompt_embeds"][2])
    checks.assert_frozen_text_encoders_and_vae(adapter)
    checks.assert_images_from_noise(adapter, noise(3), cond, RESOLUTION)


def test_packing_round_trips_and_matches_diffusers(adapter) -> None:
    z = noise(2)
    tokens = adapter.pack(z)
    assert tokens.shape == (2, (LATENT[1] // 2) ** 2, 4 * LATENT[0])
    assert torch.equal(adapter.unpack(tokens), z)
    # token (i, j) holds the 2x2 patch at rows 2i..2i+1, cols 2j..2j+1, channel-major
    i, j = 3, 5
    patch = z[:, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].reshape(2, -1)  # [B, C * 4]
    torch.testing.assert_close(tokens[:, i * (LATENT[2] // 2) + j], patch)
    assert adapter.img_ids.shape == (tokens.shape[1], 3)


def test_dynamic_shift_becomes_the_equivalent_static_shift(adapter, model_dir) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(model_dir / "scheduler")
    seq_len = (LATENT[1] // 2) ** 2
    cfg = scheduler.config
    mu = cfg.base_shift + (cfg.max_shift - cfg.base_shift) * (seq_len - cfg.base_image_seq_len) / (
        cfg.max_image_seq_len - cfg.base_image_seq_len
    )
    assert adapter.schedule.shift == pytest.approx(math.exp(mu))
    assert static_shift(cfg, seq_len) == pytest.approx(math.exp(mu))
    scheduler.set_timesteps(sigmas=[1.0, 0.8, 0.5, 0.2, 0.05], mu=mu)  # the pipeline's grid
    grid = torch.tensor([1.0, 0.8, 0.5, 0.2, 0.05])
    torch.testing.assert_close(adapter.schedule.warp(grid), scheduler.sigmas[:-1], atol=1e-6, rtol=1e-6)
    override = FluxAdapter(FluxPipeline.from_pretrained(model_dir), resolution=RESOLUTION, shift=2.5)
    assert override.schedule.shift == 2.5


def test_rollout_and_decode_equal_the_diffusers_pipeline(adapter, model_dir) -> None:
    z = noise(1, seed=3)
    cond = adapter.encode_prompts(["a red cat"])
    image = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 4))).data
    pipe = FluxPipeline.from_pretrained(model_dir)
    latents = FluxPipeline._pack_latents(z, 1, *LATENT)
    reference = checks.pipeline_output(
        pipe,
        "a red cat",
        RESOLUTION,
        latents,
        num_inference_steps=4,
        guidance_scale=3.5,
        max_sequence_length=TOKENS,
    ).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)
    other = FluxAdapter(pipe, resolution=RESOLUTION, max_sequence_length=TOKENS, guidance=1.0)
    assert (
        other.predict(z, torch.ones(1), cond) - adapter.predict(z, torch.ones(1), cond)
    ).abs().max() > 1e-5


def test_every_sampler_converges_to_the_same_ode_solution(adapter) -> None:
    z = noise(2, seed=4)
    cond = adapter.encode_prompts(PROMPTS[:2])
    fine = adapter.sample(z, cond, SamplerSpec("euler", 64))

    def error(name: str, steps: int) -> float:  # relative distance to the fine Euler solution
        return float((adapter.sample(z, cond, SamplerSpec(name, steps)) - fine).norm() / (z - fine).norm())

    for name in ("euler", "dpmsolver++", "unipc"):
        coarse, finer = error(name, 3), error(name, 12)
        assert finer < 0.04 and finer < 0.5 * coarse, (name, coarse, finer)
    assert torch.equal(
        adapter.sample(z, cond, SamplerSpec("unipc", 6)), adapter.sample(z, cond, SamplerSpec("unipc", 6))
    )


def test_text_embeddings_are_cached_per_prompt(model_dir) -> None:
    adapter = FluxAdapter.from_config(config(model_dir), BuildContext())
    calls: list[list[str]] = []
    encode = adapter._encode
    adapter._encode = lambda prompts: calls.append(list(prompts)) or encode(prompts)
    first = adapter.encode_prompts(PROMPTS)
    assert calls == [["a red cat", "a blue dog on a hill"]]  # each distinct prompt once
    again = adapter.encode_prompts(["a blue dog on a hill", "a red cat", "a new one"])
    assert calls[1:] == [["a new one"]]
    assert adapter.prompt_cache.hits == 3 and adapter.prompt_cache.misses == 3
    torch.testing.assert_close(again["prompt_embeds"][0], first["prompt_embeds"][1])
    fresh = encode(["a blue dog on a hill"])  # uncached, alone in its batch
    for key in first:
        torch.testing.assert_close(again[key][0], fresh[key][0])
    checks.assert_cache_can_be_off(FluxAdapter, config(model_dir, cache_text_embeddings=False), PROMPTS)


def test_decode_in_chunks_equals_one_decode(adapter) -> None:
    latents = noise(5, seed=5)
    whole = checks.decode_in_chunks(adapter, latents)
    cfg = adapter.vae.config  # decode = VAE(latents / scaling + shift), rescaled to [0, 1]
    with torch.no_grad():
        direct = adapter.vae.decode(latents / cfg.scaling_factor + cfg.shift_factor).sample
    torch.testing.assert_close(whole, ((direct + 1) / 2).clamp(0, 1))


def test_predict_gradient_matches_finite_differences(model_dir) -> None:
    adapter = FluxAdapter.from_config(config(model_dir, dtype="fp32"), BuildContext())
    adapter.denoiser.double()
    adapter.dtype = torch.float64
    adapter.img_ids = adapter.img_ids.double()
    cond = {k: v.double() for k, v in adapter.encode_prompts(PROMPTS[:2]).items()}
    z, t = noise(2, dtype=torch.float64), torch.tensor([0.3, 0.8])
    analytic, numeric = checks.directional_derivatives(adapter, z, t, cond, h=1e-4)
    # diffusers applies FLUX's rotary embedding in float32 (x.float()), so agreement is ~1e-4, not 1e-8
    assert analytic == pytest.approx(numeric, rel=1e-3)
    assert all(p.grad is None for enc in adapter.text_encoders for p in enc.parameters())


def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    checks.assert_micro_batch_equals_single_rows(ADAPTER, config(model_dir), checks.MIXED_LENGTH_PROMPTS)


def test_lora_export_loads_into_a_fresh_pipeline_with_the_same_predictions(model_dir, tmp_path) -> None:
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    checks.assert_exported_lora_reloads(
        FluxAdapter, FluxPipeline, config(model_dir), tmp_path / "final", PROMPTS[:2], z, t
    )


def test_full_finetune_export_is_a_transformer_folder(model_dir, tmp_path) -> None:
    checks.assert_full_export_reloads(FluxAdapter, config(model_dir), tmp_path / "final")


def test_missing_weights_name_the_model_and_the_fix(tmp_path) -> None:
    with pytest.raises(ModelWeightsError, match="no/such-flux-model.*huggingface-cli download"):
        FluxAdapter.from_config(FluxAdapterConfig(model="no/such-flux-model"), BuildContext())
    with pytest.raises(ModelWeightsError, match="model_index.json"):
        FluxAdapter.from_config(FluxAdapterConfig(model=str(tmp_path)), BuildContext())


def test_relative_model_path_resolves_against_the_recipe_folder(model_dir) -> None:
    built = FluxAdapter.from_config(
        FluxAdapterConfig(model=model_dir.name, resolution=RESOLUTION),
        BuildContext(recipe_dir=model_dir.parent),
    )
    assert built.latent_shape() == LATENT


def test_recipe_runs_two_iterations_end_to_end_and_exports_a_loadable_lora(model_dir, tmp_path) -> None:
    registry = checks.registry_of(flux_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path, *checks.size_options(RESOLUTION, TOKENS)),
        *checks.two_iterations(),
        "eval.max_prompts=1",
        "eval.every=0",
    ]
    resolved = resolve_recipe(RECIPE, overrides, registry=registry)
    assert resolved.recipe.rollout.sampler == "dpmsolver++" and resolved.recipe.train.gradient_checkpointing
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    checks.assert_trained(run_dir, 2)
    assert trainer.session.adapter.denoiser.is_gradient_checkpointing
    adapter = trainer.session.adapter
    cond = adapter.encode_prompts(PROMPTS[:2])
    z, t = noise(2, seed=7), torch.tensor([0.5, 0.7])
    fresh = FluxAdapter(
        FluxPipeline.from_pretrained(model_dir), resolution=RESOLUTION, max_sequence_length=TOKENS
    )
    load = partial(fresh.pipe.load_lora_weights, run_dir / "final")
    checks.assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5, moved=1e-2)
    sampler = SamplerSpec("dpmsolver++", 3)
    written = checks.assert_checkpoint_samples(
        resolved, adapter, run_dir, tmp_path / "samples", LATENT, sampler
    )
    base_files = sample_to_folder(resolved, out_dir=tmp_path / "base", prompts=["a red cat"])
    base_written = torch.from_numpy(np.array(Image.open(base_files[0]))).float()
    assert (base_written - written).abs().max() > 2  # the base model's image differs: the checkpoint was used


def test_shipped_recipe_passes_check_with_the_real_reward_plugin() -> None:
    registry = checks.registry_of(flux_entry, surrogates_plugin, checks.reward_plugin_or_skip("pickscore"))
    resolved = resolve_recipe(RECIPE, registry=registry)
    r = resolved.recipe
    assert (r.rollout.sampler, r.rollout.steps, r.surrogate.options["n_mc"]) == ("dpmsolver++", 16, 4)
    assert resolved.adapter.config.guidance == 3.5 and len(resolved.train_prompts) >= 32


@pytest.mark.gpu
def test_real_flux_on_cuda() -> None:
    """FLUX.1-dev (or VGRPO_FLUX_MODEL) at 512 px: a LoRA rollout and a gradient on the real model."""
    model = os.environ.get("VGRPO_FLUX_MODEL", "black-forest-labs/FLUX.1-dev")
    adapter = checks.cuda_adapter_or_skip(FluxAdapter, FluxAdapterConfig(model=model))
    assert adapter.latent_shape() == (16, 64, 64) and adapter.schedule.shift == pytest.approx(
        1.8776, abs=1e-3
    )
    checks.assert_lora_rollout_and_gradient_on_cuda(adapter, SamplerSpec("dpmsolver++", 8))
