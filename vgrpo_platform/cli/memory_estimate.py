"""Peak GPU memory per process, estimated from the denoiser's shape and the recipe: ``vgrpo plan``'s sums.

Why arithmetic rather than a trial run: a trial needs the GPU the plan is meant to choose. The terms
(docs/cli.md, ``vgrpo plan``, states them with the formula):

- weights: the denoiser's parameter bytes in its dtype (counted exactly on the meta device);
- trainable state: LoRA keeps fp32 adapters, their fp32 gradients and AdamW's two fp32 moments
  (16 bytes per LoRA parameter) beside the frozen base; full fine-tuning trains every weight in its own
  dtype (the trainer keeps no separate master copy: weights, gradients and two AdamW moments, 4x the
  weight bytes; ``dtype = "fp32"`` with ``mixed_precision = "bf16"`` makes the fp32 weights the master);
- activations of one micro-batch: ``micro_batch x tokens x hidden x bytes x (layers x A)`` without
  gradient checkpointing, ``... x (layers + A)`` with it (each block keeps its input; one block is
  recomputed at a time); ``A = ACTIVATION_FACTOR`` values saved per token and hidden unit in a block;
  context parallelism (``[parallel] context = C``) leaves each process ``tokens / C`` of them;
- sharding over N processes: ZeRO-2 divides gradients and optimizer state by N, FSDP2 also the weights
  (plus one block gathered at a time); DDP divides nothing;
- reward models: on the GPU all along, or (``train.offload_rewards``) only while scoring, when the
  training state is idle but resident.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

GIB = 2**30
ACTIVATION_FACTOR = 24
"""Values a transformer block keeps for backward per token and hidden unit (norms, q/k/v, attention
output with fused attention, the MLP's 4x-wide hidden and its activation, residuals). Set from the saved
tensors of a narrow FLUX (4 blocks of width 256, real ratios, 320 tokens) on the CPU, 23.4; the same
measure on narrow Wan and SD3 and the tiny models gives 18 to 33, within the factor of 2 that
``tests/test_plan.py`` holds the estimate to."""
HEADROOM = 0.9
"""A configuration "fits" when its estimate is at most this share of the GPU's memory: the CUDA context,
the allocator's fragmentation and cuBLAS workspaces are not in the sums."""
SHARDING = {
    "none": "nothing sharded",
    "zero2": "grads + optimizer / N",
    "fsdp2": "weights + grads + optimizer / N",
}


@dataclass(frozen=True)
class DenoiserShape:
    """What the sums need from the denoiser: counted on the meta device, so no memory is used."""

    params: int
    weight_bytes: int
    lora_params: int  # 0 without LoRA targets
    hidden: int
    layers: int
    largest_block_bytes: int


@dataclass(frozen=True)
class Setup:
    """The recipe's and the command line's choices that change the sums."""

    finetune: str = "lora"  # "lora" | "full"
    micro_batch: int = 1
    tokens: int = 0  # per sample, image (or video) + text
    checkpointing: bool = False
    compute_bytes: int = 2  # per activation value: 2 under bf16 / fp16 autocast or weights, 4 in fp32
    sharding: str = "none"  # a key of SHARDING
    gpus: int = 1
    reward_bytes: int = 0
    offload_rewards: bool = False
    measured_activations: int | None = None  # saved-tensor bytes of a model small enough to run
    context: int = 1  # [parallel] context: processes that share a sample's tokens (its activations too)


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU, term by term; ``peak`` is what must fit."""

    weights: int
    trainable: int
    gradients: int
    optimizer: int
    activations: int
    rewards: int
    peak: int

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("weights", self.weights),
            ("trainable (LoRA, fp32)", self.trainable),
            ("gradients", self.gradients),
            ("optimizer (AdamW, 2 moments)", self.optimizer),
            ("activations (one micro-batch)", self.activations),
            ("reward models on the GPU", self.rewards),
        ]


def shape_of(denoiser: torch.nn.Module, lora_rank: int, lora_targets: list[str] | None) -> DenoiserShape:
    """The denoiser's counts; ``lora_targets`` as peft matches them (a module name equal to a target or
    ending in ``.target``), ``None`` for full fine-tuning."""
    params = list(denoiser.parameters())
    lora = 0
    if lora_targets is not None:
        for name, module in denoiser.named_modules():
            if isinstance(module, torch.nn.Linear) and any(
                name == t or name.endswith("." + t) for t in lora_targets
            ):
                lora += lora_rank * (module.in_features + module.out_features)
    blocks = [b for name, m in denoiser.named_children() if name.endswith("blocks") for b in m.children()]
    block_bytes = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks]
    return DenoiserShape(
        params=sum(p.numel() for p in params),
        weight_bytes=sum(p.numel() * p.element_size() for p in params),
        lora_params=lora,
        hidden=_hidden(denoiser),
        layers=max(len(blocks), 1),
        largest_block_bytes=max(block_bytes, default=0),
    )


def _hidden(denoiser: torch.nn.Module) -> int:
    """The model's width: heads x head size from a diffusers config, else the most common Linear input."""
    config = getattr(denoiser, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "attention_head_dim", None)
    if isinstance(heads, int) and isinstance(head_dim, int):
        return heads * head_dim
    widths = Counter(m.in_features for m in denoiser.modules() if isinstance(m, torch.nn.Linear))
    return widths.most_common(1)[0][0] if widths else 1


def activation_bytes(shape: DenoiserShape, setup: Setup) -> int:
    """The formula of the module docstring for one micro-batch (the measurement, where one was made)."""
    if setup.measured_activations is not None:
        return -(-setup.measured_activations // setup.context)
    tokens = -(-setup.tokens // setup.context)  # a process of a context group holds its share of the tokens
    per_layer = setup.micro_batch * tokens * shape.hidden * setup.compute_bytes
    kept = shape.layers + ACTIVATION_FACTOR if setup.checkpointing else shape.layers * ACTIVATION_FACTOR
    return per_layer * kept


def estimate(shape: DenoiserShape, setup: Setup) -> Estimate:
    """Peak bytes per GPU: the larger of training (state + activations) and scoring (state + rewards)."""
    n = max(setup.gpus, 1)
    if setup.finetune == "lora":
        trainable = 4 * shape.lora_params
        gradients, optimizer = trainable, 2 * trainable
    else:
        trainable = 0
        gradients, optimizer = shape.weight_bytes, 2 * shape.weight_bytes
    weights = shape.weight_bytes
    if setup.sharding in ("zero2", "fsdp2"):
        gradients, optimizer = gradients // n, optimizer // n
    if setup.sharding == "fsdp2":
        weights = weights // n + shape.largest_block_bytes  # one unit gathered for its forward
        trainable //= n
    activations = activation_bytes(shape, setup)
    state = weights + trainable + gradients + optimizer
    rewards = 0 if setup.offload_rewards else setup.reward_bytes
    peak = max(state + activations + rewards, state + setup.reward_bytes)
    return Estimate(weights, trainable, gradients, optimizer, activations, rewards, peak)


def saved_activation_bytes(forward: Callable[[], Any], module: torch.nn.Module) -> int:
    """Bytes autograd keeps for backward while ``forward()`` runs, each storage once and ``module``'s
    weights left out: the measured counterpart of ``activation_bytes``, to check it on a small model."""
    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if t.device.type != "meta" and storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(seen.values())
