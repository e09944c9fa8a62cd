"""The ``wan_i2v`` adapter on tiny WanImageToVideoPipelines built from configs (the Wan 2.2 I2V layout, and
the Wan 2.1 one with a CLIP vision encoder), saved and loaded back.

Independent references: diffusers' own ``WanImageToVideoPipeline.__call__`` from the same noise and
source frame (rollouts), the pipeline's ``load_lora_weights`` (export), the conformance kit, and a
two-iteration run of ``recipes/wan_i2v_pickscore.toml`` on an image-to-video prompt set.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from diffusers import WanImageToVideoPipeline
from diffusers.utils import logging as diffusers_logging
from PIL import Image
from tiny_kontext import edit_prompt_set, edit_prompts
from tiny_pipelines import WAN_FRAMES, WAN_SIDE, WAN_TOKENS
from tiny_wan_i2v import build_tiny_wan_i2v
from vgrpo_adapters import wan as wan_entry
from vgrpo_adapters.wan import WanI2VAdapterConfig
from vgrpo_adapters.wan.i2v import WanI2VAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.conditions import encode_conditioned
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "wan_i2v_pickscore.toml"
SIDE, FRAMES, TOKENS = WAN_SIDE, WAN_FRAMES, WAN_TOKENS
LATENT = (4, 2, SIDE // 8, SIDE // 8)


def config(model: Path, **options) -> WanI2VAdapterConfig:
    return WanI2VAdapterConfig(
        model=str(model), resolution=SIDE, num_frames=FRAMES, max_sequence_length=TOKENS, **options
    )


TINY_PIPELINE, ADAPTER = build_tiny_wan_i2v, WanI2VAdapter  # the conftest's fixtures
noise = partial(checks.seeded_noise, LATENT)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two prompts, each with a first frame of the clip's size."""
    return edit_prompts(tmp_path_factory.mktemp("i2v"), 2, side=SIDE)


def _with_sigmas(set_timesteps, sigmas):
    return lambda num_inference_steps, device=None, **kw: set_timesteps(sigmas=sigmas, device=device)


def pipeline_clip(folder: Path, prompt, z: torch.Tensor, steps: int, **options) -> torch.Tensor:
    """``WanImageToVideoPipeline.__call__`` on the adapter's sigma grid from noise ``z``."""
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    pipe.scheduler.set_timesteps = _with_sigmas(
        pipe.scheduler.set_timesteps, np.linspace(1.0, 1 / steps, steps)
    )
    return checks.pipeline_output(
        pipe,
        str(prompt),
        SIDE,
        z,
        image=Image.open(prompt.images[0]),
        num_frames=FRAMES,
        num_inference_steps=steps,
        max_sequence_length=TOKENS,
        **options,
    ).frames


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(wan_entry, "wan_i2v", config(model_dir), WanI2VAdapter)
    assert WanI2VAdapterConfig.takes_condition_image


def test_rollout_equals_the_diffusers_pipeline_from_the_same_noise_and_first_frame(
    adapter, model_dir, sources
) -> None:
    z = noise(1, seed=2)
    cond = encode_conditioned(adapter, sources[:1])
    assert cond["condition"].shape == (1, 4 + LATENT[0], *LATENT[1:]) and "image_embeds" not in cond
    clip = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 3))).data
    reference = pipeline_clip(model_dir, sources[0], z, 3, guidance_scale=1.0)
    torch.testing.assert_close(clip, reference, atol=1e-5, rtol=1e-5)
    swapped = dict(cond, condition=encode_conditioned(adapter, sources[1:2])["condition"])
    t = torch.tensor([0.6])
    assert (adapter.predict(z, t, swapped) - adapter.predict(z, t, cond)).abs().max() > 1e-4


def test_wan21_layout_with_clip_states_and_cfg_equals_the_pipeline(tmp_path, sources) -> None:
    folder = build_tiny_wan_i2v(tmp_path / "wan21", clip=True)
    adapter = checks.adapter_from_config(WanI2VAdapter, config(folder, cfg_scale=2.0, negative_prompt="ugly"))
    cond = encode_conditioned(adapter, sources[:1])
    assert cond["image_embeds"].shape[0] == 1
    z = noise(1, seed=3)
    clip = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 2))).data
    reference = pipeline_clip(folder, sources[0], z, 2, guidance_scale=2.0, negative_prompt="ugly")
    torch.testing.assert_close(clip, reference, atol=1e-5, rtol=1e-5)


def test_text_alone_is_refused_in_one_line(adapter) -> None:
    with pytest.raises(RecipeError, match="wan_i2v takes a condition image"):
        adapter.encode_prompts(["a red cat"])


def test_lora_export_loads_into_a_fresh_pipeline_with_the_same_predictions(
    model_dir, tmp_path, sources
) -> None:
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    checks.assert_exported_lora_reloads(
        WanI2VAdapter, None, config(model_dir), tmp_path / "final", sources, z, t
    )


def test_recipe_runs_two_iterations_on_an_image_to_video_prompt_set(model_dir, tmp_path) -> None:
    prompts = edit_prompt_set(tmp_path / "set", 2, side=SIDE)
    registry = checks.registry_of(wan_entry, toy_rewards, surrogates_plugin)
    overrides = [
        f'adapter.options.model="{model_dir}"',
        f"adapter.options.resolution={SIDE}",
        f"adapter.options.num_frames={FRAMES}",
        f"adapter.options.max_sequence_length={TOKENS}",
        'rewards=[{name="brightness"}]',
        f'prompts.train_file="{prompts}"',
        *checks.cpu_run(tmp_path),
        *checks.two_iterations(),
        "eval.every=0",
        "eval.max_prompts=1",
    ]
    resolved = resolve_recipe(RECIPE, overrides, registry=registry)
    run_dir = Trainer(resolved).run()
    checks.assert_trained(run_dir, 2)
    assert (run_dir / "final").is_dir()


def test_shipped_recipe_passes_check() -> None:
    from vgrpo_rewards import pickscore, video

    registry = checks.registry_of(wan_entry, video, pickscore, surrogates_plugin)
    resolved = resolve_recipe(RECIPE, registry=registry)
    assert resolved.recipe.adapter.name == "wan_i2v"
    assert all(p.images for p in resolved.train_prompts)  # type: ignore[attr-defined]
