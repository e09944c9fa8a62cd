"""Set-up and checks the diffusers adapter tests share (flux, flux2, sd3, qwen_image, wan, hunyuan, audio).

Each adapter's test module says what is particular to its model (configs, tolerances, how a LoRA loads
back); the steps every one of them repeats (a registry of some plugins, a LoRA with non-zero ``B``, the
trained / base / reloaded prediction comparison, the full fine-tuning export, the CPU run overrides and
the finished run's records) are written once here. ``conftest.py`` builds a module's tiny pipeline and
adapter from its ``TINY_PIPELINE``, ``ADAPTER`` and ``config``.
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from vgrpo_adapters._diffusers_common import EXPORT_INFO, ModelWeightsError

from vgrpo_platform import finetune
from vgrpo_platform.cli.sample import sample_to_folder
from vgrpo_platform.conditions import encode_conditioned
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager
from vgrpo_platform.protocols import Adapter, BuildContext, SamplerSpec
from vgrpo_platform.training.observe.metrics import read_metrics


def adapter_from_config(adapter_class: type, config: Any) -> Any:
    """What the adapter's factory does with ``config`` in a default (CPU) build context."""
    return adapter_class.from_config(config, BuildContext())


def registry_of(*plugins: Any) -> Any:
    """A registry of exactly these plugin modules (no installed entry points)."""
    return collect_components(build_plugin_manager(load_entry_points=False, extra_plugins=list(plugins)))


def reward_plugin_or_skip(name: str) -> Any:
    """``vgrpo_rewards.<name>``, or skip the test while that reward plugin is not written yet."""
    try:
        module = importlib.import_module(f"vgrpo_rewards.{name}")
    except ImportError:
        module = None
    if not hasattr(module, "register_components"):
        pytest.skip(f"reward plugin {name} is not written yet")
    return module


def assert_registered(entry: Any, name: str, config: Any, adapter_class: type) -> Any:
    """``name`` is registered by ``entry`` with ``config``'s class, every option is documented, the
    registry builds an ``adapter_class`` from the dumped options, and importing ``entry`` loads no torch.
    Returns the built adapter for the caller's own checks."""
    config_class = type(config)
    registry = registry_of(entry)
    assert registry.get("adapter", name).config is config_class
    assert all(field.description for field in config_class.model_fields.values())
    built = registry.build("adapter", name, config.model_dump(), BuildContext())
    assert isinstance(built, adapter_class) and isinstance(built, Adapter)
    code = f"import {entry.__name__}, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    return built


def assert_invalid(config_class: type, *options: dict[str, Any]) -> None:
    """``config_class`` refuses each of ``options`` with a ``ValueError``."""
    for kwargs in options:
        with pytest.raises(ValueError):
            config_class(**kwargs)


def size_options(resolution: int, tokens: int) -> list[str]:
    """The recipe overrides of an adapter's size and text token count."""
    return [f"adapter.options.resolution={resolution}", f"adapter.options.max_sequence_length={tokens}"]


def pipeline_output(
    pipe: Any, prompt: Any, side: int, latents: torch.Tensor, output_type: str = "pt", **options: Any
) -> Any:
    """The diffusers pipeline's own ``__call__`` for ``prompt`` at ``side`` x ``side`` pixels from
    ``latents`` (``options``: its other arguments)."""
    return pipe(prompt=prompt, height=side, width=side, latents=latents, output_type=output_type, **options)


def seeded_noise(shape: tuple[int, ...], batch: int, seed: int = 0, dtype: torch.dtype = torch.float32):
    """``[batch, *shape]`` standard normal noise from its own seeded generator."""
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_frozen_text_encoders_and_vae(adapter: Any) -> None:
    """No parameter of the adapter's text encoders or VAE requires a gradient."""
    assert all(not p.requires_grad for enc in adapter.text_encoders for p in enc.parameters())
    assert all(not p.requires_grad for p in adapter.vae.parameters())


def assert_images_from_noise(adapter: Any, z: torch.Tensor, cond: dict[str, torch.Tensor], side: int) -> None:
    """From noise ``z``: a prediction of its shape, and a 2-step Euler rollout that decodes to float32
    ``side`` x ``side`` RGB images in ``[0, 1]``."""
    assert adapter.predict(z, torch.rand(len(z)), cond).shape == z.shape
    samples = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 2)))
    assert samples.modality == "image" and samples.data.shape == (len(z), 3, side, side)
    assert samples.data.dtype == torch.float32 and 0 <= samples.data.min() and samples.data.max() <= 1


def assert_cache_can_be_off(adapter_class: type, config: Any, prompts: Sequence[str]) -> None:
    """An adapter built from ``config`` (``cache_text_embeddings=False``) keeps no text embeddings."""
    uncached = adapter_from_config(adapter_class, config)
    uncached.encode_prompts(prompts)
    assert len(uncached.prompt_cache) == 0


def decode_in_chunks(adapter: Any, latents: torch.Tensor, chunk: int = 2, whole: int = 8) -> torch.Tensor:
    """``latents`` decoded ``chunk`` at a time equal them decoded ``whole`` at a time (all at once);
    returns the latter's data. Leaves the adapter's ``decode_chunk_size`` at ``whole``."""
    adapter.decode_chunk_size = chunk
    chunked = adapter.decode(latents).data
    adapter.decode_chunk_size = whole
    decoded = adapter.decode(latents).data
    torch.testing.assert_close(chunked, decoded, atol=1e-6, rtol=1e-5)
    return decoded


def directional_derivatives(
    adapter: Any, z: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor], h: float
) -> tuple[float, float]:
    """The derivative of the mean squared prediction along a random direction (seed 3) of the first
    block's ``to_q`` weight (float64), by backpropagation and by central finite differences of step
    ``h``. Leaves the weight as it was and its ``.grad`` (and any other parameter's) filled."""
    weight = adapter.denoiser.transformer_blocks[0].attn.to_q.weight
    direction = torch.randn(weight.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def loss() -> torch.Tensor:
        return adapter.predict(z, t, cond).square().mean()

    loss().backward()
    analytic = (weight.grad * direction).sum().item()
    with torch.no_grad():
        weight += h * direction
        up = loss().item()
        weight -= 2 * h * direction
        down = loss().item()
        weight += h * direction
    return analytic, (up - down) / (2 * h)


# ------------------------------------------------------------------------------------------ export


def attach_trained_lora(
    adapter: Any, rank: int = 4, alpha: int = 8, std: float = 0.05, module: Any = None
) -> None:
    """LoRA on the adapter's targets with ``B != 0`` (seeded per parameter name): a "trained" LoRA whose
    export must change the predictions. ``module`` defaults to ``adapter.denoiser``."""
    module = adapter.denoiser if module is None else module
    finetune.attach_lora(module, rank=rank, alpha=alpha, target_modules=adapter.lora_target_modules)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, std, generator=torch.Generator().manual_seed(len(name)))


def assert_diffusers_lora_file(folder: Path, *, rank: int, alpha: float, prefix: str = "transformer") -> None:
    """``folder/pytorch_lora_weights.safetensors`` is in the layout diffusers' loaders read without guessing:
    every key ``<prefix>.<module>.lora_A|lora_B.weight`` (no peft adapter name such as ``.default``,
    which diffusers would not match, silently loading nothing), and the rank and alpha stored in its
    ``lora_adapter_metadata`` (without them a loader guesses alpha = rank)."""
    import json

    from safetensors import safe_open

    with safe_open(str(folder / "pytorch_lora_weights.safetensors"), "pt") as f:
        keys, header = list(f.keys()), f.metadata() or {}
    assert keys and all(k.startswith(f"{prefix}.") for k in keys), keys[:3]
    assert all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in keys), keys[:3]
    assert not any(".default" in k for k in keys), keys[:3]
    metadata = json.loads(header["lora_adapter_metadata"])
    assert metadata[f"{prefix}.r"] == rank and metadata[f"{prefix}.lora_alpha"] == alpha


def export_lora(adapter: Any, out: Path, rank: int = 4, alpha: float = 8) -> str:
    """Export the adapter's LoRA (``attach_trained_lora``'s ``rank`` and ``alpha``) to ``out``: the
    diffusers weights file, in diffusers' key layout with its rank and alpha, and the export note are
    there. Returns the note's text."""
    adapter.export_trained(out)
    assert_diffusers_lora_file(out, rank=rank, alpha=alpha)
    return (out / EXPORT_INFO).read_text()


def assert_reload_matches(
    adapter: Any,
    fresh: Any,
    load: Callable[[], None],
    z: torch.Tensor,
    t: torch.Tensor,
    cond: dict[str, torch.Tensor],
    *,
    atol: float,
    rtol: float,
    moved: float = 1e-3,
) -> None:
    """``fresh`` (the base model) predicts differently (by more than ``moved``) from the trained ``adapter``
    until ``load()`` puts the exported weights into it, and then the same."""
    with torch.no_grad():
        trained, base = adapter.predict(z, t, cond), fresh.predict(z, t, cond)
        load()
        loaded = fresh.predict(z, t, cond)
    assert (trained - base).abs().max() > moved  # training moved the policy
    torch.testing.assert_close(loaded, trained, atol=atol, rtol=rtol)


def assert_exported_lora_reloads(
    adapter_class: type,
    pipeline_class: type | None,
    config: Any,
    out: Path,
    prompts: Sequence[str],
    z: torch.Tensor,
    t: torch.Tensor,
) -> None:
    """A "trained" LoRA of the adapter built from ``config``, exported to ``out`` and loaded by the
    pipeline's ``load_lora_weights`` into a fresh adapter (``adapter_class`` at ``config``'s resolution and
    token count on a ``pipeline_class`` loaded from ``config.model`` after the export) gives the trained
    predictions; rank and alpha come from the file's metadata. ``pipeline_class`` None: the fresh adapter
    is built from ``config`` as the first (options beyond resolution and token count, e.g. a clip's size)."""
    adapter = adapter_from_config(adapter_class, config)
    attach_trained_lora(adapter)
    export_lora(adapter, out)
    cond = encode_conditioned(adapter, prompts)  # prompts carrying images for an editing adapter
    if pipeline_class is None:
        fresh = adapter_from_config(adapter_class, config)
    else:
        fresh = adapter_class(
            pipeline_class.from_pretrained(config.model),
            resolution=config.resolution,
            max_sequence_length=config.max_sequence_length,
        )
    load = partial(fresh.pipe.load_lora_weights, out)
    assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5)


def assert_run_export_reloads(
    adapter: Any,
    pipeline_class: type,
    model: Path,
    options: Any,
    run_dir: Path,
    prompts: Sequence[str],
    z: torch.Tensor,
    t: torch.Tensor,
) -> None:
    """The LoRA a run exported to ``run_dir/final``, loaded by ``pipeline_class.load_lora_weights`` into a
    fresh adapter of the run's options on the base weights in ``model``, gives the trained ``adapter``'s
    predictions (guided alike where the options guide them in training)."""
    cond = adapter.encode_prompts(prompts)
    adapter_class = type(adapter)
    fresh = adapter_class(pipeline_class.from_pretrained(model), **adapter_class.options_from_config(options))
    load = partial(fresh.pipe.load_lora_weights, run_dir / "final")
    assert_reload_matches(adapter, fresh, load, z, t, cond, atol=1e-5, rtol=1e-5)


def assert_full_export_reloads(adapter_class: type, config: Any, out: Path) -> None:
    """Full fine-tuning of the adapter built from ``config`` exports ``out/transformer`` that
    ``from_pretrained`` reads back with the edit."""
    adapter = adapter_from_config(adapter_class, config)
    finetune.enable_full_finetune(adapter.denoiser)
    with torch.no_grad():
        adapter.denoiser.proj_out.weight.add_(0.1)
    adapter.export_trained(out)
    reloaded = type(adapter.denoiser).from_pretrained(out / "transformer")
    torch.testing.assert_close(reloaded.proj_out.weight, adapter.denoiser.proj_out.weight)


# ------------------------------------------------------------------------------------ micro-batches

MIXED_LENGTH_PROMPTS = ("a red cat", "a blue dog on a hill far away", "a red cat", "an owl")
"""Prompts of three token counts, one repeated (rows of one group)."""


def assert_micro_batch_equals_single_rows(
    adapter_class: type, config: Any, prompts: Sequence[str], *, rtol: float = 1e-4, n_mc: int = 2
) -> dict[str, float]:
    """The V-GRPO loss and the LoRA gradients of one micro-batch of ``len(prompts)`` rows equal the mean
    over micro-batches of one row each (``train.micro_batch_size`` k against 1), and so do the per-row
    x-predictions, within ``rtol`` (float32).

    The batch's conditioning is the one the loop sees: the prompts encoded in two separate calls, their
    cached rows stacked (rows of separate encodings joined, as across rollout chunks). Each single row
    instead gets its prompt encoded alone, uncached: a row of a padded, masked batch must give what its
    prompt gives by itself. Rows of the same prompt form one group. A LoRA with non-zero ``B`` gives the
    ``A`` matrices gradients too (all but those of the last block's text queries, which nothing reads).
    Returns the largest differences found, for the record.
    """
    from vgrpo_platform.algo.surrogates.configs import VGRPOConfig
    from vgrpo_platform.algo.surrogates.pairs import predict_x0_on_pairs
    from vgrpo_platform.algo.surrogates.vgrpo import VGRPOSurrogate
    from vgrpo_platform.protocols import RolloutBatch

    adapter = adapter_from_config(adapter_class, config)
    attach_trained_lora(adapter)
    lora = {n: p for n, p in adapter.denoiser.named_parameters() if p.requires_grad}
    rows = len(prompts)
    tokenizer = getattr(adapter.pipe, "tokenizer", None) or adapter.pipe.processor  # 2.x: a processor
    tokens = {len(tokenizer(text=[p])["input_ids"][0]) for p in prompts}
    assert len(tokens) > 1, f"the prompts must differ in token count, got {tokens}"
    adapter.encode_prompts(prompts[: rows // 2])  # two encodings, stacked below from the cache
    adapter.encode_prompts(prompts[rows // 2 :])
    cond = adapter.encode_prompts(prompts)
    alone = [{k: v.to(adapter.device) for k, v in adapter._encode_on_device([p]).items()} for p in prompts]
    for own in alone:  # a row's shape may not depend on its batch-mates, or rows could not be joined
        assert {k: v.shape[1:] for k, v in own.items()} == {k: v.shape[1:] for k, v in cond.items()}
    group_of = {p: g for g, p in enumerate(dict.fromkeys(prompts))}
    generator = torch.Generator().manual_seed(0)
    batch = RolloutBatch(
        prompts=list(prompts),
        group_ids=torch.tensor([group_of[p] for p in prompts]),
        cond=cond,
        latents=torch.randn(rows, *adapter.latent_shape(), generator=generator),
        rewards=torch.zeros(rows),
        advantages=torch.linspace(-1.0, 1.5, rows),
    )
    surrogate = VGRPOSurrogate(VGRPOConfig(n_mc=n_mc))
    surrogate.plan_updates(1)  # the trainer's default: one optimiser step per batch
    surrogate.prepare(batch, adapter, generator)

    def singles() -> list[RolloutBatch]:
        parts = [batch.select(torch.tensor([i])) for i in range(rows)]
        for part, own in zip(parts, alone, strict=True):
            part.cond = own
        return parts

    def loss_and_grads(parts: list[RolloutBatch]) -> tuple[float, float, dict[str, torch.Tensor]]:
        for p in lora.values():
            p.grad = None
        loss_sum = surrogate_sum = 0.0
        for part in parts:
            loss, metrics = surrogate.loss(part, adapter)
            (loss * len(part) / rows).backward()
            loss_sum += loss.item() * len(part) / rows
            surrogate_sum += metrics["surrogate"] * len(part) / rows
        return loss_sum, surrogate_sum, {n: p.grad.clone() for n, p in lora.items()}

    state = batch.state
    with torch.no_grad():
        x_batch = predict_x0_on_pairs(adapter, batch.latents, state.t, state.eps, cond)  # [B, K, *L]
        x_rows = torch.cat(
            [predict_x0_on_pairs(adapter, p.latents, p.state.t, p.state.eps, p.cond) for p in singles()]
        )
    torch.testing.assert_close(x_batch, x_rows, rtol=rtol, atol=rtol * x_batch.abs().max().item())
    loss_k, surrogate_k, grads_k = loss_and_grads([batch])
    loss_1, surrogate_1, grads_1 = loss_and_grads(singles())
    assert loss_k == pytest.approx(loss_1, rel=rtol) and surrogate_k == pytest.approx(surrogate_1, rel=rtol)
    scale = max(g.abs().max().item() for g in grads_k.values())
    reached = [n for n, g in grads_k.items() if g.abs().sum() > 0]
    assert scale > 0 and len(reached) > len(grads_k) / 2, f"{len(reached)} of {len(grads_k)} LoRA matrices"
    for name, grad in grads_k.items():
        label = partial("{}: {}".format, name)
        torch.testing.assert_close(grads_1[name], grad, rtol=rtol, atol=rtol * scale, msg=label)
    grad_diff = max((grads_1[n] - g).abs().max().item() for n, g in grads_k.items())
    return {
        "x0_max_abs": (x_batch - x_rows).abs().max().item(),
        "surrogate_rel": abs(surrogate_k - surrogate_1) / abs(surrogate_k),
        "grad_max_abs": grad_diff,
        "grad_max_rel": grad_diff / scale,  # relative to the largest gradient entry
    }


# ------------------------------------------------------------------------------------------- runs


def cpu_run(tmp_path: Path, *extra: str) -> list[str]:
    """The recipe overrides of a quiet float32 CPU run writing under ``tmp_path``."""
    return [
        "run.device=cpu",
        "run.mixed_precision=no",
        *extra,
        f'run.output_dir="{tmp_path}"',
        "log.progress=none",
    ]


def brightness_run(model: Path, tmp_path: Path, *options: str) -> list[str]:
    """Overrides of a CPU run of the tiny pipeline in ``model`` (``options``: more adapter options) scored
    by the toy brightness reward."""
    return [f'adapter.options.model="{model}"', *options, 'rewards.0={name="brightness"}', *cpu_run(tmp_path)]


def lora_iterations(
    iterations: int, group_size: int, steps: int, micro_batch_size: int, lr: str = "1e-2"
) -> list[str]:
    """Overrides of short LoRA (rank 4) iterations of two prompts each."""
    return [
        f"rollout.group_size={group_size}",
        "rollout.prompts_per_iteration=2",
        f"rollout.steps={steps}",
        f"train.iterations={iterations}",
        f"train.micro_batch_size={micro_batch_size}",
        f"train.lr={lr}",
        "train.lora_rank=4",
    ]


def two_iterations(group_size: int = 2, steps: int = 3, micro_batch_size: int = 4) -> list[str]:
    """Overrides of the two short LoRA iterations the end-to-end recipe tests run (two prompts each)."""
    return lora_iterations(2, group_size, steps, micro_batch_size)


def learning_run(samples_per_prompt: int, *train: str) -> list[str]:
    """The overrides of the short runs that must move a held-out reward: one prompt, groups of 8, four
    iterations evaluated before and after on the same seeds (``train`` adds train.* settings)."""
    return [
        "log.save_grids=false",
        "rollout.group_size=8",
        "rollout.prompts_per_iteration=1",
        "rollout.steps=2",
        "train.iterations=4",
        "train.micro_batch_size=8",
        "train.lr=1e-2",
        "train.lora_rank=4",
        *train,
        "eval.every=0",
        f"eval.samples_per_prompt={samples_per_prompt}",
        "eval.max_prompts=1",
    ]


def records_of(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The run's metrics records of one kind (``train`` or ``eval``)."""
    return [rec for rec in read_metrics(run_dir / "metrics.jsonl") if rec["kind"] == kind]


def assert_trained(run_dir: Path, iterations: int) -> list[dict[str, Any]]:
    """Every iteration wrote a train record with a finite loss; returns the records."""
    records = records_of(run_dir, "train")
    assert [rec["iteration"] for rec in records] == list(range(1, iterations + 1))
    assert all(math.isfinite(rec["loss"]) for rec in records)
    return records


def assert_lora_moved(adapter: Any) -> None:
    """The LoRA ``B`` matrices (zero at the start) were updated."""
    lora_b = [p for n, p in adapter.denoiser.named_parameters() if "lora_B" in n]
    assert lora_b and max(p.abs().max().item() for p in lora_b) > 0


def assert_eval_gain(run_dir: Path, iterations: int, margin: float) -> None:
    """The held-out reward rose by more than ``margin`` from iteration 0 to ``iterations``."""
    evals = records_of(run_dir, "eval")
    assert [rec["iteration"] for rec in evals] == [0, iterations]
    before, after = evals[0]["reward"], evals[-1]["reward"]
    assert after > before + margin, (before, after)


def assert_checkpoint_samples(
    resolved: Any, adapter: Any, run_dir: Path, out_dir: Path, latent: tuple[int, ...], sampler: SamplerSpec
) -> torch.Tensor:
    """``vgrpo sample --checkpoint RUN_DIR`` generates with the trained weights: the image it writes for
    "a red cat" is the trained ``adapter``'s from the same noise (seed 0). Returns it ``[H, W, 3]``."""
    files = sample_to_folder(resolved, out_dir=out_dir, checkpoint=run_dir, prompts=["a red cat"])
    expected_noise = torch.randn(1, *latent, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        latents = adapter.sample(expected_noise, adapter.encode_prompts(["a red cat"]), sampler)
    expected = (adapter.decode(latents).data[0] * 255).round().permute(1, 2, 0)
    written = torch.from_numpy(np.array(Image.open(files[0]))).float()
    assert (written - expected).abs().max() <= 1
    return written


# -------------------------------------------------------------------------------------- real models


def cuda_adapter_or_skip(adapter_class: type, config: Any) -> Any:
    """The adapter on CUDA from ``config``, or skip the test without a GPU or the model's weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    try:
        return adapter_class.from_config(config, BuildContext(device="cuda"))
    except ModelWeightsError as exc:
        pytest.skip(str(exc))


def assert_lora_rollout_and_gradient_on_cuda(adapter: Any, sampler: SamplerSpec) -> None:
    """A LoRA rollout decodes a 512 px image with content, and a loss reaches the trained parameters."""
    finetune.attach_lora(adapter.denoiser, rank=8, alpha=16, target_modules=adapter.lora_target_modules)
    cond = adapter.encode_prompts(["a photo of a cat"])
    z = torch.randn(1, *adapter.latent_shape(), device="cuda")
    image = adapter.decode(adapter.sample(z, cond, sampler)).data
    assert image.shape == (1, 3, 512, 512) and image.std() > 0.05
    adapter.predict(z, torch.tensor([0.5], device="cuda"), cond).float().square().mean().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in adapter.denoiser.parameters())
