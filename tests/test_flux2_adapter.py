"""The ``flux2`` and ``flux2_klein`` adapters on tiny FLUX.2 pipelines built from configs, saved, and loaded
through the real path.

Independent references: diffusers' own ``Flux2Pipeline.__call__`` / ``Flux2KleinPipeline.__call__``
(rollouts, with embedded guidance and with true CFG), the transformer calls those pipelines make
(recorded with a forward hook), the scheduler fed the pipelines' empirical ``mu`` (timestep grid), and a
freshly loaded pipeline with ``load_lora_weights`` (export).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import adapter_checks as checks
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu
from diffusers.utils import logging as diffusers_logging
from tiny_flux2 import DEV_TOKENS, KLEIN_TOKENS, LATENT, build_tiny_flux2, build_tiny_flux2_klein
from tiny_pipelines import RESOLUTION
from vgrpo_adapters import flux2 as flux2_entry
from vgrpo_adapters._diffusers_common import ModelWeightsError
from vgrpo_adapters.flux2 import Flux2AdapterConfig, Flux2KleinAdapterConfig
from vgrpo_adapters.flux2.impl import Flux2Adapter, Flux2KleinAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.protocols import BuildContext, SamplerSpec
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
PROMPTS = ["a red cat", "a blue dog on a hill", "a red cat"]
STEPS = 4  # rollout steps in the tests (and the shift_steps that match them)


def dev_config(model: Path, **options) -> Flux2AdapterConfig:
    return Flux2AdapterConfig(
        model=str(model), resolution=RESOLUTION, max_sequence_length=DEV_TOKENS, shift_steps=STEPS, **options
    )


def klein_config(model: Path, **options) -> Flux2KleinAdapterConfig:
    return Flux2KleinAdapterConfig(
        model=str(model),
        resolution=RESOLUTION,
        max_sequence_length=KLEIN_TOKENS,
        shift_steps=STEPS,
        **options,
    )


@pytest.fixture(scope="module")
def dev_dir(tmp_path_factory) -> Path:
    return build_tiny_flux2(tmp_path_factory.mktemp("flux2") / "pipe")


@pytest.fixture(scope="module")
def klein_dir(tmp_path_factory) -> Path:
    return build_tiny_flux2_klein(tmp_path_factory.mktemp("flux2_klein") / "pipe")


@pytest.fixture(scope="module")
def dev(dev_dir) -> Flux2Adapter:
    return Flux2Adapter.from_config(dev_config(dev_dir), BuildContext())


@pytest.fixture(scope="module")
def klein(klein_dir) -> Flux2KleinAdapter:
    return Flux2KleinAdapter.from_config(klein_config(klein_dir, cfg_scale=3.0), BuildContext())


noise = partial(checks.seeded_noise, LATENT)


@contextmanager
def transformer_calls(pipe) -> Iterator[list[tuple[dict, torch.Tensor]]]:
    """Every (tensor keyword inputs, output) of ``pipe.transformer`` inside the ``with`` block."""
    calls: list[tuple[dict, torch.Tensor]] = []

    def hook(module, args, kwargs, output) -> None:
        calls.append(({k: v for k, v in kwargs.items() if torch.is_tensor(v)}, output[0]))

    handle = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def test_both_names_register_with_documented_configs_and_a_torch_free_entry_module(dev_dir) -> None:
    checks.assert_registered(flux2_entry, "flux2", dev_config(dev_dir), Flux2Adapter)
    klein = checks.registry_of(flux2_entry).get("adapter", "flux2_klein").config
    assert klein is Flux2KleinAdapterConfig and all(
        field.description for field in klein.model_fields.values()
    )
    checks.assert_invalid(Flux2AdapterConfig, {"resolution": 520})  # not a multiple of 16
    checks.assert_invalid(Flux2KleinAdapterConfig, {"cfg_scale": 0.5}, {"unknown": 1})


def test_shapes_packing_position_ids_and_frozen_parts(dev) -> None:
    assert dev.latent_shape() == LATENT  # [4C, H/2f, W/2f]: the pipeline's patchified latents
    assert dev.dtype == torch.float32  # "auto" on the CPU
    cond = dev.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape == (3, DEV_TOKENS, 48)  # three stacked hidden layers of width 16
    torch.testing.assert_close(cond["prompt_embeds"][0], cond["prompt_embeds"][2])
    checks.assert_frozen_text_encoders_and_vae(dev)
    z = noise(2)
    tokens, ids = dev.pipe.prepare_latents(2, LATENT[0] // 4, RESOLUTION, RESOLUTION, z.dtype, "cpu", None, z)
    assert torch.equal(dev.pack(z), tokens) and torch.equal(dev.img_ids, ids[0])
    assert torch.equal(dev.unpack(tokens), Flux2Pipeline._unpack_latents_with_ids(tokens, ids))
    assert dev.img_ids.shape == (LATENT[1] * LATENT[2], 4)
    samples = dev.decode(dev.sample(z, {k: v[:2] for k, v in cond.items()}, SamplerSpec("euler", 2)))
    assert samples.modality == "image" and samples.data.shape == (2, 3, RESOLUTION, RESOLUTION)
    assert 0 <= samples.data.min() and samples.data.max() <= 1


def test_shift_is_the_pipelines_empirical_mu_at_shift_steps(dev, dev_dir) -> None:
    seq_len = LATENT[1] * LATENT[2]
    mu = compute_empirical_mu(seq_len, STEPS)
    assert dev.schedule.shift == pytest.approx(math.exp(mu))
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(dev_dir / "scheduler")
    grid = torch.linspace(1.0, 1 / STEPS, STEPS)  # the pipeline's sigmas before shifting
    scheduler.set_timesteps(sigmas=grid.tolist(), mu=mu)
    torch.testing.assert_close(dev.schedule.warp(grid), scheduler.sigmas[:-1], atol=1e-6, rtol=1e-6)
    pipe = Flux2Pipeline.from_pretrained(dev_dir)
    at_50 = Flux2Adapter(pipe, resolution=RESOLUTION, shift_steps=50)
    assert at_50.schedule.shift == pytest.approx(math.exp(compute_empirical_mu(seq_len, 50)))
    assert abs(at_50.schedule.shift - dev.schedule.shift) > 0.1  # the step count matters
    assert Flux2Adapter(pipe, resolution=RESOLUTION, shift=2.5).schedule.shift == 2.5


def test_dev_rollout_and_decode_equal_the_pipeline_with_embedded_guidance(dev) -> None:
    z = noise(1, seed=3)
    image = dev.decode(dev.sample(z, dev.encode_prompts(["a red cat"]), SamplerSpec("euler", STEPS))).data
    call = partial(
        checks.pipeline_output,
        dev.pipe,
        "a red cat",
        RESOLUTION,
        z,
        num_inference_steps=STEPS,
        max_sequence_length=DEV_TOKENS,
    )
    reference = call(guidance_scale=4.0).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)
    other = call(guidance_scale=1.0).images
    assert (other - reference).abs().max() > 1e-3  # the guidance value reaches the transformer


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_klein_rollout_and_decode_equal_the_pipeline_with_and_without_true_cfg(klein_dir, cfg_scale) -> None:
    adapter = Flux2KleinAdapter.from_config(klein_config(klein_dir, cfg_scale=cfg_scale), BuildContext())
    z = noise(2, seed=4)
    cond = adapter.encode_prompts(PROMPTS[:2])
    image = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", STEPS))).data
    reference = checks.pipeline_output(
        adapter.pipe,
        PROMPTS[:2],
        RESOLUTION,
        z,
        num_inference_steps=STEPS,
        guidance_scale=cfg_scale,
        max_sequence_length=KLEIN_TOKENS,
    ).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)


def test_predict_equals_the_transformer_called_as_the_dev_pipeline_calls_it(dev) -> None:
    with transformer_calls(dev.pipe) as calls:
        checks.pipeline_output(
            dev.pipe,
            PROMPTS[:2],
            RESOLUTION,
            noise(2, seed=5),
            "latent",
            num_inference_steps=3,
            guidance_scale=4.0,
            max_sequence_length=DEV_TOKENS,
        )
    assert len(calls) == 3
    cond = dev.encode_prompts(PROMPTS[:2])
    for inputs, output in calls:  # each step's (x_t, t), as the pipeline packs and scales them
        x_t = dev.unpack(inputs["hidden_states"])
        with torch.no_grad():
            v = dev.predict(x_t, inputs["timestep"], cond)
        torch.testing.assert_close(v, dev.unpack(output), atol=1e-6, rtol=1e-5)
    # and at an arbitrary (x_t, t), against the pipeline's own ids, embeddings and guidance
    z, t = noise(2, seed=6), torch.tensor([0.83, 0.21])
    embeds, text_ids = dev.pipe.encode_prompt(PROMPTS[:2], max_sequence_length=DEV_TOKENS)
    tokens, ids = dev.pipe.prepare_latents(2, LATENT[0] // 4, RESOLUTION, RESOLUTION, z.dtype, "cpu", None, z)
    with torch.no_grad():
        direct = dev.pipe.transformer(
            hidden_states=tokens,
            timestep=t,
            guidance=torch.full([2], 4.0),
            encoder_hidden_states=embeds,
            txt_ids=text_ids,
            img_ids=ids,
            return_dict=False,
        )[0]
        torch.testing.assert_close(dev.predict(z, t, cond), dev.unpack(direct), atol=1e-6, rtol=1e-5)


def test_klein_guided_prediction_equals_the_pipelines_cfg_combination(klein) -> None:
    z = noise(1, seed=7)
    with transformer_calls(klein.pipe) as calls:
        checks.pipeline_output(
            klein.pipe,
            "a red cat",
            RESOLUTION,
            z,
            "latent",
            num_inference_steps=1,
            guidance_scale=3.0,
            max_sequence_length=KLEIN_TOKENS,
        )
    (cond_in, cond_out), (null_in, null_out) = calls  # conditional, then the empty prompt
    assert not torch.equal(cond_in["encoder_hidden_states"], null_in["encoder_hidden_states"])
    cond = klein.encode_prompts(["a red cat"])
    t = cond_in["timestep"]
    with torch.no_grad():
        torch.testing.assert_close(klein.predict(z, t, cond), klein.unpack(cond_out), atol=1e-6, rtol=1e-5)
        guided = klein.guided_velocity(z, t, cond)
    expected = klein.unpack(null_out + 3.0 * (cond_out - null_out))
    torch.testing.assert_close(guided, expected, atol=1e-6, rtol=1e-5)
    klein.cfg_in_training = True
    try:
        with torch.no_grad():
            torch.testing.assert_close(klein.predict(z, t, cond), guided)
    finally:
        klein.cfg_in_training = False


@pytest.mark.parametrize("variant", ["dev", "klein", "klein_cfg"])
def test_a_micro_batch_of_mixed_length_prompts_trains_as_its_rows_one_by_one(
    dev_dir, klein_dir, variant
) -> None:
    """``train.micro_batch_size`` k gives the loss and LoRA gradients of k micro-batches of one row."""
    if variant == "dev":
        adapter_class, built = Flux2Adapter, dev_config(dev_dir)
    else:
        cfg = {"cfg_scale": 2.0, "cfg_in_training": True} if variant == "klein_cfg" else {}
        adapter_class, built = Flux2KleinAdapter, klein_config(klein_dir, **cfg)
    checks.assert_micro_batch_equals_single_rows(adapter_class, built, checks.MIXED_LENGTH_PROMPTS)


def test_step_distilled_klein_refuses_cfg(tmp_path) -> None:
    folder = build_tiny_flux2_klein(tmp_path / "distilled", is_distilled=True)
    with pytest.raises(ValueError, match="step-distilled"):
        Flux2KleinAdapter.from_config(klein_config(folder, cfg_scale=4.0), BuildContext())
    assert Flux2KleinAdapter.from_config(klein_config(folder), BuildContext()).cfg_scale == 1.0


def test_text_embeddings_are_cached_per_prompt(klein) -> None:
    klein.prompt_cache.rows.clear()
    calls: list[list[str]] = []
    encode = klein._encode
    klein._encode = lambda prompts: calls.append(list(prompts)) or encode(prompts)
    try:
        first = klein.encode_prompts(PROMPTS)
        again = klein.encode_prompts(["a blue dog on a hill", "a new one"])
    finally:
        del klein._encode
    assert calls == [["a red cat", "a blue dog on a hill"], ["a new one"]]
    torch.testing.assert_close(again["prompt_embeds"][0], first["prompt_embeds"][1])
    torch.testing.assert_close(
        again["prompt_embeds"][0], encode(["a blue dog on a hill"])["prompt_embeds"][0]
    )


def test_decode_undoes_the_batch_norm_and_the_patchifying_in_chunks(dev) -> None:
    latents = noise(3, seed=8)
    dev.decode_chunk_size = 2
    chunked = dev.decode(latents).data
    dev.decode_chunk_size = 4
    vae = dev.vae
    std = (vae.bn.running_var + vae.config.batch_norm_eps).sqrt().view(1, -1, 1, 1)
    x = latents * std + vae.bn.running_mean.view(1, -1, 1, 1)  # [B, 4C, h, w]
    x = (
        x.view(3, 4, 2, 2, LATENT[1], LATENT[2])
        .permute(0, 1, 4, 2, 5, 3)
        .reshape(3, 4, *(2 * LATENT[1],) * 2)
    )
    with torch.no_grad():
        direct = vae.decode(x).sample
    torch.testing.assert_close(chunked, ((direct + 1) / 2).clamp(0, 1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", ["dev", "klein"])
def test_lora_export_loads_with_the_pipelines_loader_and_generates_the_same(
    variant, dev_dir, klein_dir, tmp_path
) -> None:
    cls, folder, cfg, pipeline, tokens, guidance = {  # the adapters' defaults: guidance 4 / no CFG
        "dev": (Flux2Adapter, dev_dir, dev_config, Flux2Pipeline, DEV_TOKENS, 4.0),
        "klein": (Flux2KleinAdapter, klein_dir, klein_config, Flux2KleinPipeline, KLEIN_TOKENS, 1.0),
    }[variant]
    adapter = cls.from_config(cfg(folder), BuildContext())
    checks.attach_trained_lora(adapter)
    assert any("to_qkv_mlp_proj.lora_A" in n for n, _ in adapter.denoiser.named_parameters())
    checks.export_lora(adapter, tmp_path / "final")
    z = noise(1, seed=9)
    image = adapter.decode(
        adapter.sample(z, adapter.encode_prompts(["a red cat"]), SamplerSpec("euler", STEPS))
    )
    fresh = pipeline.from_pretrained(folder)
    call = partial(
        checks.pipeline_output,
        fresh,
        "a red cat",
        RESOLUTION,
        z,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        max_sequence_length=tokens,
    )
    base = call().images
    fresh.load_lora_weights(tmp_path / "final")  # rank and alpha come from the file's metadata
    loaded = call().images
    assert (image.data - base).abs().max() > 1e-3  # the LoRA changes the images
    torch.testing.assert_close(loaded, image.data, atol=1e-5, rtol=1e-5)


def test_full_finetune_export_is_a_transformer_folder(dev_dir, tmp_path) -> None:
    checks.assert_full_export_reloads(Flux2Adapter, dev_config(dev_dir), tmp_path / "final")


def test_resolution_and_missing_weights_errors(dev_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="divisible by 4"):
        Flux2Adapter(Flux2Pipeline.from_pretrained(dev_dir), resolution=34)
    with pytest.raises(ModelWeightsError, match="Flux2Pipeline.*no/such-flux2.*huggingface-cli download"):
        Flux2Adapter.from_config(Flux2AdapterConfig(model="no/such-flux2"), BuildContext())
    with pytest.raises(ModelWeightsError, match="model_index.json"):
        Flux2KleinAdapter.from_config(Flux2KleinAdapterConfig(model=str(tmp_path)), BuildContext())


@pytest.mark.parametrize(
    ("recipe", "name"), [("flux2_pickscore.toml", "dev"), ("flux2_klein_pickscore.toml", "klein")]
)
def test_recipe_runs_two_iterations_end_to_end_and_exports_a_loadable_lora(
    recipe, name, dev_dir, klein_dir, tmp_path
) -> None:
    """The shipped recipe (LoRA, gradient checkpointing; klein: true CFG in rollouts and training) with
    the tiny weights substituted by ``--set``-style overrides; the exported LoRA reproduces the trained
    predictions through the pipeline's own loader."""
    folder, tokens = (dev_dir, DEV_TOKENS) if name == "dev" else (klein_dir, KLEIN_TOKENS)
    registry = checks.registry_of(flux2_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(
            folder,
            tmp_path,
            *checks.size_options(RESOLUTION, tokens),
            "adapter.options.shift_steps=2",
        ),
        *checks.two_iterations(steps=2),
        "eval.max_prompts=1",
        "eval.every=0",
        "eval.steps=2",
    ]
    resolved = resolve_recipe(RECIPES / recipe, overrides, registry=registry)
    assert resolved.recipe.rollout.sampler == "euler" and resolved.recipe.train.gradient_checkpointing
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    checks.assert_trained(run_dir, 2)
    adapter = trainer.session.adapter
    assert adapter.denoiser.is_gradient_checkpointing
    cls = type(adapter)
    fresh = cls(
        cls.pipeline_class.from_pretrained(folder), **cls.options_from_config(resolved.adapter.config)
    )
    cond = adapter.encode_prompts(PROMPTS[:2])
    z, t = noise(2, seed=10), torch.tensor([0.5, 0.7])
    load = partial(fresh.pipe.load_lora_weights, run_dir / "final")
    checks.assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("recipe", ["flux2_pickscore.toml", "flux2_klein_pickscore.toml"])
def test_shipped_recipes_pass_check_with_the_real_reward_plugin(recipe) -> None:
    registry = checks.registry_of(flux2_entry, surrogates_plugin, checks.reward_plugin_or_skip("pickscore"))
    resolved = resolve_recipe(RECIPES / recipe, registry=registry)
    r, options = resolved.recipe, resolved.adapter.config
    assert options.shift_steps == r.rollout.steps == 8 and r.rollout.group_size == 16  # Flow-Factory's
    assert (r.train.lora_rank, r.train.lora_alpha, r.train.lr, r.train.weight_decay) == (64, 128, 3e-4, 1e-4)
    assert options.offload_text_encoders and len(resolved.train_prompts) >= 32
    if recipe == "flux2_pickscore.toml":
        assert (options.resolution, options.guidance) == (512, 4.0)
    else:
        assert (options.resolution, options.cfg_scale, options.cfg_in_training) == (384, 4.0, True)


@pytest.mark.gpu
def test_real_flux2_klein_on_cuda() -> None:
    """FLUX.2-klein-4B (or VGRPO_FLUX2_KLEIN_MODEL) at 512 px: a LoRA rollout and a gradient."""
    model = os.environ.get("VGRPO_FLUX2_KLEIN_MODEL", "black-forest-labs/FLUX.2-klein-4B")
    adapter = checks.cuda_adapter_or_skip(Flux2KleinAdapter, Flux2KleinAdapterConfig(model=model))
    assert adapter.latent_shape() == (128, 32, 32)
    checks.assert_lora_rollout_and_gradient_on_cuda(adapter, SamplerSpec("euler", 4))
