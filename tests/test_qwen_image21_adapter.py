"""The ``qwen_image21`` adapter on a tiny ``QwenImage21Pipeline`` (``tiny_qwen_image21``) built from
configs, saved, and loaded through the adapter's real ``from_pretrained`` path.

Independent references: diffusers' own ``QwenImage21Pipeline.__call__`` (rollouts with and without true
CFG, with and without its KV cache), its transformer called the way the pipeline calls it (velocity), its
scheduler (timestep grid), and a fresh pipeline with ``load_lora_weights`` generating (LoRA export).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline
from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_shift
from diffusers.utils import logging as diffusers_logging
from tiny_qwen_image21 import RESOLUTION21, TOKENS21, build_tiny_qwen_image21
from vgrpo_adapters import qwen_image21 as entry
from vgrpo_adapters.qwen_image21 import QwenImage21AdapterConfig
from vgrpo_adapters.qwen_image21.impl import QwenImage21Adapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import BuildContext, SamplerSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "qwen_image21_pickscore.toml"
PROMPTS = ["a red cat", "a blue dog on a hill"]
SIDE = RESOLUTION21 // 16
LATENT = (4, SIDE, SIDE)  # tiny VAE: 4 channels, the pipeline's factor 16


def config(model, **options) -> QwenImage21AdapterConfig:
    return QwenImage21AdapterConfig(
        model=str(model), resolution=RESOLUTION21, max_sequence_length=TOKENS21, **options
    )


TINY_PIPELINE, ADAPTER = build_tiny_qwen_image21, QwenImage21Adapter  # the conftest's fixtures build these


def noise(batch: int, seed: int = 0) -> torch.Tensor:
    return checks.seeded_noise(LATENT, batch, seed)


def pipeline_latents(z: torch.Tensor) -> torch.Tensor:
    """``[B, C, h, w]`` noise as the pipeline's packed ``[B, hw, C]`` latents."""
    return QwenImage21Pipeline._pack_latents(z[:, None], z.shape[0], *LATENT)


def run_pipeline(pipe, z, prompt, cfg_scale=1.0, steps=3, kv=True, **kw):
    return pipe(
        prompt,
        negative_prompt=" " if cfg_scale > 1 else None,
        true_cfg_scale=cfg_scale,
        height=RESOLUTION21,
        width=RESOLUTION21,
        num_inference_steps=steps,
        latents=pipeline_latents(z),
        use_kv_cache=kv,
        **kw,
    ).images


def pipeline_output_latents(pipe, z, prompt, cfg_scale=1.0, kv=True):
    """The pipeline's final (normalised) latents as ``[B, C, h, w]``."""
    packed = run_pipeline(pipe, z, prompt, cfg_scale, kv=kv, output_type="latent")
    return pipe._unpack_latents(packed, RESOLUTION21, RESOLUTION21, 16)[:, :, 0]


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(entry, "qwen_image21", config(model_dir), QwenImage21Adapter)
    with pytest.raises(ValueError):
        QwenImage21AdapterConfig(resolution=48)  # not a multiple of 32
    with pytest.raises(ValueError):
        QwenImage21AdapterConfig(cfg_scale=0.5)


def test_shapes_frozen_parts_and_rgb_decode(adapter) -> None:
    assert adapter.latent_shape() == LATENT and adapter.vae_scale_factor == 16
    assert adapter.image_seq_len() == SIDE * SIDE
    cond = adapter.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape == (2, TOKENS21, 32)
    assert all(not p.requires_grad for enc in adapter.text_encoders for p in enc.parameters())
    samples = adapter.decode(adapter.sample(noise(2), cond, SamplerSpec("euler", 2)))
    assert samples.data.shape == (2, 3, RESOLUTION21, RESOLUTION21)  # the RGBA VAE's alpha dropped
    assert 0 <= samples.data.min() and samples.data.max() <= 1
    adapter.max_sequence_length = 4  # the pipeline does not truncate: a longer prompt is refused
    try:
        with pytest.raises(ValueError, match="more than max_sequence_length = 4"):
            adapter._encode(["a prompt"])
    finally:
        adapter.max_sequence_length = TOKENS21


def test_prompt_cache_rows_are_the_pipelines_embeddings(adapter) -> None:
    cond = adapter.encode_prompts(PROMPTS)
    embeds, mask, image_pad = adapter.pipe.encode_prompt(PROMPTS)
    n = embeds.shape[1]
    assert mask is not None and not image_pad.any()  # mixed lengths: masked, text only
    torch.testing.assert_close(cond["prompt_embeds"][:, :n], embeds)
    assert torch.equal(cond["prompt_mask"][:, :n], mask.long()) and not cond["prompt_mask"][:, n:].any()


def transformer_as_the_pipeline_calls_it(pipe, z, sigma, prompt):
    """``QwenImage21Pipeline.__call__``'s transformer call for one prompt, as ``[B, C, h, w]``."""
    embeds, mask, image_pad = pipe.encode_prompt([prompt] * z.shape[0])
    img_mask = torch.cat([image_pad, image_pad.new_ones(z.shape[0], SIDE * SIDE // 4)], dim=1)
    out = pipe.transformer(
        hidden_states=pipeline_latents(z),
        timestep=(sigma * 1000) / 1000,
        encoder_hidden_states=embeds,
        encoder_hidden_states_mask=mask,
        img_shapes=[[(1, SIDE, SIDE)]] * z.shape[0],
        img_mask=img_mask,
        return_dict=False,
    )[0][:, -SIDE * SIDE :]
    return pipe._unpack_latents(out, RESOLUTION21, RESOLUTION21, 16)[:, :, 0]


def test_velocity_equals_the_transformer_called_as_the_pipeline_calls_it(adapter) -> None:
    """At arbitrary ``(x_t, t)``, a mixed batch (two prompt lengths, one repeated) gives each row the
    pipeline's own call for its prompt; the pipeline's padded batch would not (the image's RoPE positions
    follow the padded text length), which is why the adapter calls once per prompt length."""
    pipe = adapter.pipe
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    z, sigma = noise(3, seed=1), torch.tensor([0.37, 0.81, 0.55])
    with torch.no_grad():
        ours = adapter.predict(z, sigma, adapter.encode_prompts(prompts))
        expected = torch.cat(
            [
                transformer_as_the_pipeline_calls_it(pipe, z[i : i + 1], sigma[i : i + 1], p)
                for i, p in enumerate(prompts)
            ]
        )
        embeds, mask, image_pad = pipe.encode_prompt(PROMPTS)
        padded = pipe.transformer(
            hidden_states=pipeline_latents(z[:2]),
            timestep=sigma[:2],
            encoder_hidden_states=embeds,
            encoder_hidden_states_mask=mask,
            img_shapes=[[(1, SIDE, SIDE)]] * 2,
            img_mask=torch.cat([image_pad, image_pad.new_ones(2, SIDE * SIDE // 4)], dim=1),
            return_dict=False,
        )[0][:, -SIDE * SIDE :]
    diff = (ours - expected).abs().max().item()
    assert diff <= 1e-5, diff
    padded = pipe._unpack_latents(padded, RESOLUTION21, RESOLUTION21, 16)[:, :, 0]
    assert (padded[0] - expected[0]).abs().max() > 1e-3  # the short prompt, padded, moves
    assert (
        ours[0] - adapter.predict(z[:1], sigma[1:2], adapter.encode_prompts(prompts[:1]))
    ).abs().max() > 1e-3


@pytest.mark.parametrize("cfg", [{}, {"cfg_scale": 2.0, "cfg_in_training": True}], ids=["plain", "cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    checks.assert_micro_batch_equals_single_rows(
        ADAPTER, config(model_dir, **cfg), checks.MIXED_LENGTH_PROMPTS
    )


def test_timestep_grid_is_the_pipelines_dynamic_shift(adapter, model_dir) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(model_dir / "scheduler")
    cfg = scheduler.config
    mu = calculate_shift(
        SIDE * SIDE, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift
    )
    assert adapter.schedule.shift == pytest.approx(math.exp(mu))
    grid = np.linspace(1.0, 1 / 5, 5)  # the pipeline's grid for 5 steps without sample_sigmas
    scheduler.set_timesteps(sigmas=grid, mu=mu)
    ours = adapter.schedule.warp(torch.tensor(grid, dtype=torch.float32))
    torch.testing.assert_close(scheduler.sigmas[:-1], ours, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_rollout_equals_the_pipeline_with_and_without_cfg_and_kv_cache(model_dir, cfg_scale) -> None:
    """Decoded images of the adapter's Euler rollout vs ``QwenImage21Pipeline.__call__`` from the same noise
    (RGB channels of its RGBA output): without the pipeline's KV cache to 1e-5, with it to 1e-4 (the cache
    changes rounding only)."""
    adapter = QwenImage21Adapter.from_config(config(model_dir, cfg_scale=cfg_scale), BuildContext())
    z = noise(1, seed=3)
    latents = adapter.sample(z, adapter.encode_prompts(PROMPTS[1:]), SamplerSpec("euler", 3))
    image = adapter.decode(latents).data
    pipe = QwenImage21Pipeline.from_pretrained(model_dir)
    for kv, tol in ((False, 1e-5), (True, 1e-4)):
        reference = run_pipeline(pipe, z, PROMPTS[1], cfg_scale, kv=kv, output_type="pt")[:, :3]
        diff = (image - reference).abs().max().item()
        assert diff <= tol, (kv, diff)
        reference = pipeline_output_latents(pipe, z, PROMPTS[1], cfg_scale, kv=kv)
        diff = (latents - reference).abs().max().item()
        assert diff <= tol, (kv, diff)
    if cfg_scale > 1:  # guidance changes the result
        assert (pipeline_output_latents(pipe, z, PROMPTS[1], kv=False) - latents).abs().max() > 0.01


def test_cfg_in_training_is_the_plain_combination_of_two_calls(model_dir) -> None:
    plain = QwenImage21Adapter.from_config(config(model_dir), BuildContext())
    trained = QwenImage21Adapter.from_config(
        config(model_dir, cfg_scale=3.0, cfg_in_training=True, negative_prompt="blurry"), BuildContext()
    )
    cond, negative = plain.encode_prompts(PROMPTS), plain.encode_prompts(["blurry"] * 2)
    z, t = noise(2, seed=4), torch.tensor([0.3, 0.9])
    with torch.no_grad():
        v_cond, v_neg = plain.predict(z, t, cond), plain.predict(z, t, negative)
        torch.testing.assert_close(trained.predict(z, t, cond), v_neg + 3.0 * (v_cond - v_neg))
    trained.predict(z, t, cond).square().mean().backward()
    assert trained.denoiser.proj_out.weight.grad.abs().sum() > 0


def test_lora_export_loads_with_the_pipelines_loader_and_generates_the_same(model_dir, tmp_path) -> None:
    adapter = QwenImage21Adapter.from_config(config(model_dir), BuildContext())
    linears = {
        n
        for n, m in adapter.denoiser.named_modules()
        if isinstance(m, torch.nn.Linear) and n.startswith("transformer_blocks.")
    }
    checks.attach_trained_lora(adapter, std=0.3)
    assert {n for n, m in adapter.denoiser.named_modules() if hasattr(m, "lora_A")} == linears
    note = checks.export_lora(adapter, tmp_path / "final")
    assert "QwenImage21Pipeline" in note
    z = noise(1, seed=6)
    latents = adapter.sample(z, adapter.encode_prompts(PROMPTS[:1]), SamplerSpec("euler", 3))
    pipe = QwenImage21Pipeline.from_pretrained(model_dir)
    assert (pipeline_output_latents(pipe, z, PROMPTS[0]) - latents).abs().max() > 0.01  # LoRA matters
    pipe.load_lora_weights(tmp_path / "final")  # QwenImageLoraLoaderMixin
    diff = (pipeline_output_latents(pipe, z, PROMPTS[0], kv=False) - latents).abs().max().item()
    assert diff <= 1e-5, diff
    image = run_pipeline(pipe, z, PROMPTS[0], output_type="pt")[:, :3]  # with the pipeline's KV cache
    diff = (image - adapter.decode(latents).data).abs().max().item()
    assert diff <= 1e-4, diff


def test_sample_sigmas_in_the_model_is_reported(model_dir) -> None:
    pipe = QwenImage21Pipeline.from_pretrained(model_dir)
    pipe.register_to_config(sample_sigmas=[1.0, 0.5])
    with pytest.warns(UserWarning, match="sample_sigmas"):
        QwenImage21Adapter(pipe, resolution=RESOLUTION21)


def test_shipped_recipe_passes_check() -> None:
    registry = checks.registry_of(
        entry, surrogates_plugin, toy_rewards, checks.reward_plugin_or_skip("pickscore")
    )
    resolved = resolve_recipe(RECIPE, registry=registry)
    options = resolved.adapter.config
    assert (options.resolution, options.cfg_scale, options.negative_prompt) == (512, 4.0, " ")
    assert resolved.recipe.rollout.steps == 10 and options.offload_text_encoders
