"""The ``qwen_image_edit_plus`` adapter on a tiny QwenImageEditPlusPipeline built from configs (a Qwen2.5-VL
encoder whose vision tower reads the sources), saved and loaded back.

Independent references: diffusers' own ``QwenImageEditPlusPipeline.__call__`` from the same noise and
sources, with and without true CFG (rollouts); the pipeline's ``load_lora_weights`` (export); the
conformance kit; a two-iteration run of ``recipes/qwen_image_edit_plus.toml`` on an edit prompt set.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import pytest
import torch
from diffusers import QwenImageEditPlusPipeline
from diffusers.utils import logging as diffusers_logging
from PIL import Image
from tiny_kontext import edit_prompt_set, edit_prompts
from tiny_pipelines import RESOLUTION
from tiny_qwen_image_edit import CONDITION_SIDE, VAE_SIDE, build_tiny_qwen_image_edit_plus, small_areas
from vgrpo_adapters import qwen_image as qwen_entry
from vgrpo_adapters.qwen_image import QwenImageEditPlusAdapterConfig
from vgrpo_adapters.qwen_image.edit_plus import QwenImageEditPlusAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.conditions import condition_images, encode_conditioned
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "qwen_image_edit_plus.toml"
TOKENS = 256  # the tiny tokenizer spells the edit template's system prompt almost letter by letter
LATENT = (4, RESOLUTION // 4, RESOLUTION // 4)
AREAS = {"vae_image_area": VAE_SIDE**2, "condition_image_area": CONDITION_SIDE**2}


def config(model: Path, **options) -> QwenImageEditPlusAdapterConfig:
    return QwenImageEditPlusAdapterConfig(
        model=str(model), resolution=RESOLUTION, max_sequence_length=TOKENS, **AREAS, **options
    )


TINY_PIPELINE, ADAPTER = build_tiny_qwen_image_edit_plus, QwenImageEditPlusAdapter
noise = partial(checks.seeded_noise, LATENT)


@pytest.fixture(scope="module")
def edits(tmp_path_factory):
    return edit_prompts(tmp_path_factory.mktemp("edits"), 2)


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(qwen_entry, "qwen_image_edit_plus", config(model_dir), QwenImageEditPlusAdapter)
    assert QwenImageEditPlusAdapterConfig.takes_condition_image


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0], ids=["plain", "true_cfg"])
def test_rollout_equals_the_diffusers_pipeline_from_the_same_noise_and_sources(
    model_dir, edits, cfg_scale
) -> None:
    adapter = checks.adapter_from_config(QwenImageEditPlusAdapter, config(model_dir, cfg_scale=cfg_scale))
    z = noise(1, seed=3)
    cond = encode_conditioned(adapter, edits[:1])
    image = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 3))).data
    pipe = QwenImageEditPlusPipeline.from_pretrained(model_dir)
    with small_areas():
        reference = checks.pipeline_output(
            pipe,
            str(edits[0]),
            RESOLUTION,
            QwenImageEditPlusPipeline._pack_latents(z[:, None], 1, *LATENT),
            image=[Image.open(edits[0].images[0])],
            negative_prompt=" " if cfg_scale > 1 else None,
            true_cfg_scale=cfg_scale,
            num_inference_steps=3,
            max_sequence_length=TOKENS,
        ).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)


def test_the_velocity_depends_on_the_source_and_several_sources_are_tokens_each(adapter, edits) -> None:
    z, t = noise(2, seed=4), torch.tensor([0.3, 0.7])
    cond = encode_conditioned(adapter, edits)
    v = adapter.predict(z, t, cond)
    swapped = {
        k: val.roll(1, 0) if k != "prompt_embeds" and k != "prompt_mask" else val for k, val in cond.items()
    }
    assert (adapter.predict(z, t, swapped) - v).abs().amax(dim=(1, 2, 3)).min() > 1e-5
    alone = adapter.predict(z[1:], t[1:], encode_conditioned(adapter, edits[1:]))
    torch.testing.assert_close(alone, v[1:], atol=1e-5, rtol=1e-5)
    two = adapter.encode_conditions([str(edits[0])], [condition_images(edits[0]) * 2])
    assert two["image_latents"].shape[1] == 2 * cond["image_latents"].shape[1]
    assert adapter.predict(z[:1], t[:1], two).shape == (1, *LATENT)
    with pytest.raises(RecipeError, match="one number of condition images"):
        adapter.encode_conditions(["a", "b"], [condition_images(edits[0]), condition_images(edits[0]) * 2])
    with pytest.raises(RecipeError, match="qwen_image_edit_plus takes a condition image"):
        adapter.encode_prompts(["a red cat"])


def test_lora_export_loads_into_a_fresh_pipeline_with_the_same_predictions(
    model_dir, tmp_path, edits
) -> None:
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    checks.assert_exported_lora_reloads(
        QwenImageEditPlusAdapter, None, config(model_dir), tmp_path / "final", edits, z, t
    )


def test_recipe_runs_two_iterations_on_an_edit_prompt_set(model_dir, tmp_path) -> None:
    prompts = edit_prompt_set(tmp_path / "set", 2)
    registry = checks.registry_of(qwen_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path, *checks.size_options(RESOLUTION, TOKENS)),
        *[f"adapter.options.{k}={v}" for k, v in AREAS.items()],
        "adapter.options.cfg_scale=1.0",
        f'prompts.train_file="{prompts}"',
        *checks.two_iterations(),
        "eval.every=0",
        "eval.max_prompts=1",
    ]
    resolved = resolve_recipe(RECIPE, overrides, registry=registry)
    run_dir = Trainer(resolved).run()
    checks.assert_trained(run_dir, 2)
    assert (run_dir / "final").is_dir()


def test_shipped_recipe_passes_check() -> None:
    registry = checks.registry_of(qwen_entry, surrogates_plugin, checks.reward_plugin_or_skip("edit_clip"))
    resolved = resolve_recipe(RECIPE, registry=registry)
    assert resolved.recipe.adapter.name == "qwen_image_edit_plus"
    assert all(p.images for p in resolved.train_prompts)  # type: ignore[attr-defined]
