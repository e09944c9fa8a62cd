"""Context parallelism: ``[parallel] context = N`` processes share each sample's tokens.

A video of 33 frames at 480p is ~32k tokens per sample; attention over them, and the activations a
training forward keeps, may not fit one GPU even with the weights sharded. diffusers' context-parallel
API splits the token sequence of a model that declares a plan (``_cp_plan``: where to split the inputs
and where to gather the output) over a group of processes; attention exchanges heads (Ulysses: an
all-to-all, needs ``heads % N == 0``) or key/value blocks (ring: needs an attention kernel that returns
the log-sum-exp, e.g. ``train.attention_backend = "flash"``). The output is gathered, so every process
of a group sees the whole velocity.

What the core does around it, so that ``W`` processes with ``context = N`` equal one process:

- processes ``N * g ... N * g + N - 1`` form context group ``g``; a group is one data-parallel rank
  (``Shard(rank // N, W // N)``): its processes hold the same rows, draw the same noise and ``(t, eps)``
  pairs, and make the same forwards in the same order (each forward is a collective of the group);
- each process's backward reaches only its own tokens' share of every gradient, so the sum over a group
  is the whole gradient. The data-parallel wrapper (DDP, FSDP2) averages over all ``W`` processes; the
  loss is therefore scaled by ``N`` before ``backward``, which makes the average the data-parallel mean
  of whole gradients (``gradient_scale``);
- gathered rows and objects keep one copy per group (``data_parallel.gather_rows(..., context=N)``).

The one network call of the core is unchanged: the split and the gather are hooks diffusers puts on the
model, so rollouts, evaluation and training use it alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal
from unittest import mock

import torch

from vgrpo_platform.errors import RecipeError

Split = Literal["ulysses", "ring"]
SPLITS: tuple[str, ...] = ("ulysses", "ring")


def check_layout(world: int, degree: int) -> None:
    """``world`` processes must form whole groups of ``degree``."""
    if degree > 1 and world % degree:
        raise RecipeError(
            f"parallel.context = {degree} needs a multiple of {degree} processes, but {world} were launched; "
            f"launch {degree * max(1, world // degree)} processes (accelerate launch --num_processes) "
            "or change parallel.context"
        )


def parallel_models(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The diffusers models inside ``module`` (itself, or e.g. both experts of Wan 2.2's ``WanExperts``)."""
    if hasattr(module, "enable_parallelism"):
        return [module]
    return [found for child in module.children() for found in parallel_models(child)]


def degree_of(module: torch.nn.Module) -> int:
    """How many processes share a sample's tokens in ``module`` (1: context parallelism is off)."""
    for model in parallel_models(module):
        config = getattr(model, "_parallel_config", None)
        cp = getattr(config, "context_parallel_config", None)
        if cp is not None:
            return int(cp.ring_degree) * int(cp.ulysses_degree)
    return 1


def enable(module: torch.nn.Module, degree: int, split: Split, owner: str) -> str:
    """Split every diffusers model inside ``module`` over context groups of ``degree`` processes.

    Every process of the run must call this at the same point (building the device mesh is a
    collective). ``owner``: the adapter's name, for messages. Returns the run's start-up line.
    """
    import torch.distributed as dist

    if split not in SPLITS:
        raise RecipeError(f"parallel.context_split: expected one of {SPLITS}, got {split!r}")
    models = parallel_models(module)
    missing = [type(m).__name__ for m in models if getattr(m, "_cp_plan", None) is None]
    if not models or missing:
        names = ", ".join(missing) or type(module).__name__
        raise RecipeError(
            f"adapter '{owner}': the installed diffusers has no context-parallel plan for {names}; "
            "set parallel.context = 1 (or shard the weights instead: docs/scaling.md)"
        )
    for model in models:
        _check_heads(model, degree, split, owner)
        if split == "ring":
            _check_ring_backend(model, owner)
    if not (dist.is_available() and dist.is_initialized()):
        raise RecipeError(
            f"parallel.context = {degree} needs {degree} or more processes; launch with accelerate launch "
            "or torchrun (docs/scaling.md), or set parallel.context = 1"
        )
    world = dist.get_world_size()
    check_layout(world, degree)
    from diffusers import ContextParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    device_type = torch._C._get_accelerator().type
    ring, ulysses = (degree, 1) if split == "ring" else (1, degree)
    mesh = init_device_mesh(
        device_type, (world // degree, ring, ulysses), mesh_dim_names=("data", "ring", "ulysses")
    )
    with _one_device_per_process_on_cpu():
        for model in models:
            config = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses, mesh=mesh)
            try:
                model.enable_parallelism(config=config)  # type: ignore[operator]
            except (ValueError, RuntimeError) as exc:  # e.g. an attention backend without context parallelism
                raise RecipeError(f"adapter '{owner}': parallel.context = {degree}: {exc}") from exc
    groups = world // degree
    return (
        f"context parallel: {degree} processes per sample ({split}), {groups} data-parallel "
        f"group{'s' if groups != 1 else ''}, {len(models)} model{'s' if len(models) != 1 else ''} split"
    )


def _check_heads(model: torch.nn.Module, degree: int, split: Split, owner: str) -> None:
    heads = getattr(getattr(model, "config", None), "num_attention_heads", None)
    if split == "ulysses" and isinstance(heads, int) and heads % degree:
        raise RecipeError(
            f"adapter '{owner}': Ulysses context parallelism splits the {heads} attention heads over "
            f"{degree} processes, which does not divide; set parallel.context to a divisor of {heads} "
            "or parallel.context_split = 'ring'"
        )


# diffusers' context-parallel attention backends whose kernel cannot return the log-sum-exp ring needs
NO_LOG_SUM_EXP = ("native", "_native_npu")


def _check_ring_backend(model: torch.nn.Module, owner: str) -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    default = _AttentionBackendRegistry.get_active_backend()[0]
    chosen = [getattr(m, "processor", None) for m in model.modules()]
    backends = {
        AttentionBackendName(getattr(p, "_attention_backend", None) or default).value
        for p in chosen
        if hasattr(p, "_attention_backend")
    }
    lacking = sorted(backends & set(NO_LOG_SUM_EXP))
    if lacking:
        raise RecipeError(
            f"adapter '{owner}': ring context parallelism needs an attention kernel that returns the "
            f"log-sum-exp, which '{lacking[0]}' does not; set train.attention_backend = 'flash' (or "
            "'_native_cudnn', '_native_flash', 'sage') or parallel.context_split = 'ulysses'"
        )


@contextmanager
def _one_device_per_process_on_cpu() -> Iterator[None]:
    """diffusers picks a process's device as ``rank % torch.accelerator.device_count()``, which divides by
    zero on a machine without an accelerator. There every process uses the CPU: count one device."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    with mock.patch.object(torch.accelerator, "device_count", lambda: 1):
        yield


def gradient_scale(module: torch.nn.Module) -> float:
    """What multiplies the loss before ``backward``: the context degree (see the module's docstring)."""
    return float(degree_of(module))
