"""What is trained: LoRA adapters (peft) or the full denoiser, and how to see the frozen reference.

Works on any ``torch.nn.Module`` denoiser, diffusers model or not: LoRA goes in through
``peft.inject_adapter_in_model`` and the reference policy is the same module with every peft layer
switched off, so no second copy of a large model is held. Full fine-tuning keeps one frozen copy of
the initial weights (on CPU) and swaps it in only while the reference is evaluated.

``train.init_lora`` starts the LoRA from an existing diffusers-format one (``lora_files.py``): its rank,
alpha and targets are read, never guessed, and every tensor must find its module.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vgrpo_platform.errors import CheckpointError
from vgrpo_platform.lora_files import LORA_METADATA, read_lora, write_lora

if TYPE_CHECKING:
    from vgrpo_platform.config.schema import TrainSection
    from vgrpo_platform.protocols import Adapter

_FROZEN_REFERENCES: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)
"""Full fine-tuning's initial weights (CPU), held here by module: nothing is stored on the module itself,
and a reference lives exactly as long as its model."""


def attach_lora(
    denoiser: torch.nn.Module, *, rank: int, alpha: float, target_modules: Sequence[str]
) -> list[torch.nn.Parameter]:
    """Freeze ``denoiser``, add LoRA layers to ``target_modules`` and return the new trainable params.

    LoRA's B matrices start at zero, so the policy starts exactly at the base model.
    """
    from peft import LoraConfig, inject_adapter_in_model

    denoiser.requires_grad_(False)
    # peft annotates lora_alpha as int, but scales by alpha / r and takes any number (recipes allow 0.5)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]
        target_modules=list(target_modules),
        lora_dropout=0.0,
    )
    inject_adapter_in_model(config, denoiser)
    params = [p for n, p in denoiser.named_parameters() if "lora_" in n]
    if not params:
        raise ValueError(
            f"LoRA matched no module of {type(denoiser).__name__} for targets {list(target_modules)}"
        )
    return _train_in_fp32(params)


def _train_in_fp32(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    for p in params:
        # peft creates LoRA weights in the wrapped layer's dtype; a bf16 base would make the adapter,
        # its gradients and AdamW state bf16 too. fp32 adapters beside a low-precision base (peft casts
        # the input to the adapter's dtype and the result back) keep small updates from rounding away.
        p.data = p.data.float()
        p.requires_grad_(True)
    return params


def attach_lora_from(denoiser: torch.nn.Module, source: str) -> list[torch.nn.Parameter]:
    """``attach_lora`` with the rank, alpha, targets and weights of the LoRA at ``source`` (``read_lora``);
    a tensor that finds no module, or a module left without its tensor, is an error naming one."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from peft.utils import get_peft_model_state_dict

    state, options = read_lora(source)
    known = {f.name for f in dataclasses.fields(LoraConfig)}
    config = LoraConfig(**{k: v for k, v in options.items() if k in known})
    denoiser.requires_grad_(False)
    try:
        inject_adapter_in_model(config, denoiser)  # ValueError: "Target modules ... not found"
        set_peft_model_state_dict(denoiser, state)  # RuntimeError: a tensor of another shape
    except (ValueError, RuntimeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"train.init_lora: {source} does not fit {type(denoiser).__name__} ({reason}); "
            "use a LoRA of this model"
        ) from None
    injected = set(get_peft_model_state_dict(denoiser))
    unmatched = sorted(set(state) ^ injected)
    if unmatched:
        raise CheckpointError(
            f"train.init_lora: {source} does not fit {type(denoiser).__name__}: {len(unmatched)} LoRA "
            f"tensors without a counterpart, e.g. '{unmatched[0]}'; use a LoRA of this model"
        )
    return _train_in_fp32([p for n, p in denoiser.named_parameters() if "lora_" in n])


def enable_full_finetune(denoiser: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Train every weight; keep a CPU copy of the initial ones as the frozen reference."""
    denoiser.requires_grad_(True)
    _FROZEN_REFERENCES[denoiser] = {
        n: p.detach().to("cpu", copy=True) for n, p in denoiser.named_parameters()
    }
    return list(denoiser.parameters())


def trainable_named_parameters(denoiser: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters the optimiser updates, by their stable names (used in checkpoints)."""
    return {n: p for n, p in denoiser.named_parameters() if p.requires_grad}


def lora_config(denoiser: torch.nn.Module) -> Any:
    """The ``LoraConfig`` of the LoRA the core attached (peft's adapter ``default``), or None."""
    configs: dict[str, Any] = getattr(denoiser, "peft_config", {})
    return configs.get("default")


def uses_lora(denoiser: torch.nn.Module) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in denoiser.modules())


@contextmanager
def reference_mode(adapter: Adapter) -> Iterator[None]:
    """Inside this context ``adapter.predict`` evaluates the frozen base (reference) model."""
    denoiser = adapter.denoiser
    if uses_lora(denoiser):
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers = [m for m in denoiser.modules() if isinstance(m, BaseTunerLayer)]
        for layer in layers:
            layer.enable_adapters(False)
        try:
            yield
        finally:
            for layer in layers:
                layer.enable_adapters(True)
        return
    reference = _FROZEN_REFERENCES.get(denoiser)
    if reference is None:
        yield  # nothing trained yet: the current weights are the reference
        return
    with values_swapped_in(dict(denoiser.named_parameters()), reference):
        yield


@contextmanager
def values_swapped_in(
    params: Mapping[str, torch.Tensor], values: Mapping[str, torch.Tensor]
) -> Iterator[None]:
    """Inside: each parameter holds ``values[name]``; after: its own values again, bit for bit (also on
    an exception). How a reference, an EMA or an averaged model is evaluated without a second copy."""
    current = {n: p.detach().clone() for n, p in params.items()}
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(values[n])
    try:
        yield
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(current[n])


def make_trainable(adapter: Adapter, train: TrainSection) -> dict[str, torch.nn.Parameter]:
    """The recipe's ``[train]`` choice applied to the adapter's denoiser (LoRA or full), with gradient
    checkpointing where the model has it; the trainable parameters by name. Here, not in the training
    package, so a rollout process outside the run (a backend, an engine) builds the same trainable weights."""
    denoiser = adapter.denoiser
    enable_checkpointing = getattr(denoiser, "enable_gradient_checkpointing", None)  # diffusers models
    if train.gradient_checkpointing and enable_checkpointing is not None:
        enable_checkpointing()
    if train.init_lora is not None:
        attach_lora_from(denoiser, train.init_lora)
    elif train.finetune == "lora":
        targets = train.lora_targets or list(adapter.lora_target_modules)
        attach_lora(denoiser, rank=train.lora_rank, alpha=train.lora_alpha, target_modules=targets)
    else:
        enable_full_finetune(denoiser)
    denoiser.train()
    return trainable_named_parameters(denoiser)


def export_trainable(denoiser: torch.nn.Module, out: Path) -> dict[str, Any]:
    """The core's export for an adapter without ``export_trained``. A LoRA: ``lora_files.LORA_FILE`` (peft's
    module keys, the ``LoraConfig`` in its header); full fine-tuning: every weight as ``denoiser/``
    (``save_pretrained``, where the model has it) or ``denoiser.safetensors``. Returns the export note."""
    from peft.utils import get_peft_model_state_dict

    out.mkdir(parents=True, exist_ok=True)
    if uses_lora(denoiser):
        path = write_lora(out, get_peft_model_state_dict(denoiser), lora_config(denoiser).to_dict())
        load = (
            f"train.init_lora = '{out}'; or peft's inject_adapter_in_model(LoraConfig(**config), denoiser) "
            f"and set_peft_model_state_dict(denoiser, state), config being the file's '{LORA_METADATA}' "
            f"header entry and state load_file('{path}'); a diffusers model: "
            f"load_lora_adapter('{out}', prefix=None, weight_name='{path.name}')"
        )
        return {"kind": "lora", "load": load}
    save_pretrained = getattr(denoiser, "save_pretrained", None)
    if save_pretrained is not None:
        save_pretrained(out / "denoiser")
        return {"kind": "full", "load": f"{type(denoiser).__name__}.from_pretrained('{out / 'denoiser'}')"}
    from safetensors.torch import save_file

    path = out / "denoiser.safetensors"
    save_file({k: v.detach().cpu().contiguous() for k, v in denoiser.state_dict().items()}, str(path))
    return {"kind": "full", "load": f"denoiser.load_state_dict(safetensors.torch.load_file('{path}'))"}
