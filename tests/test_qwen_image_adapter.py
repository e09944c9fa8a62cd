"""The ``qwen_image`` adapter on a tiny QwenImagePipeline built from configs, saved, and loaded through the
real ``from_pretrained`` path.

Independent references: diffusers' own ``QwenImagePipeline.__call__`` (rollouts with and without true
CFG), its scheduler's dynamic shift and terminal stretch (timestep grid), the tokenizer (which tokens the
chat template leaves), a hand-written CFG combination, and a freshly loaded pipeline with
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
from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift
from diffusers.utils import logging as diffusers_logging
from tiny_pipelines import QWEN_TOKENS, RESOLUTION, build_tiny_qwen_image
from vgrpo_adapters import qwen_image as qwen_entry
from vgrpo_adapters._diffusers_common import ModelWeightsError
from vgrpo_adapters.qwen_image import QwenImageAdapterConfig
from vgrpo_adapters.qwen_image.impl import QwenImageAdapter, trim_text
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform import finetune
from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import BuildContext, SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "qwen_image_pickscore.toml"
TOKENS = QWEN_TOKENS
PROMPTS = ["a red cat", "a blue dog on a hill", "a red cat"]
LATENT = (4, RESOLUTION // 4, RESOLUTION // 4)  # tiny VAE: 4 channels, factor 4
SUFFIX_TOKENS = 5  # "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n" after the prompt


def config(model: Path, **options) -> QwenImageAdapterConfig:
    return QwenImageAdapterConfig(
        model=str(model), resolution=RESOLUTION, max_sequence_length=TOKENS, **options
    )


TINY_PIPELINE, ADAPTER = build_tiny_qwen_image, QwenImageAdapter  # the conftest's fixtures build these
noise = partial(checks.seeded_noise, LATENT)


def without_terminal_stretch(pipe: QwenImagePipeline) -> QwenImagePipeline:
    """The pipeline with its scheduler rebuilt from the same config but ``shift_terminal = None``."""
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, shift_terminal=None)
    return pipe


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(qwen_entry, "qwen_image", config(model_dir), QwenImageAdapter)
    checks.assert_invalid(  # 520: not a multiple of 16
        QwenImageAdapterConfig, {"resolution": 520}, {"cfg_scale": 0.5}, {"unknown": 1}
    )


def test_shapes_dtype_and_frozen_parts(adapter) -> None:
    assert adapter.latent_shape() == LATENT and adapter.vae_scale_factor == 4
    assert adapter.dtype == torch.float32  # "auto" on the CPU
    cond = adapter.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape == (3, TOKENS, 32) and cond["prompt_mask"].shape == (3, TOKENS)
    torch.testing.assert_close(cond["prompt_embeds"][0], cond["prompt_embeds"][2])
    checks.assert_frozen_text_encoders_and_vae(adapter)
    checks.assert_images_from_noise(adapter, noise(3), cond, RESOLUTION)


def test_the_template_prefix_is_dropped_and_each_prompt_keeps_its_own_tokens(adapter) -> None:
    pipe = adapter.pipe
    template = pipe.prompt_template_encode
    prefix = template[: template.index("{}")]
    # the tiny tokenizer splits the template's prefix as Qwen2's does: exactly the tokens the pipeline drops
    assert len(pipe.tokenizer(prefix).input_ids) == pipe.prompt_template_encode_start_idx == 34
    cond = adapter.encode_prompts(PROMPTS[:2])
    lengths = [len(pipe.tokenizer(p).input_ids) + SUFFIX_TOKENS for p in PROMPTS[:2]]
    assert cond["prompt_mask"].sum(dim=1).tolist() == lengths
    for row, n in enumerate(lengths):
        assert cond["prompt_mask"][row, :n].all() and not cond["prompt_mask"][row, n:].any()
        assert cond["prompt_embeds"][row, n:].abs().max() == 0
        assert cond["prompt_embeds"][row, :n].abs().sum(dim=-1).min() > 0  # every kept token is a real one
    embeds, mask = pipe.encode_prompt(PROMPTS[1], max_sequence_length=TOKENS)  # the pipeline's own call
    assert mask is None and embeds.shape[1] == lengths[1]
    torch.testing.assert_close(cond["prompt_embeds"][1, : lengths[1]], embeds[0], atol=1e-6, rtol=1e-5)


def test_a_mixed_length_batch_equals_each_prompt_alone(adapter) -> None:
    cond = adapter.encode_prompts(PROMPTS[:2])
    short, long = (int(n) for n in cond["prompt_mask"].sum(dim=1))
    assert short < long
    embeds, mask = trim_text(cond["prompt_embeds"], cond["prompt_mask"])
    assert embeds.shape[1] == long and mask is not None and mask.shape == (2, long)
    one, none = trim_text(cond["prompt_embeds"][:1], cond["prompt_mask"][:1])
    assert one.shape[1] == short and none is None  # one prompt: the pipeline's unmasked call
    z, t = noise(2, seed=1), torch.tensor([0.3, 0.8])
    with torch.no_grad():
        both = adapter.predict(z, t, cond)
        alone = [
            adapter.predict(z[i : i + 1], t[i : i + 1], {k: v[i : i + 1] for k, v in cond.items()})
            for i in (0, 1)
        ]
    torch.testing.assert_close(both, torch.cat(alone), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cfg", [{}, {"cfg_scale": 2.0, "cfg_in_training": True}], ids=["plain", "cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    checks.assert_micro_batch_equals_single_rows(
        ADAPTER, config(model_dir, **cfg), checks.MIXED_LENGTH_PROMPTS
    )


def test_packing_round_trips_and_matches_diffusers(adapter) -> None:
    z = noise(2)
    tokens = adapter.pack(z)
    assert tokens.shape == (2, (LATENT[1] // 2) ** 2, 4 * LATENT[0])
    assert torch.equal(adapter.unpack(tokens), z)
    # the pipeline packs [B, 1, C, h, w] noise: the same tokens
    assert torch.equal(QwenImagePipeline._pack_latents(z[:, None], 2, *LATENT), tokens)
    i, j = 1, 2  # token (i, j) holds the 2x2 patch at rows 2i..2i+1, cols 2j..2j+1, channel-major
    patch = z[:, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].reshape(2, -1)  # [B, C * 4]
    torch.testing.assert_close(tokens[:, i * (LATENT[2] // 2) + j], patch)


def test_dynamic_shift_is_the_static_shift_and_the_pipeline_adds_only_the_terminal_stretch(
    adapter, model_dir
) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(model_dir / "scheduler")
    cfg = scheduler.config
    assert cfg.shift_terminal == 0.02 and cfg.max_image_seq_len == 8192  # Qwen-Image's own config
    seq_len = (LATENT[1] // 2) ** 2
    mu = calculate_shift(
        seq_len, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift
    )
    assert adapter.schedule.shift == pytest.approx(math.exp(mu))
    grid = np.linspace(1.0, 1 / 6, 6)  # the pipeline's grid for 6 steps
    ours = adapter.schedule.warp(torch.tensor(grid, dtype=torch.float32))
    scheduler.set_timesteps(sigmas=grid, mu=mu)
    one_minus = 1 - ours
    stretched = 1 - one_minus / (
        one_minus[-1] / (1 - cfg.shift_terminal)
    )  # diffusers' stretch_shift_to_terminal
    torch.testing.assert_close(scheduler.sigmas[:-1], stretched, atol=1e-6, rtol=1e-6)
    assert float(scheduler.sigmas[-2]) == pytest.approx(0.02) and float(ours[-1]) > 0.2
    plain = FlowMatchEulerDiscreteScheduler.from_config(cfg, shift_terminal=None)
    plain.set_timesteps(sigmas=grid, mu=mu)
    torch.testing.assert_close(plain.sigmas[:-1], ours, atol=1e-6, rtol=1e-6)
    override = QwenImageAdapter(
        QwenImagePipeline.from_pretrained(model_dir), resolution=RESOLUTION, shift=2.5
    )
    assert override.schedule.shift == 2.5


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
def test_rollout_and_decode_equal_the_diffusers_pipeline_with_and_without_true_cfg(
    model_dir, cfg_scale
) -> None:
    """The adapter's Euler rollout and decode from the same noise equal ``QwenImagePipeline.__call__``.

    The pipeline's sigma grid stretches its end to ``shift_terminal`` (0.02), which the adapter leaves
    out (see the shift test above); for this comparison the pipeline's scheduler is rebuilt from the
    same config with ``shift_terminal = None``, so both use the same dynamic shift ``e^mu`` at this
    resolution on the same grid. With ``cfg_scale > 1`` both guide against the negative prompt " " and
    rescale to the conditional prediction's norm. Compared: the decoded images, atol = rtol = 1e-5.
    """
    adapter = QwenImageAdapter.from_config(config(model_dir, cfg_scale=cfg_scale), BuildContext())
    z = noise(1, seed=3)
    cond = adapter.encode_prompts(["a red cat"])
    image = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 4))).data
    pipe = without_terminal_stretch(QwenImagePipeline.from_pretrained(model_dir))
    reference = checks.pipeline_output(
        pipe,
        "a red cat",
        RESOLUTION,
        QwenImagePipeline._pack_latents(z[:, None], 1, *LATENT),
        negative_prompt=" " if cfg_scale > 1 else None,
        true_cfg_scale=cfg_scale,
        num_inference_steps=4,
        max_sequence_length=TOKENS,
    ).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)
    if cfg_scale > 1:  # guidance changes the result
        plain = QwenImageAdapter.from_config(config(model_dir), BuildContext())
        assert (plain.decode(plain.sample(z, cond, SamplerSpec("euler", 4))).data - image).abs().max() > 1e-3


def test_cfg_in_training_guides_predict_and_is_off_by_default(model_dir) -> None:
    plain = QwenImageAdapter.from_config(config(model_dir), BuildContext())
    rollout_only = QwenImageAdapter.from_config(config(model_dir, cfg_scale=3.0), BuildContext())
    trained = QwenImageAdapter.from_config(
        config(model_dir, cfg_scale=3.0, cfg_in_training=True, negative_prompt="blurry"), BuildContext()
    )
    cond = plain.encode_prompts(PROMPTS[:2])
    negative = plain.encode_prompts(["blurry", "blurry"])
    z, t = noise(2, seed=4), torch.tensor([0.3, 0.9])
    with torch.no_grad():
        v_cond, v_neg = plain.pack(plain.predict(z, t, cond)), plain.pack(plain.predict(z, t, negative))
        torch.testing.assert_close(rollout_only.predict(z, t, cond), plain.unpack(v_cond))
        combined = v_neg + 3.0 * (v_cond - v_neg)
        expected = combined * v_cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(trained.predict(z, t, cond), plain.unpack(expected), atol=1e-5, rtol=1e-5)
    trained.predict(z, t, cond).square().mean().backward()  # differentiable through both passes
    assert trained.denoiser.proj_out.weight.grad.abs().sum() > 0


def test_text_embeddings_and_the_negative_prompt_are_cached_per_prompt(model_dir) -> None:
    adapter = QwenImageAdapter.from_config(config(model_dir, cfg_scale=2.0), BuildContext())
    calls: list[list[str]] = []
    encode = adapter._encode
    adapter._encode = lambda prompts: calls.append(list(prompts)) or encode(prompts)
    first = adapter.encode_prompts(PROMPTS)
    assert calls == [["a red cat", "a blue dog on a hill"]]  # each distinct prompt once
    adapter.sample(noise(3), first, SamplerSpec("euler", 3))
    assert calls[1:] == [[" "]]  # the negative prompt, encoded once although used at every step
    fresh = encode(["a blue dog on a hill"])  # uncached, alone in its batch
    again = adapter.encode_prompts(["a blue dog on a hill"])
    for key in first:
        torch.testing.assert_close(again[key][0], fresh[key][0], atol=1e-6, rtol=1e-5)
    checks.assert_cache_can_be_off(QwenImageAdapter, config(model_dir, cache_text_embeddings=False), PROMPTS)


def test_decode_in_chunks_undoes_the_per_channel_normalisation(adapter) -> None:
    latents = noise(3, seed=5)
    whole = checks.decode_in_chunks(adapter, latents)
    cfg = adapter.vae.config  # decode = VAE(latents * std + mean) on one frame, rescaled to [0, 1]
    mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        direct = adapter.vae.decode(latents[:, :, None] * std + mean).sample[:, :, 0]
    torch.testing.assert_close(whole, ((direct + 1) / 2).clamp(0, 1))


def test_lora_targets_every_block_linear_but_the_modulation_and_the_last_text_outputs(model_dir) -> None:
    adapter = QwenImageAdapter.from_config(config(model_dir), BuildContext())
    linears = {
        n
        for n, m in adapter.denoiser.named_modules()
        if isinstance(m, torch.nn.Linear) and n.startswith("transformer_blocks.")
    }
    finetune.attach_lora(adapter.denoiser, rank=2, alpha=2, target_modules=adapter.lora_target_modules)
    wrapped = {n for n, m in adapter.denoiser.named_modules() if hasattr(m, "lora_A")}
    last = len(adapter.denoiser.transformer_blocks) - 1
    dead = {f"transformer_blocks.{last}.{name}" for name in QwenImageAdapter.LORA_TEXT_OUTPUT}
    modulation = {n for n in linears if "_mod." in n}
    assert modulation and dead <= linears
    assert wrapped == linears - modulation - dead  # the last block's text output is discarded by the model


def test_lora_export_loads_into_a_fresh_pipeline_with_the_same_predictions(model_dir, tmp_path) -> None:
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    checks.assert_exported_lora_reloads(
        QwenImageAdapter, QwenImagePipeline, config(model_dir), tmp_path / "final", PROMPTS[:2], z, t
    )


def test_full_finetune_export_is_a_transformer_folder(model_dir, tmp_path) -> None:
    checks.assert_full_export_reloads(QwenImageAdapter, config(model_dir), tmp_path / "final")


def test_resolution_and_missing_weights_errors(model_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="divisible by 8"):
        QwenImageAdapter(QwenImagePipeline.from_pretrained(model_dir), resolution=36)
    with pytest.raises(
        ModelWeightsError, match="QwenImagePipeline.*no/such-qwen-image.*huggingface-cli download"
    ):
        QwenImageAdapter.from_config(QwenImageAdapterConfig(model="no/such-qwen-image"), BuildContext())
    with pytest.raises(ModelWeightsError, match="model_index.json"):
        QwenImageAdapter.from_config(QwenImageAdapterConfig(model=str(tmp_path)), BuildContext())


def test_recipe_runs_two_iterations_end_to_end_and_exports_a_loadable_lora(model_dir, tmp_path) -> None:
    """The shipped recipe (true CFG 4 in rollouts and training, LoRA, gradient checkpointing) with the
    tiny weights substituted by ``--set``-style overrides; the exported LoRA reproduces the trained guided
    predictions and ``vgrpo sample --checkpoint`` generates with it."""
    registry = checks.registry_of(qwen_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path, *checks.size_options(RESOLUTION, TOKENS)),
        *checks.two_iterations(),
        "train.warmup_steps=0",
        "eval.max_prompts=1",
        "eval.every=0",
    ]
    resolved = resolve_recipe(RECIPE, overrides, registry=registry)
    r, options = resolved.recipe, resolved.adapter.config
    assert (r.rollout.sampler, r.train.lora_alpha, options.cfg_scale, options.cfg_in_training) == (
        "euler",
        128,
        4.0,
        True,
    )
    assert r.train.gradient_checkpointing
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    checks.assert_trained(run_dir, 2)
    adapter = trainer.session.adapter
    assert adapter.denoiser.is_gradient_checkpointing
    cond = adapter.encode_prompts(PROMPTS[:2])
    z, t = noise(2, seed=7), torch.tensor([0.5, 0.7])
    fresh = QwenImageAdapter(
        QwenImagePipeline.from_pretrained(model_dir), **QwenImageAdapter.options_from_config(options)
    )
    load = partial(fresh.pipe.load_lora_weights, run_dir / "final")  # both predictions guided (cfg 4)
    checks.assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-5, rtol=1e-5)
    checks.assert_checkpoint_samples(
        resolved, adapter, run_dir, tmp_path / "samples", LATENT, SamplerSpec("euler", 3)
    )


def test_shipped_recipe_passes_check_with_the_real_reward_plugin() -> None:
    registry = checks.registry_of(qwen_entry, surrogates_plugin, checks.reward_plugin_or_skip("pickscore"))
    resolved = resolve_recipe(RECIPE, registry=registry)
    r, options = resolved.recipe, resolved.adapter.config
    # Flow-GRPO's pickscore_qwenimage: 512 px, 10 steps, true CFG 4, 16 images per prompt, LoRA r64 / a128
    assert (options.resolution, r.rollout.steps, options.cfg_scale, r.rollout.group_size) == (
        512,
        10,
        4.0,
        16,
    )
    assert (r.train.lora_rank, r.train.lora_alpha, r.train.lr) == (64, 128, 3e-4)
    assert (
        options.negative_prompt == " " and options.offload_text_encoders and len(resolved.train_prompts) >= 32
    )


@pytest.mark.gpu
def test_real_qwen_image_on_cuda() -> None:
    """Qwen-Image (or VGRPO_QWEN_IMAGE_MODEL) at 512 px: a guided LoRA rollout and a gradient on the
    real model."""
    model = os.environ.get("VGRPO_QWEN_IMAGE_MODEL", "Qwen/Qwen-Image")
    adapter = checks.cuda_adapter_or_skip(
        QwenImageAdapter, QwenImageAdapterConfig(model=model, cfg_scale=4.0, offload_text_encoders=True)
    )
    assert adapter.latent_shape() == (16, 64, 64)
    assert adapter.schedule.shift == pytest.approx(1.7138, abs=1e-3)
    checks.assert_lora_rollout_and_gradient_on_cuda(adapter, SamplerSpec("euler", 10))
