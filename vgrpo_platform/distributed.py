"""Data parallelism through accelerate: which rows a rank owns, and how ranks agree on the rest.

The rule that makes an N-process run equal the single-process run on the same global batch: every
rank draws every random number *for the global batch* from the same seeded generators (rollout
noise, the surrogate's ``(t, eps)`` pairs) and keeps its own rows, so the generators stay in step
and each sample sees the numbers it would have seen alone. Ranks own contiguous blocks of whole
prompt groups; rewards are gathered so advantages and metrics see the full batch; gradients are
averaged by the wrapper ``accelerate`` chose (DDP here); only the main process writes.

Nothing here imports a model family; single-process runs go through the same code with
``world == 1``, where every helper is the identity.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from vgrpo_platform.errors import RecipeError


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``world`` processes."""

    rank: int = 0
    world: int = 1

    def block(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` items (shares differ by at most one)."""
        return slice(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def prompt_block(self, n_prompts: int) -> slice:
        """This rank's prompts of an iteration; training needs equal shares (DDP steps in lockstep)."""
        if n_prompts % self.world:
            raise RecipeError(
                f"rollout.prompts_per_iteration = {n_prompts} does not split evenly over {self.world} "
                f"processes; set it to a multiple of {self.world}"
            )
        return self.block(n_prompts)


@dataclass(frozen=True)
class RowsOf:
    """Where a rank's rows sit in the global batch, for surrogates that draw per-batch randomness.

    ``global_group_ids`` ``[N]`` are the whole batch's group ids, ``start`` the first local row.
    ``timesteps.draw_pairs(..., rows=...)`` draws for all ``N`` rows and keeps the local ones.
    """

    global_group_ids: torch.Tensor
    start: int

    def local(self, tensor: torch.Tensor, n_local: int) -> torch.Tensor:
        return tensor[self.start : self.start + n_local]


def shard_of(accelerator: Any) -> Shard:
    return Shard(int(accelerator.process_index), int(accelerator.num_processes))


def gather_rows(accelerator: Any, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's equal-length ``[n, ...]`` tensor in rank order: ``[world * n, ...]``."""
    if accelerator.num_processes == 1:
        return tensor
    return accelerator.gather(tensor.to(accelerator.device)).cpu()


def gather_objects(accelerator: Any, items: list) -> list:
    """Concatenate every rank's Python list in rank order (lengths may differ)."""
    if accelerator.num_processes == 1:
        return items
    from accelerate.utils import gather_object

    return gather_object(items)


def reduce_metrics(accelerator: Any, metrics: dict[str, float]) -> dict[str, float]:
    """Average float metrics over ranks (``*_max`` / ``*_min`` keys: max / min). Every rank must
    pass the same keys; equal shard sizes make the mean of means the global mean."""
    if accelerator.num_processes == 1 or not metrics:
        return metrics
    keys = sorted(metrics)
    local = torch.tensor([[float(metrics[k]) for k in keys]], dtype=torch.float64)  # [1, K]
    table = gather_rows(accelerator, local)  # [world, K]
    out = {}
    for j, key in enumerate(keys):
        column = table[:, j]
        if key.endswith("_max"):
            out[key] = float(column.max())
        elif key.endswith("_min"):
            out[key] = float(column.min())
        else:
            out[key] = float(column.mean())
    return out


class RoutedDenoiser:
    """Route calls of an adapter's own ``denoiser`` through the wrapper accelerate built around it.

    Adapters call ``self.denoiser(...)`` and read ``self.denoiser.config``; replacing the module
    with a DDP wrapper would break the second. Instead the module stays in place and its
    ``forward`` is redirected to the wrapper, whose own call of the module falls through to the
    original ``forward`` (a per-thread re-entry flag). Parameter names, ``save_pretrained`` and
    peft's LoRA switches keep working on the unwrapped module.
    """

    def __init__(self, module: torch.nn.Module, wrapper: torch.nn.Module) -> None:
        self.module, self.wrapper = module, wrapper
        self._original_forward = module.forward
        self._inside = threading.local()

        def routed_forward(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if getattr(self._inside, "active", False):
                return self._original_forward(*args, **kwargs)
            self._inside.active = True
            try:
                return self.wrapper(*args, **kwargs)
            finally:
                self._inside.active = False

        module.forward = routed_forward

    def no_sync(self, accelerator: Any):  # noqa: ANN201 - a context manager
        """Skip the gradient all-reduce (every micro-batch but a step's last one)."""
        return accelerator.no_sync(self.wrapper)

    def restore(self) -> None:
        self.module.forward = self._original_forward


def _distributed_type(accelerator: Any) -> str:
    return str(accelerator.distributed_type).rsplit(".", 1)[-1]  # "MULTI_GPU", "FSDP", ...


def describe(accelerator: Any) -> str:
    """How the policy is made data-parallel, in a user's words: ``"DDP"``, ``"FSDP2"``, ..."""
    kind = _distributed_type(accelerator)
    if kind == "FSDP":
        return "FSDP2" if getattr(accelerator, "is_fsdp2", False) else "FSDP1"
    return "DDP" if kind.startswith("MULTI_") else kind


def prepare_for_data_parallel(
    accelerator: Any, module: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[RoutedDenoiser | None, torch.optim.Optimizer]:
    """Let accelerate make ``module`` data-parallel; returns the routing (DDP) and the optimiser to use.

    DDP wraps the module, so its calls are routed through the wrapper. FSDP2 shards the module in
    place (its parameters become ``DTensor`` slices that each forward gathers) and needs the
    optimiser prepared with it; the caller must then re-read the parameters (``sharding``). One
    process: nothing changes.
    """
    if accelerator.num_processes == 1:
        return None, optimizer
    kind = _distributed_type(accelerator)
    if kind == "DEEPSPEED":
        raise RecipeError(
            "DeepSpeed launches are not supported yet; launch with recipes/accelerate/fsdp2_8gpu.yaml "
            "(FSDP2 shards parameters, gradients and optimiser state like ZeRO-3) or a DDP config"
        )
    if kind == "FSDP":
        if not getattr(accelerator, "is_fsdp2", False):
            raise RecipeError("FSDP1 is not supported; set fsdp_version: 2 in the accelerate config")
        sharded, optimizer = accelerator.prepare(module, optimizer)
        if sharded is not module:  # FSDP2 shards in place: the adapter keeps calling its own module
            raise RecipeError("accelerate replaced the model instead of sharding it in place; use FSDP2")
        return None, optimizer
    wrapper = accelerator.prepare_model(module)
    if wrapper is module:  # a distributed type accelerate does not wrap: gradients would not sync
        raise RecipeError(
            f"accelerate's distributed type {accelerator.distributed_type} left the model unwrapped; "
            "launch with a DDP or FSDP2 config (see docs/scaling.md)"
        )
    return RoutedDenoiser(module, wrapper), optimizer


def lockstep_rows(shard: Shard, n_items: int) -> int:
    """How many items every rank processes when ``n_items`` split unevenly (the largest share).

    Sharded models gather their weights in each forward pass, a collective: ranks must run the
    same number of forwards, so a rank with a smaller share pads its batch up to this.
    """
    return -(-n_items // shard.world)


@contextmanager
def maybe_no_sync(routed: RoutedDenoiser | None, accelerator: Any, skip: bool) -> Iterator[None]:
    """``no_sync`` when ``skip`` and a wrapper exists; otherwise nothing."""
    with routed.no_sync(accelerator) if (routed is not None and skip) else nullcontext():
        yield
