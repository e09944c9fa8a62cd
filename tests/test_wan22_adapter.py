"""The ``wan`` adapter on a tiny two-expert (Wan 2.2 layout) WanPipeline built from configs, saved, loaded.

Independent references: diffusers' ``WanPipeline.__call__`` (rollouts, with and without different
guidance scales per expert), direct calls of each expert (the surrogate's routing), diffusers' own
``load_lora_weights`` (the export), and a 2-iteration ``vgrpo run`` of ``recipes/wan22_pickscore.toml``.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from diffusers import WanPipeline
from diffusers.utils import logging as diffusers_logging
from tiny_pipelines import WAN22_BOUNDARY, WAN_FRAMES, WAN_SIDE, WAN_TOKENS, build_tiny_wan22
from typer.testing import CliRunner
from vgrpo_adapters.wan import WanAdapterConfig
from vgrpo_adapters.wan.experts import WanExperts
from vgrpo_adapters.wan.impl import WanAdapter

from vgrpo_platform.cli import app as cli
from vgrpo_platform.finetune import attach_lora, trainable_named_parameters
from vgrpo_platform.protocols import BuildContext, SamplerSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
LATENT = (4, 2, WAN_SIDE // 8, WAN_SIDE // 8)
BOUNDARY = WAN22_BOUNDARY * 1000  # the pipeline's boundary timestep (num_train_timesteps = 1000)
STEPS = 3  # Euler grid 1, 2/3, 1/3 shifted by 3: timesteps 1000, 857, 600 -> high, high, low


def config(model: Path, **options) -> WanAdapterConfig:
    return WanAdapterConfig(
        model=str(model),
        resolution=WAN_SIDE,
        num_frames=WAN_FRAMES,
        max_sequence_length=WAN_TOKENS,
        **options,
    )


TINY_PIPELINE, ADAPTER = build_tiny_wan22, WanAdapter  # the conftest's model_dir and adapter fixtures
noise = partial(checks.seeded_noise, LATENT)


def lora_adapter(model_dir: Path, experts: list[str] | None, seed: int = 0) -> WanAdapter:
    """An adapter whose LoRA (on ``experts``) has moved away from zero, as after training."""
    built = WanAdapter.from_config(config(model_dir, train_experts=experts), BuildContext())
    params = attach_lora(built.denoiser, rank=4, alpha=8.0, target_modules=built.lora_target_modules)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    built.denoiser.eval()
    return built


def pipeline_frames(pipe: WanPipeline, z: torch.Tensor, **kw) -> torch.Tensor:
    """``WanPipeline`` on the adapter's Euler grid from the latents ``z`` -> frames ``[1, F, 3, H, W]``."""
    set_timesteps = type(pipe.scheduler).set_timesteps.__get__(pipe.scheduler)  # unpatched, when called twice
    sigmas = np.linspace(1.0, 1 / STEPS, STEPS)
    pipe.scheduler.set_timesteps = lambda n, device=None, **_: set_timesteps(sigmas=sigmas, device=device)
    return checks.pipeline_output(
        pipe,
        "a red cat",
        WAN_SIDE,
        z,
        num_frames=WAN_FRAMES,
        num_inference_steps=STEPS,
        max_sequence_length=WAN_TOKENS,
        **kw,
    ).frames


def count_calls(*modules: torch.nn.Module) -> list[str]:
    """Records ``"high"`` / ``"low"`` per forward of each module, in call order."""
    calls: list[str] = []
    for name, module in zip(("high", "low"), modules, strict=True):
        module.register_forward_hook(lambda *_, name=name: calls.append(name))
    return calls


def test_two_expert_folder_is_detected_and_malformed_layouts_are_rejected(adapter) -> None:
    pipe = adapter.pipe
    assert pipe.config.boundary_ratio == WAN22_BOUNDARY and pipe.transformer_2 is not None
    den = adapter.denoiser
    assert isinstance(den, WanExperts) and den.boundary_timestep == BOUNDARY
    assert den.experts["high"] is pipe.transformer and den.experts["low"] is pipe.transformer_2
    assert den.trained == ("high", "low") and adapter.latent_shape() == LATENT
    parts = {k: v for k, v in pipe.components.items() if k != "transformer_2"}
    with pytest.raises(ValueError, match="transformer_2 and boundary_ratio"):
        WanAdapter(WanPipeline(**parts, boundary_ratio=0.5), height=32, width=32, num_frames=5)
    with pytest.raises(ValueError, match="transformer_2 and boundary_ratio"):
        WanAdapter(WanPipeline(**parts, transformer_2=pipe.transformer_2), height=32, width=32, num_frames=5)
    one = WanPipeline(**parts)  # Wan 2.1 layout: the two-expert options are refused, not ignored
    for bad in ({"cfg_scale": 2.0, "cfg_scale_2": 3.0}, {"train_experts": ["low"]}):
        with pytest.raises(ValueError, match="two-expert"):
            WanAdapter(one, height=32, width=32, num_frames=5, **bad)
    with pytest.raises(ValueError, match="guidance_scale > 1"):
        WanAdapter(pipe, height=32, width=32, num_frames=5, cfg_scale_2=3.0)
    with pytest.raises(ValueError, match="twice"):
        config(Path("."), train_experts=["low", "low"])


def test_routing_rule_is_the_pipelines_at_the_exact_boundary(adapter) -> None:
    """``t >= boundary_ratio * num_train_timesteps`` -> high, in float32 as the pipeline compares it."""
    at = torch.tensor([BOUNDARY], dtype=torch.float32)
    below = torch.nextafter(at, torch.zeros(1))
    assert adapter.denoiser.is_high(torch.cat([at, below, at + 1])).tolist() == [True, False, True]


@pytest.mark.parametrize(
    ("cfg", "guidance"),
    [
        ({}, {"guidance_scale": 1.0}),
        ({"cfg_scale": 3.0, "cfg_scale_2": 1.5}, {"guidance_scale": 3.0, "guidance_scale_2": 1.5}),
    ],
    ids=["no-cfg", "cfg-3.0-then-1.5"],
)
def test_rollout_equals_the_pipeline_switching_expert_at_the_boundary(model_dir, cfg, guidance) -> None:
    ours = WanAdapter.from_config(config(model_dir, **cfg), BuildContext())
    z = noise(1, seed=2)
    calls = count_calls(ours.denoiser.experts["high"], ours.denoiser.experts["low"])
    clip = ours.decode(ours.sample(z, ours.encode_prompts(["a red cat"]), SamplerSpec("euler", STEPS))).data
    pipe = WanPipeline.from_pretrained(model_dir)
    pipe_calls = count_calls(pipe.transformer, pipe.transformer_2)
    reference = pipeline_frames(pipe, z, **guidance)  # [1, F, 3, H, W] in [0, 1]
    passes = 2 if cfg else 1  # the pipeline calls the expert twice per step under CFG, we once (2B rows)
    assert calls == ["high", "high", "low"] and pipe_calls == [c for c in calls for _ in range(passes)]
    torch.testing.assert_close(clip, reference, atol=1e-5, rtol=1e-5)


def test_rollout_with_different_scales_differs_from_one_scale(model_dir) -> None:
    """The low-noise expert's own scale is used: cfg_scale_2 changes the clip (same noise)."""
    z, sampler = noise(1, seed=2), SamplerSpec("euler", STEPS)
    clips = []
    for cfg_2 in (3.0, 1.5):
        ours = WanAdapter.from_config(config(model_dir, cfg_scale=3.0, cfg_scale_2=cfg_2), BuildContext())
        clips.append(ours.sample(z, ours.encode_prompts(["a red cat"]), sampler))
    assert (clips[0] - clips[1]).abs().max() > 1e-4


def test_surrogate_rows_on_both_sides_of_the_boundary_hit_their_experts(adapter) -> None:
    cond = adapter.encode_prompts(["a red cat", "a blue dog", "a red cat", "a blue dog"])
    z, t = noise(4, seed=5), torch.tensor([0.95, 0.2, 0.71, 0.69])  # high, low, high, low

    def expert_velocity(name: str, i: int) -> torch.Tensor:  # row i through one expert, as the model calls it
        return adapter.denoiser.experts[name](
            hidden_states=z[i : i + 1],
            timestep=t[i : i + 1] * 1000,
            encoder_hidden_states=cond["prompt_embeds"][i : i + 1],
            return_dict=False,
        )[0]

    with torch.no_grad():
        v = adapter.predict(z, t, cond)
        for i, name in enumerate(["high", "low", "high", "low"]):
            ref = expert_velocity(name, i)
            torch.testing.assert_close(v[i : i + 1], ref, atol=1e-5, rtol=1e-5)
            wrong = expert_velocity("low" if name == "high" else "high", i)
            assert (v[i : i + 1] - wrong).abs().max() > 1e-3  # the experts differ: routing is observable


@pytest.mark.parametrize("cfg", [{}, {"cfg_scale": 2.0, "cfg_in_training": True}], ids=["plain", "cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(model_dir, cfg) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    checks.assert_micro_batch_equals_single_rows(
        ADAPTER, config(model_dir, **cfg), checks.MIXED_LENGTH_PROMPTS
    )


@pytest.mark.parametrize("experts", [["high"], ["low"], None], ids=["high", "low", "both"])
def test_lora_only_on_the_chosen_experts_and_only_they_get_gradients(model_dir, experts) -> None:
    built = WanAdapter.from_config(config(model_dir, train_experts=experts), BuildContext())
    attach_lora(built.denoiser, rank=2, alpha=4.0, target_modules=built.lora_target_modules)
    chosen = set(experts or ["high", "low"])
    for name, expert in built.denoiser.experts.items():
        has_lora = any("lora_" in n for n, _ in expert.named_parameters())
        assert has_lora == (name in chosen), name
    trainable = trainable_named_parameters(built.denoiser)
    assert trainable and {n.split(".")[0] for n in trainable} == chosen
    cond = built.encode_prompts(["a red cat"] * 4)
    z, t = noise(4, seed=6), torch.tensor([0.9, 0.8, 0.3, 0.1])  # both experts in one call
    built.predict(z, t, cond).square().mean().backward()
    for name, expert in built.denoiser.experts.items():
        grads = {n: p.grad for n, p in expert.named_parameters() if p.grad is not None}
        if name in chosen:
            assert (
                grads and all("lora_" in n for n in grads) and any(g.abs().sum() > 0 for g in grads.values())
            )
        else:
            assert not grads and not any(p.requires_grad for p in expert.parameters()), name


@pytest.mark.parametrize("experts", [None, ["low"]], ids=["both", "low"])
def test_lora_export_loads_with_diffusers_and_generates_the_same(model_dir, tmp_path, experts) -> None:
    ours = lora_adapter(model_dir, experts)
    ours.export_trained(tmp_path)
    info = json.loads((tmp_path / "vgrpo_export.json").read_text())
    folders = {"high": tmp_path / "transformer", "low": tmp_path / "transformer_2"}
    chosen = experts or ["high", "low"]
    assert info["kind"] == "lora" and sorted(info["trained_experts"]) == sorted(chosen)
    for name, folder in folders.items():
        assert (folder / "pytorch_lora_weights.safetensors").is_file() == (name in chosen)
        if name in chosen:
            checks.assert_diffusers_lora_file(folder, rank=4, alpha=8)
    z = noise(1, seed=3)
    with torch.no_grad():
        clip = ours.decode(
            ours.sample(z, ours.encode_prompts(["a red cat"]), SamplerSpec("euler", STEPS))
        ).data
    pipe = WanPipeline.from_pretrained(model_dir)
    base = pipeline_frames(pipe, z, guidance_scale=1.0)
    if "high" in chosen:
        pipe.load_lora_weights(folders["high"])
    if "low" in chosen:
        pipe.load_lora_weights(folders["low"], load_into_transformer_2=True)
    reference = pipeline_frames(pipe, z, guidance_scale=1.0)
    assert (clip - base).abs().max() > 1e-4  # the LoRA changes the clip ...
    torch.testing.assert_close(clip, reference, atol=1e-5, rtol=1e-5)  # ... as diffusers' loader applies it


def test_full_finetune_export_writes_only_the_trained_expert(model_dir, tmp_path) -> None:
    from diffusers import WanTransformer3DModel

    built = WanAdapter.from_config(config(model_dir, train_experts=["low"]), BuildContext())
    with torch.no_grad():
        for p in built.denoiser.parameters():  # the low-noise expert's only: the high one is not inside
            p.add_(0.01)
    built.export_trained(tmp_path)
    assert not (tmp_path / "transformer").exists()
    loaded = WanTransformer3DModel.from_pretrained(tmp_path / "transformer_2")
    for (name, p), q in zip(built.pipe.transformer_2.named_parameters(), loaded.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)
    assert json.loads((tmp_path / "vgrpo_export.json").read_text())["kind"] == "full"


def test_an_idle_trained_expert_gets_zero_gradients_under_ddp(model_dir, monkeypatch) -> None:
    """DDP needs every trained parameter in each backward: rows all on one side leave the other expert
    a zero-valued path (zero gradients, not missing ones); without DDP nothing is added."""
    from vgrpo_adapters.wan import experts as experts_module

    built = lora_adapter(model_dir, None)
    cond = built.encode_prompts(["a red cat"] * 2)
    z, t = noise(2, seed=7), torch.tensor([0.9, 0.8])  # both high
    reference = built.predict(z, t, cond)
    monkeypatch.setattr(experts_module, "_distributed", lambda: True)
    out = built.predict(z, t, cond)
    torch.testing.assert_close(out, reference, atol=0, rtol=0)
    out.square().mean().backward()
    low = [p.grad for n, p in built.denoiser.low.named_parameters() if "lora_" in n]
    high = [p.grad for n, p in built.denoiser.high.named_parameters() if "lora_" in n]
    assert low and all(g is not None and not g.any() for g in low)
    assert any(g is not None and g.any() for g in high)


def test_vgrpo_run_of_the_wan22_recipe_with_tiny_weights(model_dir, tmp_path) -> None:
    """``vgrpo run recipes/wan22_pickscore.toml`` (2 iterations) with the tiny pipeline and a tiny CLIP as
    PickScore: the recipe's own rewards (frame-wise PickScore + motion), CFG 4 / 3, LoRA on both experts."""
    from tiny_clip import save_clip

    clip_dir = save_clip(tmp_path / "clip")
    pickscore = f'{{model="{clip_dir}", processor="{clip_dir}"}}'
    overrides = [
        f'adapter.options.model="{model_dir}"',
        f"adapter.options.height={WAN_SIDE}",
        f"adapter.options.width={WAN_SIDE}",
        f"adapter.options.num_frames={WAN_FRAMES}",
        f"adapter.options.max_sequence_length={WAN_TOKENS}",
        f'rewards=[{{name="framewise", options={{reward="pickscore", frames=2, options={pickscore}}}}}, '
        '{name="motion", weight=2.0}]',
        *checks.cpu_run(tmp_path),
        "log.save_grids=false",
        "rollout.group_size=2",
        "rollout.prompts_per_iteration=2",
        "rollout.steps=3",
        "train.iterations=2",
        "train.micro_batch_size=4",
        "train.lora_rank=4",
        "eval.every=0",
        "eval.max_prompts=1",
    ]
    args = ["run", str(RECIPES / "wan22_pickscore.toml")] + [a for o in overrides for a in ("--set", o)]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    run_dir = tmp_path / "wan22_pickscore"
    checks.assert_trained(run_dir, 2)
    for folder in ("transformer", "transformer_2"):
        assert (run_dir / "final" / folder / "pytorch_lora_weights.safetensors").is_file()


def test_the_recipe_passes_check() -> None:
    result = CliRunner().invoke(cli.app, ["check", str(RECIPES / "wan22_pickscore.toml")])
    assert result.exit_code == 0 and result.output.strip().endswith("ok"), result.output
    assert "cfg_scale_2=3.0" in result.output and "train_experts=['high', 'low']" in result.output
