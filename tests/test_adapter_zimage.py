"""The ``zimage`` adapter on a tiny ZImagePipeline built from configs, saved, and loaded through the real
``from_pretrained`` path.

Independent references: diffusers' own ``ZImagePipeline.__call__`` (rollouts with and without CFG), the
pipeline's ``encode_prompt`` (each prompt's own tokens), a direct call of the transformer as the pipeline
makes it (velocity at arbitrary ``(z_t, t)``), and a freshly loaded pipeline with ``load_lora_weights``
(export).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import pytest
import torch
from diffusers import ZImagePipeline
from diffusers.utils import logging as diffusers_logging
from tiny_pipelines import RESOLUTION
from tiny_zimage import LATENT, ZIMAGE_TOKENS, build_tiny_zimage
from vgrpo_adapters import zimage as zimage_entry
from vgrpo_adapters._diffusers_common import ModelWeightsError
from vgrpo_adapters.zimage import ZImageAdapterConfig
from vgrpo_adapters.zimage.impl import ZImageAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform import finetune
from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import BuildContext, SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "zimage_pickscore.toml"
PROMPTS = ["a red cat", "a blue dog on a hill", "a red cat"]


def config(model: Path, **options) -> ZImageAdapterConfig:
    return ZImageAdapterConfig(
        model=str(model), resolution=RESOLUTION, max_sequence_length=ZIMAGE_TOKENS, **options
    )


TINY_PIPELINE, ADAPTER = build_tiny_zimage, ZImageAdapter  # the conftest's fixtures build these
noise = partial(checks.seeded_noise, LATENT)


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(zimage_entry, "zimage", config(model_dir), ZImageAdapter)
    checks.assert_invalid(  # 520: not a multiple of 16
        ZImageAdapterConfig, {"resolution": 520}, {"cfg_scale": 0.5}, {"unknown": 1}
    )


def test_shapes_frozen_parts_and_each_prompts_own_tokens(adapter) -> None:
    assert adapter.latent_shape() == LATENT and adapter.vae_scale_factor == 2
    assert adapter.schedule.shift == 3.0  # the scheduler's static shift
    cond = adapter.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape == (3, ZIMAGE_TOKENS, 16)
    torch.testing.assert_close(cond["prompt_embeds"][0], cond["prompt_embeds"][2])
    rows, _ = adapter.pipe.encode_prompt(
        PROMPTS[:2], do_classifier_free_guidance=False, max_sequence_length=48
    )
    assert cond["prompt_mask"][:2].sum(dim=1).tolist() == [len(r) for r in rows]
    for i, row in enumerate(rows):  # the pipeline's own rows, zero past each prompt's end
        torch.testing.assert_close(cond["prompt_embeds"][i, : len(row)], row, atol=1e-6, rtol=1e-5)
        assert cond["prompt_embeds"][i, len(row) :].abs().max() == 0
    checks.assert_frozen_text_encoders_and_vae(adapter)
    checks.assert_images_from_noise(adapter, noise(3), cond, RESOLUTION)


def test_velocity_at_any_point_is_the_negated_transformer_output_in_reversed_time(adapter) -> None:
    """``predict(z, t)`` is ``-transformer([z_i], 1 - t, [own tokens])``, the call and sign the pipeline
    uses before its Euler step, at arbitrary (not rollout-grid) points."""
    z, t = noise(2, seed=2), torch.tensor([0.137, 0.861])
    cond = adapter.encode_prompts(PROMPTS[:2])
    rows, _ = adapter.pipe.encode_prompt(
        PROMPTS[:2], do_classifier_free_guidance=False, max_sequence_length=48
    )
    with torch.no_grad():
        out = adapter.pipe.transformer(list(z[:, :, None].unbind(0)), 1 - t, rows, return_dict=False)[0]
        torch.testing.assert_close(adapter.predict(z, t, cond), -torch.stack(out)[:, :, 0])


@pytest.mark.parametrize("guidance", [0.0, 2.0], ids=["no-cfg", "cfg"])
def test_rollout_and_decode_equal_the_diffusers_pipeline(model_dir, guidance) -> None:
    """The adapter's Euler rollout and decode from the same noise equal ``ZImagePipeline.__call__``
    (guidance_scale g = cfg_scale - 1, against the empty negative prompt): atol = rtol = 1e-5."""
    adapter = ZImageAdapter.from_config(config(model_dir, cfg_scale=guidance + 1), BuildContext())
    z = noise(1, seed=3)
    image = adapter.decode(
        adapter.sample(z, adapter.encode_prompts(["a red cat"]), SamplerSpec("euler", 4))
    ).data
    pipe = ZImagePipeline.from_pretrained(model_dir)
    reference = checks.pipeline_output(
        pipe,
        "a red cat",
        RESOLUTION,
        z,
        guidance_scale=guidance,
        num_inference_steps=4,
        max_sequence_length=ZIMAGE_TOKENS,
    ).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cfg", [{}, {"cfg_scale": 2.0, "cfg_in_training": True}], ids=["plain", "cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    checks.assert_micro_batch_equals_single_rows(
        ZImageAdapter, config(model_dir, **cfg), checks.MIXED_LENGTH_PROMPTS
    )


def test_lora_targets_every_attention_and_mlp_linear_but_the_modulation(model_dir) -> None:
    adapter = ZImageAdapter.from_config(config(model_dir), BuildContext())
    linears = {n for n, m in adapter.denoiser.named_modules() if isinstance(m, torch.nn.Linear)}
    finetune.attach_lora(adapter.denoiser, rank=2, alpha=2, target_modules=adapter.lora_target_modules)
    wrapped = {n for n, m in adapter.denoiser.named_modules() if hasattr(m, "lora_A")}
    blocks = ("noise_refiner.", "context_refiner.", "layers.")
    expected = {n for n in linears if n.startswith(blocks) and (".attention." in n or ".feed_forward." in n)}
    assert wrapped == expected and any(n.startswith("context_refiner.") for n in wrapped)


def test_lora_export_loads_into_a_fresh_pipeline_with_the_same_predictions(model_dir, tmp_path) -> None:
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    checks.assert_exported_lora_reloads(
        ZImageAdapter, ZImagePipeline, config(model_dir), tmp_path / "final", PROMPTS[:2], z, t
    )


def test_full_finetune_export_is_a_transformer_folder(model_dir, tmp_path) -> None:
    adapter = ZImageAdapter.from_config(config(model_dir), BuildContext())
    finetune.enable_full_finetune(adapter.denoiser)
    with torch.no_grad():
        adapter.denoiser.layers[0].attention.to_q.weight.add_(0.1)
    adapter.export_trained(tmp_path / "final")
    reloaded = type(adapter.denoiser).from_pretrained(tmp_path / "final" / "transformer")
    torch.testing.assert_close(
        reloaded.layers[0].attention.to_q.weight, adapter.denoiser.layers[0].attention.to_q.weight
    )


def test_resolution_and_missing_weights_errors(model_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="divisible by 4"):
        ZImageAdapter(ZImagePipeline.from_pretrained(model_dir), resolution=34)
    with pytest.raises(ModelWeightsError, match="ZImagePipeline.*no/such-zimage.*huggingface-cli download"):
        ZImageAdapter.from_config(ZImageAdapterConfig(model="no/such-zimage"), BuildContext())


def test_recipe_runs_two_iterations_end_to_end_and_exports_a_loadable_lora(model_dir, tmp_path) -> None:
    """The shipped recipe (CFG 5 in rollouts and training, LoRA r64 / a128, gradient checkpointing) with the
    tiny weights substituted by ``--set``-style overrides; the exported LoRA reproduces the trained guided
    predictions and ``vgrpo sample --checkpoint`` generates with it."""
    registry = checks.registry_of(zimage_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path, *checks.size_options(RESOLUTION, ZIMAGE_TOKENS)),
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
        5.0,
        True,
    )
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    checks.assert_trained(run_dir, 2)
    adapter = trainer.session.adapter
    assert adapter.denoiser.is_gradient_checkpointing
    z, t = noise(2, seed=7), torch.tensor([0.5, 0.7])  # both predictions guided (cfg 5 in training)
    checks.assert_run_export_reloads(adapter, ZImagePipeline, model_dir, options, run_dir, PROMPTS[:2], z, t)
    checks.assert_checkpoint_samples(
        resolved, adapter, run_dir, tmp_path / "samples", LATENT, SamplerSpec("euler", 3)
    )


def test_shipped_recipe_passes_check_with_the_real_reward_plugin() -> None:
    registry = checks.registry_of(zimage_entry, surrogates_plugin, checks.reward_plugin_or_skip("pickscore"))
    resolved = resolve_recipe(RECIPE, registry=registry)
    r, options = resolved.recipe, resolved.adapter.config
    # Flow-Factory's Z-Image GRPO LoRA: 512 px, 10 steps, guidance_scale 4 (cfg_scale 5), 16 per group
    assert (options.resolution, r.rollout.steps, options.cfg_scale, r.rollout.group_size) == (
        512,
        10,
        5.0,
        16,
    )
    assert (r.train.lora_rank, r.train.lora_alpha, r.train.lr, r.train.grad_clip) == (64, 128, 3e-4, 1.0)
    assert options.offload_text_encoders and len(resolved.train_prompts) >= 32


@pytest.mark.gpu
def test_real_zimage_on_cuda() -> None:
    """Z-Image (or VGRPO_ZIMAGE_MODEL) at 512 px: a guided LoRA rollout and a gradient on the real model."""
    model = os.environ.get("VGRPO_ZIMAGE_MODEL", "Tongyi-MAI/Z-Image")
    adapter = checks.cuda_adapter_or_skip(
        ZImageAdapter, ZImageAdapterConfig(model=model, cfg_scale=5.0, offload_text_encoders=True)
    )
    assert adapter.latent_shape() == (16, 64, 64)
    checks.assert_lora_rollout_and_gradient_on_cuda(adapter, SamplerSpec("euler", 10))
