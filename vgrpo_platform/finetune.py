"""What is trained: LoRA adapters (peft) or the full denoiser, and how to see the frozen reference.

Works on any ``torch.nn.Module`` denoiser, diffusers model or not: LoRA goes in through
``peft.inject_adapter_in_model`` and the reference policy is the same module with every peft layer
switched off, so no second copy of a large model is held. Full fine-tuning keeps one frozen copy of
the initial weights (on CPU) and swaps it in only while the reference is evaluated.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

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
    for p in params:
        # peft creates LoRA weights in the wrapped layer's dtype; a bf16 base would make the adapter,
        # its gradients and AdamW state bf16 too. fp32 adapters beside a low-precision base (peft casts
        # the input to the adapter's dtype and the result back) keep small updates from rounding away.
        p.data = p.data.float()
        p.requires_grad_(True)
    return params


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
    if train.finetune == "lora":
        targets = train.lora_targets or list(adapter.lora_target_modules)
        attach_lora(denoiser, rank=train.lora_rank, alpha=train.lora_alpha, target_modules=targets)
    else:
        enable_full_finetune(denoiser)
    denoiser.train()
    return trainable_named_parameters(denoiser)
