"""The ``hunyuan_video15`` adapter on a tiny HunyuanVideo15Pipeline built from configs, saved, and loaded
through the real ``from_pretrained`` path.

Independent references: diffusers' own ``HunyuanVideo15Pipeline.__call__`` (rollouts with its guider's
CFG, decoded clips), the transformer inputs and guided velocity the pipeline produces inside its loop
(captured with hooks), and ``load_lora_adapter`` on a freshly loaded transformer (export).
"""

from __future__ import annotations

import math
import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import pytest
import torch
from diffusers import HunyuanVideo15Pipeline
from diffusers.utils import logging as diffusers_logging
from tiny_hunyuan_video import HY_FRAMES, HY_LATENT, HY_SIDE, build_tiny_hunyuan_video15
from vgrpo_adapters import hunyuan_video as hy_entry
from vgrpo_adapters.hunyuan_video import HunyuanVideo15AdapterConfig
from vgrpo_adapters.hunyuan_video.impl import HunyuanVideo15Adapter

from vgrpo_platform.protocols import BuildContext, SamplerSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["a red cat", 'a shop sign that reads "OPEN"']  # the second one has glyph text for ByT5


def config(model: Path, **options) -> HunyuanVideo15AdapterConfig:
    return HunyuanVideo15AdapterConfig(model=str(model), resolution=HY_SIDE, num_frames=HY_FRAMES, **options)


TINY_PIPELINE, ADAPTER = build_tiny_hunyuan_video15, HunyuanVideo15Adapter  # the conftest's fixtures
noise = partial(checks.seeded_noise, HY_LATENT)


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(hy_entry, "hunyuan_video15", config(model_dir), HunyuanVideo15Adapter)
    for bad in ({"num_frames": 6}, {"cfg_scale": 0.5}, {"decode_chunk_size": 2}, {"unknown": 1}):
        with pytest.raises(ValueError):
            HunyuanVideo15AdapterConfig(**bad)


def test_shapes_guider_scale_glyph_text_and_frozen_parts(adapter) -> None:
    assert adapter.latent_shape() == HY_LATENT and adapter.schedule.shift == 5.0
    assert adapter.cfg_scale == 6.0 and adapter.uses_cfg  # the pipeline's guider, read from its folder
    cond = adapter.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape == (2, 1000, 32) and cond["glyph_embeds"].shape == (2, 256, 16)
    assert cond["glyph_mask"][0].sum() == 0 and cond["glyph_mask"][1].sum() > 0  # only quoted text
    checks.assert_frozen_text_encoders_and_vae(adapter)
    samples = adapter.decode(adapter.sample(noise(2), cond, SamplerSpec("euler", 2)))
    assert samples.modality == "video" and samples.fps == 24.0
    assert samples.data.shape == (2, HY_FRAMES, 3, HY_SIDE, HY_SIDE)
    assert 0 <= samples.data.min() and samples.data.max() <= 1


def test_rollout_equals_the_diffusers_pipeline_with_its_guider(adapter, model_dir) -> None:
    pipe = HunyuanVideo15Pipeline.from_pretrained(model_dir)
    z = noise(2, seed=2)
    latents = adapter.sample(z, adapter.encode_prompts(PROMPTS), SamplerSpec("euler", 3))
    reference = checks.pipeline_output(
        pipe, PROMPTS, HY_SIDE, z, "latent", num_frames=HY_FRAMES, num_inference_steps=3
    ).frames
    torch.testing.assert_close(latents, reference, atol=1e-5, rtol=1e-5)
    # decoded: one prompt (the VAE decodes one clip per call, see the adapter)
    clip = adapter.decode(latents[1:]).data
    frames = checks.pipeline_output(
        pipe, PROMPTS[1:], HY_SIDE, z[1:], num_frames=HY_FRAMES, num_inference_steps=3
    ).frames  # [1, F, 3, H, W] in [0, 1]
    torch.testing.assert_close(clip, frames, atol=1e-5, rtol=1e-5)


def test_velocity_at_any_point_equals_the_transformer_as_the_pipeline_calls_it(adapter, model_dir) -> None:
    """Run the pipeline for one step from ``x_t`` at an arbitrary ``t``; capture the transformer's inputs
    and outputs (conditional and unconditional calls) and the guided velocity it hands the scheduler."""
    pipe = HunyuanVideo15Pipeline.from_pretrained(model_dir)
    calls, guided = [], []
    pipe.transformer.register_forward_hook(
        lambda module, args, kwargs, out: calls.append((kwargs, out[0])), with_kwargs=True
    )
    step = pipe.scheduler.step
    pipe.scheduler.step = lambda v, *a, **kw: guided.append(v) or step(v, *a, **kw)
    x_t, sigma = noise(2, seed=4), 0.37  # shifted by the scheduler as for any rollout step
    checks.pipeline_output(pipe, PROMPTS, HY_SIDE, x_t, "latent", num_frames=HY_FRAMES, sigmas=[sigma])
    (cond_kwargs, v_cond), (uncond_kwargs, v_uncond) = calls
    assert cond_kwargs["hidden_states"].shape[1] == 2 * HY_LATENT[0] + 1  # latents, cond latents, mask
    assert cond_kwargs["hidden_states"][:, HY_LATENT[0] :].abs().max() == 0
    t = cond_kwargs["timestep"] / 1000.0
    shift = adapter.schedule.shift
    assert math.isclose(float(t[0]), shift * sigma / (1 + (shift - 1) * sigma), rel_tol=1e-6)
    cond = adapter.encode_prompts(PROMPTS)
    for key, ref in [("prompt_embeds", "encoder_hidden_states"), ("glyph_mask", "encoder_attention_mask_2")]:
        torch.testing.assert_close(cond[key], cond_kwargs[ref])
    with torch.no_grad():
        torch.testing.assert_close(HunyuanVideo15Adapter.predict(adapter, x_t, t, cond), v_cond)
        adapter.cfg_in_training = True
        try:
            torch.testing.assert_close(adapter.predict(x_t, t, cond), guided[0], atol=1e-5, rtol=1e-5)
        finally:
            adapter.cfg_in_training = False
    torch.testing.assert_close(guided[0], v_uncond + 6.0 * (v_cond - v_uncond), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "cfg",
    [{}, pytest.param({"cfg_scale": 2.0, "cfg_in_training": True}, marks=pytest.mark.slow)],  # 7 s, 17 s
    ids=["plain", "cfg"],
)
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    glyph_and_not = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]  # ByT5 masks of different lengths too
    checks.assert_micro_batch_equals_single_rows(ADAPTER, config(model_dir, **cfg), glyph_and_not)


def test_lora_export_loads_into_a_fresh_transformer_with_the_same_predictions(model_dir, tmp_path) -> None:
    adapter = HunyuanVideo15Adapter.from_config(config(model_dir, cfg_scale=1.0), BuildContext())
    checks.attach_trained_lora(adapter)
    assert "load_lora_adapter" in checks.export_lora(adapter, tmp_path / "final")
    cond = adapter.encode_prompts(PROMPTS)
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    fresh = HunyuanVideo15Adapter(
        HunyuanVideo15Pipeline.from_pretrained(model_dir), height=HY_SIDE, width=HY_SIDE, num_frames=HY_FRAMES
    )

    def load() -> None:  # rank and alpha come from the file's metadata
        fresh.pipe.transformer.load_lora_adapter(
            tmp_path / "final", prefix="transformer", weight_name="pytorch_lora_weights.safetensors"
        )

    checks.assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5)


def test_full_finetune_export_is_a_transformer_folder(model_dir, tmp_path) -> None:
    checks.assert_full_export_reloads(HunyuanVideo15Adapter, config(model_dir), tmp_path / "final")


@pytest.mark.slow  # 20-60 s on one CPU thread: 1000 text tokens per prompt, CFG in training
def test_vgrpo_run_of_the_shipped_recipe_with_tiny_weights_completes_two_iterations(
    model_dir, tmp_path
) -> None:
    """``vgrpo run recipes/hunyuan_video15_pickscore.toml`` with the tiny pipeline and a tiny PickScore
    substituted, the recipe's own rewards (frame-wise PickScore + motion) and plugins found by entry point."""
    from tiny_clip import save_clip
    from typer.testing import CliRunner

    from vgrpo_platform.cli import app as cli

    clip = save_clip(tmp_path / "pickscore")
    overrides = [
        f'adapter.options.model="{model_dir}"',
        f"adapter.options.resolution={HY_SIDE}",
        f"adapter.options.num_frames={HY_FRAMES}",
        "adapter.options.vae_tiling=false",
        f'rewards.0.options.options={{model="{clip}", processor="{clip}"}}',
        *checks.cpu_run(tmp_path),
        "rollout.group_size=2",
        "rollout.prompts_per_iteration=2",
        "rollout.steps=2",
        "surrogate.options.n_mc=2",
        "train.iterations=2",
        "train.micro_batch_size=4",
        "train.lora_rank=4",
        "eval.every=0",
    ]
    args = ["run", str(ROOT / "recipes" / "hunyuan_video15_pickscore.toml")]
    for item in overrides:
        args += ["--set", item]
    result = CliRunner().invoke(cli.app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "hunyuan_video15_pickscore"
    checks.assert_trained(run_dir, 2)
    assert (run_dir / "final" / "pytorch_lora_weights.safetensors").is_file()
