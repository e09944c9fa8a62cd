"""`vgrpo plan` against what can be measured on the CPU: a tiny FLUX built from its config. Parameter,
gradient and AdamW bytes must match a real model and a real optimiser step exactly; the activation
formula must fall within a factor of 2 of the saved tensors of a real forward; the command's output
names every shipped accelerate config and says whether it fits."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from benchmarks import throughput_models as models
from vgrpo_platform.cli import app as cli
from vgrpo_platform.cli import memory_estimate as mem
from vgrpo_platform.cli import plan

FLUX_RECIPE = """
[run]
mixed_precision = "no"

[adapter]
name = "flux"

[adapter.options]
model = "{model}"
dtype = "fp32"
resolution = 64
max_sequence_length = 8

[[rewards]]
name = "brightness"

[prompts]
train = ["a prompt"]

[train]
finetune = "{finetune}"
lora_rank = 4
micro_batch_size = 2
"""


@pytest.fixture
def flux_recipe(tmp_path, monkeypatch):
    """A recipe whose FLUX is the benchmark's tiny config, in a folder as the hub lays it out."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "tiny-flux" / "transformer"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps({"_class_name": "FluxTransformer2DModel", **models.TINY["flux"]})
    )

    def write(finetune: str = "lora"):
        path = tmp_path / f"flux_{finetune}.toml"
        path.write_text(FLUX_RECIPE.format(model=(tmp_path / "tiny-flux").as_posix(), finetune=finetune))
        return path

    return write


def _resolved(path):
    return cli._resolve(path, None)


def _real_flux():
    torch.manual_seed(0)
    return models.build_transformer(models.SPECS["flux"], tiny=True, device="cpu", dtype=torch.float32)


def _state_bytes(optimizer):
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for key, t in state.items()
        if key != "step"
    )


def _one_step(params, model):
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    model(**_inputs(model)).sample.float().square().mean().backward()
    optimizer.step()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    return grads, _state_bytes(optimizer)


def _inputs(model):
    cfg = model.config
    return {
        "hidden_states": torch.randn(1, 16, cfg.in_channels),
        "encoder_hidden_states": torch.randn(1, 8, cfg.joint_attention_dim),
        "pooled_projections": torch.randn(1, cfg.pooled_projection_dim),
        "timestep": torch.full((1,), 0.5),
        "img_ids": torch.zeros(16, 3),
        "txt_ids": torch.zeros(8, 3),
        "guidance": torch.full((1,), 3.5),
    }


def test_lora_bytes_match_a_real_model_and_optimiser_step_exactly(flux_recipe):
    from vgrpo_adapters.flux.impl import FluxAdapter

    from vgrpo_platform.finetune import attach_lora

    shape, how, measured = plan.denoiser_shape(_resolved(flux_recipe("lora")), None)
    assert "meta device" in how and measured is None
    model = _real_flux()
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.weight_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    params = attach_lora(model, rank=4, alpha=4, target_modules=list(FluxAdapter.lora_target_modules))
    assert shape.lora_params == sum(p.numel() for p in params)
    est = mem.estimate(shape, mem.Setup(finetune="lora"))
    grads, state = _one_step(params, model)
    assert (est.trainable, est.gradients, est.optimizer) == (4 * shape.lora_params, grads, state)


def test_full_finetune_bytes_match_a_real_optimiser_step_exactly(flux_recipe):
    shape, _, _ = plan.denoiser_shape(_resolved(flux_recipe("full")), None)
    model = _real_flux()
    params = list(model.parameters())
    est = mem.estimate(shape, mem.Setup(finetune="full"))
    grads, state = _one_step(params, model)
    assert (est.weights, est.gradients, est.optimizer) == (shape.weight_bytes, grads, state)


@pytest.mark.parametrize("key", ["flux", "wan", "sd3"])
def test_the_activation_formula_is_within_a_factor_of_two_of_saved_tensors(key, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = models.SPECS[key]
    adapter = models.build_adapter(spec, tiny=True, device="cpu", dtype=torch.float32)
    measured = plan.measured_activations(adapter, micro_batch=2)
    size = spec.tiny_size
    if key == "wan":
        image = ((size["frames"] - 1) // 4 + 1) * (size["height"] // 16) * (size["width"] // 16)
    else:
        image = (size["resolution"] // 16) ** 2
    shape = mem.shape_of(adapter.denoiser, 4, None)
    setup = mem.Setup(micro_batch=2, tokens=image + size["text_tokens"], compute_bytes=4)
    ratio = mem.activation_bytes(shape, setup) / measured
    assert 0.5 <= ratio <= 2.0, (key, ratio)


def test_sharding_divides_what_it_shards():
    shape = mem.DenoiserShape(
        params=10**9, weight_bytes=2 * 10**9, lora_params=0, hidden=64, layers=10, largest_block_bytes=10**8
    )
    full = {k: mem.estimate(shape, mem.Setup(finetune="full", gpus=8, sharding=k)) for k in mem.SHARDING}
    assert full["none"].gradients == 2 * 10**9 and full["none"].optimizer == 4 * 10**9
    assert full["zero2"].weights == 2 * 10**9 and full["zero2"].optimizer == 4 * 10**9 // 8
    assert full["fsdp2"].weights == 2 * 10**9 // 8 + 10**8
    offloaded = mem.estimate(shape, mem.Setup(reward_bytes=10**9, offload_rewards=True))
    resident = mem.estimate(shape, mem.Setup(reward_bytes=10**9))
    assert offloaded.rewards == 0 and resident.rewards == 10**9 and offloaded.peak <= resident.peak
    checkpointed = mem.Setup(tokens=100, checkpointing=True)
    assert mem.activation_bytes(shape, checkpointed) < mem.activation_bytes(shape, mem.Setup(tokens=100))
    # [parallel] context = 4: a process holds a quarter of each sample's tokens, and their activations
    whole, split = mem.Setup(tokens=100), mem.Setup(tokens=100, context=4)
    assert mem.activation_bytes(shape, split) * 4 == mem.activation_bytes(shape, whole)


def test_sizes_read_as_gib():
    assert plan.parse_size("80GiB") == plan.parse_size("80GB") == 80 * 2**30
    assert plan.parse_size("512MiB") == 2**29
    with pytest.raises(Exception, match="cannot read the size"):
        plan.parse_size("eighty")


def test_the_command_prints_an_estimate_and_a_verdict_per_accelerate_config(flux_recipe):
    runner = CliRunner()
    path = flux_recipe("lora")
    result = runner.invoke(cli.app, ["plan", str(path), "--gpu-memory", "80GiB", "--gpus", "8"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("ESTIMATE, not a measurement")
    assert "GiB per GPU on 8 GPUs:" in out and "on the meta device" in out
    for name in sorted(p.name for p in plan.Path(cli.ACCELERATE_DIR).glob("*.yaml")):
        assert f"  {name}" in out and name in [ln.split()[0] for ln in out.splitlines() if "GPUs" in ln]
    assert "does NOT fit" not in out and out.count("  fits") >= 4
    tiny = runner.invoke(cli.app, ["plan", str(path), "--gpu-memory", "64KiB"])
    assert tiny.exit_code == 0 and "does NOT fit" in tiny.stdout


def test_a_model_without_a_config_here_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    path = tmp_path / "r.toml"
    path.write_text(FLUX_RECIPE.format(model="nobody/not-a-model", finetune="lora"))
    result = CliRunner().invoke(cli.app, ["plan", str(path)])
    assert result.exit_code == 2 and result.stderr.startswith("error: no transformer config")
