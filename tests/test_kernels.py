"""``train.compile`` and ``train.attention_backend`` (vgrpo_platform/kernels.py) on a tiny FLUX transformer.

What is checked: the recipe keys are validated against the installed diffusers (one-line errors naming
the choices); "blocks" compiles exactly the model's repeated blocks, with the LoRA layers inside them;
"native" attention reaches every attention layer and predicts what the default does; a denoiser that
could not honour a switch (not a diffusers model; SD3, with no repeated blocks and its own attention
call) is stopped with a one-line error, in the session and in the rollout worker alike; and (slow:
inductor compiles on CPU) two training iterations compiled give the uncompiled run's losses, rewards,
gradient norms and update.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import adapter_checks as checks
import pytest
import torch
from diffusers.models.attention_dispatch import AttentionBackendName
from tiny_pipelines import RESOLUTION, build_tiny_flux
from vgrpo_adapters import flux as flux_entry
from vgrpo_adapters.flux import FluxAdapterConfig
from vgrpo_adapters.flux.impl import FluxAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform import kernels
from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.config.schema import TrainSection
from vgrpo_platform.errors import RecipeError, VgrpoError
from vgrpo_platform.finetune import make_trainable
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "flux_pickscore.toml"
TOKENS = 16


def config(model: Path) -> FluxAdapterConfig:
    return FluxAdapterConfig(model=str(model), resolution=RESOLUTION, max_sequence_length=TOKENS)


TINY_PIPELINE, ADAPTER = build_tiny_flux, FluxAdapter  # the conftest's model_dir fixture


def switches(compile: str = "off", attention_backend: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(compile=compile, attention_backend=attention_backend)


def fresh_adapter(model_dir: Path) -> FluxAdapter:
    adapter = checks.adapter_from_config(FluxAdapter, config(model_dir))
    make_trainable(adapter, TrainSection(lora_rank=4))
    return adapter


def test_attention_backend_is_checked_against_the_installed_diffusers() -> None:
    assert "native" in kernels.attention_backends()
    assert kernels.attention_backends() == [m.value for m in AttentionBackendName]
    assert TrainSection(attention_backend="NATIVE").attention_backend == "native"
    assert TrainSection().attention_backend is None and TrainSection().compile == "off"


def test_a_bad_attention_backend_or_compile_mode_is_one_line_naming_the_choices(tmp_path) -> None:
    registry = checks.registry_of(flux_entry, toy_rewards, surrogates_plugin)
    with pytest.raises(VgrpoError) as bad_backend:
        resolve_recipe(RECIPE, ['train.attention_backend="flashy"'], registry=registry)
    message = str(bad_backend.value)
    assert "\n" not in message and "train.attention_backend" in message and "flashy" in message
    assert "native" in message and "flash" in message  # the installed diffusers' choices
    with pytest.raises(VgrpoError) as bad_mode:
        resolve_recipe(RECIPE, ['train.compile="everything"'], registry=registry)
    assert "\n" not in str(bad_mode.value) and "'blocks'" in str(bad_mode.value)


def test_a_denoiser_that_is_not_a_diffusers_model_is_stopped_with_one_line() -> None:
    toy = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(RecipeError, match=r"train.compile = 'blocks' .* toy's denoiser Sequential") as err:
        kernels.apply_to_denoiser(toy, switches(compile="blocks"), "toy")
    assert "\n" not in str(err.value) and "set train.compile = 'off'" in str(err.value)
    with pytest.raises(RecipeError, match="train.attention_backend needs a diffusers model"):
        kernels.apply_to_denoiser(toy, switches(attention_backend="native"), "toy")
    assert kernels.apply_to_denoiser(toy, switches(), "toy") == []  # the defaults touch nothing


def test_a_diffusers_model_without_repeated_blocks_or_dispatched_attention_is_stopped() -> None:
    """SD3's transformer lists no repeated blocks and calls PyTorch's attention itself: neither switch
    would do anything, so both say so instead of running unchanged."""
    from diffusers import SD3Transformer2DModel

    sd3 = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16,
        pos_embed_max_size=8,
    )  # fmt: skip
    with pytest.raises(RecipeError, match="SD3Transformer2DModel has none"):
        kernels.apply_to_denoiser(sd3, switches(compile="blocks"), "sd3")
    with pytest.raises(RecipeError, match="no attention layer that goes through diffusers' .* dispatcher"):
        kernels.apply_to_denoiser(sd3, switches(attention_backend="native"), "sd3")


def test_a_backend_whose_package_is_missing_is_one_line(model_dir) -> None:
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    adapter = fresh_adapter(model_dir)
    with pytest.raises(RecipeError, match=r"train.attention_backend = 'flash': .*flash-attn") as err:
        kernels.apply_to_denoiser(adapter.denoiser, switches(attention_backend="flash"), "flux")
    assert "\n" not in str(err.value)


def test_native_attention_runs_and_predicts_what_the_default_does(model_dir) -> None:
    adapter = fresh_adapter(model_dir)
    cond = adapter.encode_prompts(["a red cat"])
    z, t = checks.seeded_noise((4, RESOLUTION // 2, RESOLUTION // 2), 1, seed=3), torch.tensor([0.6])
    with torch.no_grad():
        before = adapter.predict(z, t, cond)
        done = kernels.apply_to_denoiser(adapter.denoiser, switches(attention_backend="native"), "flux")
        after = adapter.predict(z, t, cond)
    assert done == ["attention backend: native (2 attention layers)"]
    processors = [m.processor for m in adapter.denoiser.modules() if hasattr(m, "processor")]
    assert processors and all(p._attention_backend == AttentionBackendName.NATIVE for p in processors)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_blocks_compiles_exactly_the_repeated_blocks_with_their_lora_layers(model_dir) -> None:
    adapter = fresh_adapter(model_dir)
    denoiser = adapter.denoiser
    done = kernels.apply_to_denoiser(denoiser, switches(compile="blocks"), "flux")
    repeated = [m for m in denoiser.modules() if type(m).__name__ in denoiser._repeated_blocks]
    assert repeated and kernels.compiled_blocks(denoiser) == repeated
    assert done == [
        f"compiled: {len(repeated)} repeated blocks (torch.compile; the first calls compile them)"
    ]
    assert all(any("lora_A" in n for n, _ in block.named_parameters()) for block in repeated)
    assert kernels.compiled_blocks(denoiser.x_embedder) == []  # the rest of the model stays eager


def test_the_session_applies_both_switches_where_the_core_builds_the_denoiser(model_dir, tmp_path) -> None:
    registry = checks.registry_of(flux_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path, *checks.size_options(RESOLUTION, TOKENS)),
        *checks.lora_iterations(1, 2, 2, 4),
        "train.compile=blocks",
        'train.attention_backend="native"',
    ]
    trainer = Trainer(resolve_recipe(RECIPE, overrides, registry=registry))
    network = trainer.session.adapter.network.module
    assert network is trainer.session.adapter.denoiser
    assert len(kernels.compiled_blocks(network)) == 2  # one FluxTransformerBlock, one single block
    assert trainer.session.speed[0].startswith("attention backend: native")


def test_the_rollout_worker_applies_the_same_switches_to_its_own_copy(monkeypatch) -> None:
    """The worker backend builds its own denoiser: the recipe's switches reach it too (here the toy
    model's SD3 transformer, which has no repeated blocks, so the worker reports the start-up error)."""
    from vgrpo_platform.protocols import BuildContext
    from vgrpo_platform.rollout_backends import worker

    toy = Path(__file__).resolve().parents[1] / "recipes" / "toy.toml"
    resolved = resolve_recipe(toy, ["train.compile=blocks"])
    monkeypatch.setattr(worker, "_WORKER", {})
    worker._start("toy", resolved.adapter.config, resolved.recipe.train, BuildContext(), None)
    assert "train.compile = 'blocks'" in (worker._ready() or "")


def short_run(model_dir: Path, tmp_path: Path, compile: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Two LoRA iterations of the tiny FLUX: the train records and the trained weights."""
    registry = checks.registry_of(flux_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path / compile, *checks.size_options(RESOLUTION, TOKENS)),
        *checks.two_iterations(),
        "eval.every=0",
        "eval.max_prompts=1",
        "log.save_grids=false",
        f"train.compile={compile}",
    ]
    trainer = Trainer(resolve_recipe(RECIPE, overrides, registry=registry))
    run_dir = trainer.run()
    weights = {name: p.detach().clone() for name, p in trainer.session.trainable.items()}
    return checks.assert_trained(run_dir, 2), weights


@pytest.mark.slow
def test_a_compiled_training_run_gives_the_uncompiled_losses(model_dir, tmp_path) -> None:
    """Inductor's fused kernels sum in another order: equal up to float32 rounding, not to the bit.
    The on-policy loss is ~1e-5 (the ratio is 1 and the advantages sum to zero), so it is compared with
    an absolute tolerance; the rewards, the gradient norms and the trained weights carry the signal."""
    torch._dynamo.reset()
    eager, eager_weights = short_run(model_dir, tmp_path, "off")
    compiled, compiled_weights = short_run(model_dir, tmp_path, "blocks")
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(b["loss"], a["loss"], rtol=0, atol=1e-4)
        torch.testing.assert_close(b["reward"], a["reward"], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(b["grad_norm"], a["grad_norm"], rtol=1e-3, atol=1e-6)
    assert eager_weights.keys() == compiled_weights.keys()
    # Adam's first steps move each weight by ~lr * sign(gradient), so a rounding difference in a gradient
    # element near zero moves that one element differently (seen: 1 of 128, by 2e-5 to 1e-4): compare the
    # whole update. LoRA's B matrices start at zero, so they are the update.
    names = sorted(n for n in eager_weights if "lora_B" in n)
    eager_update = torch.cat([eager_weights[n].flatten() for n in names])
    compiled_update = torch.cat([compiled_weights[n].flatten() for n in names])
    assert eager_update.norm() > 0
    assert (compiled_update - eager_update).norm() <= 1e-2 * eager_update.norm()
