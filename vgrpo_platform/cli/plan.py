"""``vgrpo plan``: peak GPU memory per process for a recipe, and which shipped accelerate config fits.

Why before a run: a run that does not fit fails minutes in, after loading the weights. The denoiser is
built from its config on the meta device (no weights, no memory, no download): from the adapter's
``model`` folder or the local hub cache, or from ``--transformer-config``. Models without a ``model``
option (the embedded ``toy`` and ``shapes``) are small enough to build on the CPU. The sums are
``memory_estimate``'s; everything here reads the recipe and prints.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch

from vgrpo_platform.cli.memory_estimate import (
    GIB,
    HEADROOM,
    SHARDING,
    DenoiserShape,
    Estimate,
    Setup,
    estimate,
    shape_of,
)
from vgrpo_platform.conditions import takes_condition_image
from vgrpo_platform.config.recipe import ResolvedRecipe
from vgrpo_platform.errors import RecipeError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PATCH_PX = 16  # image pixels per transformer token side: VAE 8x and 2x2 patches (FLUX, SD3, Qwen, Wan)


def parse_size(text: str) -> int:
    """``80GiB``, ``80GB`` (read as GiB), ``81920MiB``, ``64KiB`` or bytes; to bytes."""
    units = {"gib": GIB, "gb": GIB, "mib": 2**20, "mb": 2**20, "kib": 2**10, "kb": 2**10, "": 1}
    lowered = text.strip().lower()
    for unit in sorted(units, key=len, reverse=True):
        if lowered.endswith(unit):
            try:
                return int(float(lowered[: len(lowered) - len(unit)] or "x") * units[unit])
            except ValueError:
                break
    raise RecipeError(f"cannot read the size {text!r}: write e.g. 80GiB or 24GiB")


# ------------------------------------------------------------------------------------ the denoiser
def transformer_config(resolved: ResolvedRecipe, given: Path | None) -> dict[str, Any] | None:
    """The denoiser's diffusers config: ``given``, the model folder's, the hub cache's, or ``None``
    when the adapter has no ``model`` option (it is built instead)."""
    if given is not None:
        return dict(json.loads(given.read_text()))
    model = getattr(resolved.adapter.config, "model", None)
    if not isinstance(model, str):
        return None
    folder = Path(model).expanduser()
    if not folder.is_absolute():
        folder = resolved.recipe_dir / folder if (resolved.recipe_dir / folder).is_dir() else folder
    path = folder / "transformer" / "config.json"
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "transformer/config.json")
        if not isinstance(cached, str):
            raise RecipeError(
                f"no transformer config for {model!r} here (neither a folder nor in the hub cache): run "
                f"`huggingface-cli download {model} transformer/config.json` or pass --transformer-config"
            )
        path = Path(cached)
    return dict(json.loads(path.read_text()))


def meta_denoiser(config: dict[str, Any], dtype: torch.dtype) -> torch.nn.Module:
    """The diffusers class the config names (``_class_name``), built on the meta device in ``dtype``."""
    import diffusers

    name = config.get("_class_name")
    cls = getattr(diffusers, name, None) if isinstance(name, str) else None
    if cls is None:
        raise RecipeError(f"the transformer config names no diffusers class (_class_name = {name!r})")
    with torch.device("meta"):
        model = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    return model.to(dtype)


def built_adapter(resolved: ResolvedRecipe, dtype: torch.dtype) -> Any:
    """A small embedded model's adapter, built on the CPU through its factory."""
    from vgrpo_platform.protocols import BuildContext

    return resolved.adapter.build(BuildContext(device="cpu", dtype=dtype, recipe_dir=resolved.recipe_dir))


def measured_activations(adapter: Any, micro_batch: int) -> int:
    """Saved-tensor bytes of one training forward of a built adapter at ``micro_batch`` rows."""
    from vgrpo_platform.cli.memory_estimate import saved_activation_bytes

    prompts = ["a prompt"] * micro_batch
    if takes_condition_image(adapter):  # an editing adapter: a mid-grey condition image (it resizes it)
        cond = adapter.encode_conditions(prompts, [[torch.full((3, 64, 64), 0.5)]] * micro_batch)
    else:
        cond = adapter.encode_prompts(prompts)
    z = torch.randn(micro_batch, *adapter.latent_shape(), dtype=adapter.dtype)
    t = torch.full((micro_batch,), 0.5)
    adapter.denoiser.requires_grad_(True)
    return saved_activation_bytes(lambda: adapter.predict(z, t, cond), adapter.denoiser)


def lora_targets(resolved: ResolvedRecipe, adapter: Any = None) -> list[str]:
    """The recipe's ``train.lora_targets``, else the (built or registered) adapter's defaults."""
    if resolved.recipe.train.lora_targets:
        return list(resolved.recipe.train.lora_targets)
    if adapter is not None:
        return list(adapter.lora_target_modules)
    target = getattr(resolved.adapter.spec.factory, "target", "")
    module_name, _, attribute = str(target).partition(":")
    owner = attrgetter(attribute.split(".")[0])(importlib.import_module(module_name)) if module_name else None
    defaults = getattr(owner, "lora_target_modules", None)
    if defaults is None:
        raise RecipeError(
            "this adapter's LoRA targets are not known before it is built: set train.lora_targets"
        )
    return list(defaults)


def weight_dtype(resolved: ResolvedRecipe) -> torch.dtype:
    """The adapter's ``dtype`` option as a GPU run resolves it (``auto`` = bf16 on CUDA)."""
    name = getattr(resolved.adapter.config, "dtype", "auto")
    return DTYPES.get(str(name), torch.bfloat16)


def tokens_per_sample(resolved: ResolvedRecipe) -> int:
    """Image (or video) tokens plus text tokens, from the adapter's size options."""
    options = resolved.adapter.config
    text = int(getattr(options, "max_sequence_length", 0) or 0)
    frames = getattr(options, "num_frames", None)
    if frames is not None:
        side = getattr(options, "resolution", None)  # square frames' shorthand
        height = int(side or getattr(options, "height", None) or 480)
        width = int(side or getattr(options, "width", None) or height)
        return ((int(frames) - 1) // 4 + 1) * (height // PATCH_PX) * (width // PATCH_PX) + text
    resolution = int(getattr(options, "resolution", 512) or 512)
    return (resolution // PATCH_PX) ** 2 + text


# -------------------------------------------------------------------------------------- accelerate
def accelerate_configs(folder: Path, *, one_machine: bool = False) -> list[tuple[str, str, int]]:
    """``(file name, sharding, processes)`` of each shipped config (``recipes/accelerate/*.yaml``);
    ``one_machine``: only those that start every process on this machine."""
    import yaml

    out = []
    for path in sorted(folder.glob("*.yaml")):
        config = yaml.safe_load(path.read_text()) or {}
        if one_machine and int(config.get("num_machines", 1)) > 1:
            continue
        kind = str(config.get("distributed_type", "NO"))
        sharding = {"DEEPSPEED": "zero2", "FSDP": "fsdp2"}.get(kind, "none")
        if kind == "DEEPSPEED" and (config.get("deepspeed_config") or {}).get("zero_stage", 2) != 2:
            continue  # only ZeRO-2 is supported (docs/scaling.md)
        out.append((path.name, sharding, int(config.get("num_processes", 1))))
    return out


# --------------------------------------------------------------------------------------------- plan
def setup_from(
    resolved: ResolvedRecipe,
    tokens: int | None,
    sharding: str,
    gpus: int,
    reward_gb: float,
    measured: int | None = None,
) -> Setup:
    train = resolved.recipe.train
    mixed = resolved.recipe.run.mixed_precision
    compute = 2 if mixed in ("bf16", "fp16") else weight_dtype(resolved).itemsize
    return Setup(
        finetune=train.finetune,
        micro_batch=train.micro_batch_size,
        tokens=tokens if tokens is not None else tokens_per_sample(resolved),
        checkpointing=train.gradient_checkpointing,
        compute_bytes=compute,
        sharding=sharding,
        gpus=gpus,
        reward_bytes=int(reward_gb * GIB),
        offload_rewards=train.offload_rewards,
        measured_activations=measured,
        context=resolved.recipe.parallel.context,
    )


def denoiser_shape(
    resolved: ResolvedRecipe, config_path: Path | None
) -> tuple[DenoiserShape, str, int | None]:
    """The denoiser's counts, how it was built (said in the output), and the measured activation bytes
    of a model built on the CPU (``None`` on the meta device: the formula applies)."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # its "modules to keep in float32" note is about loading
    dtype = weight_dtype(resolved)
    train = resolved.recipe.train
    lora = train.finetune == "lora"
    config = transformer_config(resolved, config_path)
    if config is not None:
        model = meta_denoiser(config, dtype)
        targets = lora_targets(resolved) if lora else None
        return (
            shape_of(model, train.lora_rank, targets),
            f"{config.get('_class_name')} on the meta device",
            None,
        )
    adapter = built_adapter(resolved, dtype)
    targets = lora_targets(resolved, adapter) if lora else None
    shape = shape_of(adapter.denoiser.to(dtype), train.lora_rank, targets)
    measured = measured_activations(adapter, train.micro_batch_size)
    return shape, "built on the CPU: a small embedded model; activations measured there", measured


def _gib(n: int) -> str:
    return f"{n / GIB:.3f}"


def lines(
    resolved: ResolvedRecipe,
    *,
    gpus: int,
    gpu_memory: int | None,
    tokens: int | None,
    reward_gb: float,
    config_path: Path | None,
    accelerate_dir: Path,
) -> list[str]:
    """The command's output: the terms per GPU on ``gpus`` processes under each sharding, then one line
    per shipped accelerate config (at its own process count)."""
    shape, how, measured = denoiser_shape(resolved, config_path)
    base = setup_from(resolved, tokens, "none", gpus, reward_gb, measured)
    by = {k: estimate(shape, Setup(**{**base.__dict__, "sharding": k})) for k in SHARDING}
    train = resolved.recipe.train
    lora = (
        f" r{train.lora_rank} ({shape.lora_params / 1e6:.1f} M trainable)" if train.finetune == "lora" else ""
    )
    out = [
        "ESTIMATE, not a measurement (docs/cli.md, `vgrpo plan`: the formula and how it was checked)",
        f"denoiser: {shape.params / 1e9:.3f} B parameters, {_gib(shape.weight_bytes)} GiB of weights "
        f"({how}); hidden {shape.hidden}, {shape.layers} blocks",
        f"training: {train.finetune}{lora}, micro-batch {base.micro_batch}, gradient checkpointing "
        f"{'on' if base.checkpointing else 'off'}, activations "
        + (
            "measured (saved tensors of one forward on the CPU)"
            if measured is not None
            else f"{base.tokens} tokens x {base.compute_bytes} bytes per value (formula)"
        ),
        "",
        f"GiB per GPU on {gpus} GPU{'s' if gpus > 1 else ''}: {'DDP':>9} {'ZeRO-2':>9} {'FSDP2':>9}",
    ]
    for i, (name, _) in enumerate(by["none"].rows()):
        values = " ".join(f"{_gib(e.rows()[i][1]):>9}" for e in by.values())
        out.append(f"  {name:<32} {values}")
    out += [f"  {'peak':<32} " + " ".join(f"{_gib(e.peak):>9}" for e in by.values()), ""]
    if not reward_gb:
        out.append("not counted: reward models, frozen text encoders and VAE (add them with --reward-gb)")
    budget = f" at {_gib(gpu_memory)} GiB ({HEADROOM:.0%} usable)" if gpu_memory else ""
    out.append(f"shipped accelerate configs ({accelerate_dir}){budget}:")
    configs = accelerate_configs(accelerate_dir)
    if not configs:
        out.append("  none found: pass --accelerate-dir (the checkout's recipes/accelerate)")
    for name, sharding, processes in configs:
        got = estimate(shape, Setup(**{**base.__dict__, "sharding": sharding, "gpus": processes}))
        verdict = (
            "" if not gpu_memory else ("  fits" if got.peak <= HEADROOM * gpu_memory else "  does NOT fit")
        )
        out.append(
            f"  {name:<28} {processes:>3} GPUs  {SHARDING[sharding]:<32} {_gib(got.peak):>9} GiB{verdict}"
        )
    return out


def peaks_at(resolved: ResolvedRecipe, gpus: int, shardings: list[str]) -> dict[str, int]:
    """Peak bytes per GPU of the recipe on ``gpus`` processes under each sharding (``vgrpo run --gpus``
    picks its config by them)."""
    shape, _, measured = denoiser_shape(resolved, None)
    base = setup_from(resolved, None, "none", gpus, 0.0, measured)
    return {k: estimate(shape, replace(base, sharding=k)).peak for k in shardings}


def estimate_for(resolved: ResolvedRecipe, gpus: int = 1, sharding: str = "none") -> Estimate:
    """The estimate alone (tests and scripts): the recipe's own settings on ``gpus`` processes."""
    shape, _, measured = denoiser_shape(resolved, None)
    return estimate(shape, setup_from(resolved, None, sharding, gpus, 0.0, measured))
