"""The ``toy`` adapter: real diffusers/transformers classes at toy size, loaded through from_pretrained."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from adapter_checks import directional_derivatives
from vgrpo_adapters import toy as toy_entry
from vgrpo_adapters._weights import ModelWeightsError
from vgrpo_adapters.toy import ToyAdapterConfig
from vgrpo_adapters.toy.build import BUILD_FILE, build_toy_model
from vgrpo_adapters.toy.impl import ToyAdapter

from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import Adapter, BuildContext, SamplerSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")

R = 16
PROMPTS = ["a red square", "a blue circle", "green", "a red square"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_toy_model(tmp_path_factory.mktemp("toy") / "model", seed=0, resolution=R)


@pytest.fixture(scope="module")
def adapter(model_dir) -> ToyAdapter:
    return ToyAdapter.load(model_dir)


@pytest.fixture(scope="module")
def cond(adapter):
    return adapter.encode_prompts(PROMPTS)


def noise(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, R, R, generator=torch.Generator().manual_seed(seed))


def test_registered_through_the_hook_with_its_config() -> None:
    registry = collect_components(build_plugin_manager(load_entry_points=False, extra_plugins=[toy_entry]))
    spec = registry.get("adapter", "toy")
    assert spec.config is ToyAdapterConfig
    assert all(field.description for field in ToyAdapterConfig.model_fields.values())
    built = registry.build("adapter", "toy", {"resolution": R}, BuildContext())
    assert isinstance(built, ToyAdapter)


def test_entry_module_does_not_import_torch() -> None:
    code = "import vgrpo_adapters.toy, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_satisfies_protocol_and_shapes(adapter, cond) -> None:
    assert isinstance(adapter, Adapter)
    assert adapter.modality == "image" and adapter.denoiser is not adapter.text_encoder
    assert adapter.latent_shape() == (3, R, R)
    b = len(PROMPTS)
    assert cond["prompt_embeds"].shape == (b, adapter.max_prompt_tokens, 32)
    assert cond["pooled_prompt_embeds"].shape == (b, 32)
    assert all(not v.requires_grad for v in cond.values())
    z = noise(b)
    assert adapter.predict(z, torch.rand(b), cond).shape == z.shape
    latents = adapter.sample(z, cond, SamplerSpec("euler", 3))
    assert latents.shape == z.shape and not latents.requires_grad
    samples = adapter.decode(latents)
    assert samples.modality == "image" and samples.data.shape == (b, 3, R, R)
    torch.testing.assert_close(samples.data, ((latents + 1) / 2).clamp(0, 1))
    assert samples.data.min() >= 0 and samples.data.max() <= 1


def test_lora_targets_exist_in_the_denoiser(adapter) -> None:
    names = [name for name, _ in adapter.denoiser.named_modules()]
    for target in adapter.lora_target_modules:
        assert any(name == target or name.endswith("." + target) for name in names), target


def test_save_and_reload_gives_identical_predictions(adapter, cond, tmp_path) -> None:
    adapter.denoiser.save_pretrained(tmp_path / "transformer")
    adapter.text_encoder.save_pretrained(tmp_path / "text_encoder")
    adapter.tokenizer.save_pretrained(tmp_path / "tokenizer")
    reloaded = ToyAdapter.from_config(ToyAdapterConfig(model_path=str(tmp_path)), BuildContext())
    cond2 = reloaded.encode_prompts(PROMPTS)
    for key in cond:
        assert torch.equal(cond[key], cond2[key]), key
    z, t = noise(len(PROMPTS)), torch.tensor([0.1, 0.4, 0.7, 1.0])
    with torch.no_grad():
        assert torch.equal(adapter.predict(z, t, cond), reloaded.predict(z, t, cond2))


def test_full_finetune_export_is_a_model_folder_that_predicts_as_trained(model_dir, cond, tmp_path) -> None:
    """Full fine-tuning exports a whole toy model folder: ``model_path`` loads the trained model from it."""
    from vgrpo_platform.finetune import enable_full_finetune

    trained = ToyAdapter.load(model_dir)
    enable_full_finetune(trained.denoiser)
    with torch.no_grad():
        trained.denoiser.proj_out.weight.add_(0.1)
    trained.export_trained(tmp_path / "final")
    assert json.loads((tmp_path / "final" / "vgrpo_export.json").read_text())["kind"] == "full"
    reloaded = ToyAdapter.from_config(ToyAdapterConfig(model_path=str(tmp_path / "final")), BuildContext())
    z, t = noise(len(PROMPTS)), torch.tensor([0.1, 0.4, 0.7, 1.0])
    with torch.no_grad():
        base = ToyAdapter.load(model_dir).predict(z, t, cond)
        expected = trained.predict(z, t, cond)
        assert (expected - base).abs().max() > 1e-3
        assert torch.equal(reloaded.predict(z, t, cond), expected)


def test_build_is_deterministic_and_seeded(adapter, tmp_path) -> None:
    same = ToyAdapter.from_config(ToyAdapterConfig(init_seed=0), BuildContext())
    other = ToyAdapter.from_config(ToyAdapterConfig(init_seed=1), BuildContext())
    ref = adapter.denoiser.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in same.denoiser.state_dict().items())
    assert not all(torch.equal(ref[k], v) for k, v in other.denoiser.state_dict().items())


def test_run_dir_cache_is_built_once_and_reused(tmp_path) -> None:
    context = BuildContext(run_dir=tmp_path)
    ToyAdapter.from_config(ToyAdapterConfig(), context)
    marker = tmp_path / "toy_model" / BUILD_FILE
    weights = tmp_path / "toy_model" / "transformer" / "diffusion_pytorch_model.safetensors"
    assert marker.is_file() and weights.is_file()
    stamp = weights.stat().st_mtime_ns
    ToyAdapter.from_config(ToyAdapterConfig(), context)
    assert weights.stat().st_mtime_ns == stamp  # reused, not rebuilt
    ToyAdapter.from_config(ToyAdapterConfig(num_layers=2), context)  # other knobs: rebuilt in place
    assert '"num_layers": 2' in marker.read_text()


def test_relative_model_path_resolves_against_recipe_dir(model_dir) -> None:
    context = BuildContext(recipe_dir=model_dir.parent)
    built = ToyAdapter.from_config(ToyAdapterConfig(model_path=model_dir.name), context)
    assert built.latent_shape() == (3, R, R)
    with pytest.raises(ModelWeightsError, match="nowhere lacks transformer/"):
        ToyAdapter.from_config(ToyAdapterConfig(model_path="nowhere"), context)


def test_resolution_beyond_the_position_table_is_refused(model_dir) -> None:
    with pytest.raises(ValueError, match="resolution 32"):
        ToyAdapter.load(model_dir, resolution=32)
    smaller = ToyAdapter.load(model_dir, resolution=8)  # SD3 crops its position table
    assert smaller.predict(torch.zeros(1, 3, 8, 8), torch.ones(1), smaller.encode_prompts(["x"])).shape == (
        1,
        3,
        8,
        8,
    )


def test_config_rejects_bad_options() -> None:
    with pytest.raises(ValueError):
        ToyAdapterConfig(resolution=15)
    with pytest.raises(ValueError):
        ToyAdapterConfig(unknown=1)


def test_prompts_change_conditioning_and_prediction(adapter, cond) -> None:
    pooled = cond["pooled_prompt_embeds"]
    assert torch.equal(pooled[0], pooled[3])  # same prompt
    assert not torch.allclose(pooled[0], pooled[1]) and not torch.allclose(pooled[1], pooled[2])
    alone = adapter.encode_prompts(["a blue circle"])  # rows do not depend on the batch
    torch.testing.assert_close(alone["prompt_embeds"][0], cond["prompt_embeds"][1])
    z = noise(1).expand(4, -1, -1, -1)
    with torch.no_grad():
        out = adapter.predict(z, torch.full((4,), 0.5), cond)
    torch.testing.assert_close(out[0], out[3])
    assert (out[0] - out[1]).abs().max() > 1e-4
    with torch.no_grad():  # and time matters
        assert (adapter.predict(z, torch.full((4,), 0.2), cond) - out).abs().max() > 1e-4


def test_predict_gradients_reach_transformer_only(model_dir) -> None:
    adapter = ToyAdapter.load(model_dir)
    cond = adapter.encode_prompts(PROMPTS[:2])
    out = adapter.predict(noise(2), torch.tensor([0.3, 0.8]), cond)
    out.square().mean().backward()
    assert all(p.grad is None and not p.requires_grad for p in adapter.text_encoder.parameters())
    attn = adapter.denoiser.transformer_blocks[0].attn
    for module in (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0], adapter.denoiser.proj_out):
        assert module.weight.grad is not None and module.weight.grad.abs().sum() > 0


def test_predict_gradient_matches_finite_differences(model_dir) -> None:
    adapter = ToyAdapter.load(model_dir, dtype=torch.float64)
    cond = adapter.encode_prompts(PROMPTS[:2])
    assert cond["prompt_embeds"].dtype == torch.float64
    z, t = noise(2).double(), torch.tensor([0.3, 0.8])
    analytic, numeric = directional_derivatives(adapter, z, t, cond, h=1e-5)
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_sampling_is_deterministic_and_matches_a_manual_euler_loop(adapter, cond) -> None:
    z = noise(len(PROMPTS))
    spec = SamplerSpec("euler", 4)
    a, b = adapter.sample(z, cond, spec), adapter.sample(z, cond, spec)
    assert torch.equal(a, b)
    assert not torch.allclose(a, adapter.sample(noise(len(PROMPTS), seed=1), cond, spec))
    grid = torch.linspace(1.0, 0.0, 5)  # shift 1: uniform grid
    manual = z.clone()
    with torch.no_grad():
        for i in range(4):
            manual = manual + (grid[i + 1] - grid[i]) * adapter.predict(manual, grid[i].expand(4), cond)
    torch.testing.assert_close(a, manual, atol=1e-5, rtol=1e-5)
    for name in ("dpmsolver++", "unipc"):
        assert adapter.sample(z, cond, SamplerSpec(name, 4)).shape == z.shape


def test_shift_reaches_schedule_and_sampler(model_dir) -> None:
    shifted = ToyAdapter.load(model_dir, shift=3.0)
    assert shifted.schedule.shift == 3.0
    cond = shifted.encode_prompts(["x"])
    seen = []
    original = shifted.predict
    shifted.predict = lambda z, t, c: seen.append(float(t[0])) or original(z, t, c)
    shifted.sample(noise(1), cond, SamplerSpec("euler", 2))
    assert seen == pytest.approx([1.0, 0.75])  # warp(0.5) = 3 * 0.5 / (1 + 2 * 0.5)
