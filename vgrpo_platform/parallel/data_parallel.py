"""Data parallelism through accelerate: which rows a rank owns, and how ranks agree on the rest.

The rule that makes an N-process run equal the single-process run on the same global batch: every
rank draws every random number *for the global batch* from the same seeded generators (rollout
noise, the surrogate's ``(t, eps)`` pairs) and keeps its own rows, so the generators stay in step
and each sample sees the numbers it would have seen alone. Ranks own contiguous blocks of whole
prompt groups; rewards are gathered so advantages and metrics see the full batch; gradients are
averaged by what ``accelerate`` prepared (DDP, FSDP2 or a DeepSpeed ZeRO-2 engine); only the main
process writes.

Nothing here imports a model family; single-process runs go through the same code with
``world == 1``, where every helper is the identity.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vgrpo_platform.errors import RecipeError
from vgrpo_platform.parallel.context_parallel import check_layout


class RoutableCall(Protocol):
    """What this module needs of the core's call of the denoiser (``network.DenoiserCall``): the module to
    make data-parallel, a place for its wrapper, and a way around it."""

    module: torch.nn.Module

    def route_gradients(self, wrapper: Any) -> None: ...

    def unrouted(self) -> AbstractContextManager[None]: ...


@dataclass(frozen=True)
class Shard:
    """Data-parallel rank ``rank`` of ``world``. Under context parallelism (``context`` processes per
    sample, ``context_parallel.py``) a rank is a group of processes that hold the same rows."""

    rank: int = 0
    world: int = 1
    context: int = 1

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


def shard_of(accelerator: Any, context: int = 1) -> Shard:
    """This process's data-parallel rank; ``context`` processes in a row share one (context parallelism)."""
    processes, index = int(accelerator.num_processes), int(accelerator.process_index)
    check_layout(processes, context)
    return Shard(index // context, processes // context, context)


def gather_rows(accelerator: Any, tensor: torch.Tensor, context: int = 1) -> torch.Tensor:
    """Concatenate every data-parallel rank's equal-length ``[n, ...]`` tensor in rank order:
    ``[world * n, ...]`` (one copy per context group: its processes hold the same rows)."""
    if accelerator.num_processes == 1:
        return tensor
    gathered = accelerator.gather(tensor.to(accelerator.device)).cpu()
    if context == 1:
        return gathered
    per_process = gathered.reshape(accelerator.num_processes, *tensor.shape)
    return per_process[::context].reshape(-1, *tensor.shape[1:])


def any_rank(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` is set on any process (a signal or a fault may reach only some of them)."""
    if accelerator.num_processes == 1:
        return flag
    return bool(gather_rows(accelerator, torch.tensor([float(flag)])).max() > 0)


def process_group_kwargs(timeout_s: float | None) -> list[Any]:
    """accelerate's handler that sets the process group's collective timeout (``train.collective_timeout_s``):
    a rank that stops answering (paused, hung) fails the others' collectives after this many seconds,
    instead of torch's default (30 minutes for gloo). None: torch's default."""
    if timeout_s is None:
        return []
    from datetime import timedelta

    from accelerate.utils import InitProcessGroupKwargs

    return [InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))]


def build_accelerator(
    device: torch.device, mixed_precision: str, *, collective_timeout_s: float | None = None, **kwargs: Any
) -> Any:
    """accelerate's ``Accelerator`` for a training run (``kwargs``: e.g. its trackers).

    The model's buffers never change: no broadcast, so ranks need not forward in lockstep.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    return Accelerator(
        cpu=device.type == "cpu",
        mixed_precision=mixed_precision,
        kwargs_handlers=[
            DistributedDataParallelKwargs(broadcast_buffers=False),
            *process_group_kwargs(collective_timeout_s),
        ],
        **kwargs,
    )


def shut_down(accelerator: Any) -> None:
    """End a multi-process run cleanly: every rank reaches this point, then the process group is
    destroyed. A gloo group left alive at interpreter exit can abort a rank while its worker
    threads are torn down ("terminate called without an active exception")."""
    if accelerator.num_processes == 1:
        return
    import torch.distributed as dist

    accelerator.wait_for_everyone()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def gather_objects(accelerator: Any, items: list, context: int = 1) -> list:
    """Concatenate every data-parallel rank's Python list in rank order (lengths may differ; one copy
    per context group)."""
    if accelerator.num_processes == 1:
        return items
    from accelerate.utils import gather_object

    if context == 1:
        return gather_object(items)
    per_process = gather_object([items])
    return [item for part in per_process[::context] for item in part]


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
    """The wrapper accelerate built around the denoiser (DDP, a DeepSpeed engine), installed in the
    adapter's ``DenoiserCall``: forwards with gradients go through it, so their gradients are averaged.

    The module itself is never replaced nor patched: parameter names, ``config``, ``save_pretrained``
    and peft's LoRA switches keep working on it, and forwards without gradients (rollouts, evaluation,
    the old policy's values) reach it directly, as there is nothing to average.
    """

    def __init__(self, call: RoutableCall, wrapper: torch.nn.Module) -> None:
        self.call, self.wrapper = call, wrapper
        call.route_gradients(wrapper)

    def no_sync(self, accelerator: Any) -> AbstractContextManager[None]:
        """Skip the gradient all-reduce (every micro-batch but a step's last one)."""
        return accelerator.no_sync(self.wrapper)

    def bypassed(self) -> AbstractContextManager[None]:
        """Inside, calls reach the module itself: gradients a rank takes for itself, never averaged."""
        return self.call.unrouted()

    def restore(self) -> None:
        self.call.route_gradients(None)


class RoutedEngine(RoutedDenoiser):
    """A DeepSpeed engine: accelerate's ``backward`` of a step's last micro-batch also steps it.

    DeepSpeed fixes ``gradient_accumulation_steps`` when the engine is built, while a mini-batch
    here has as many micro-batches as its rows need. So the engine accumulates over one micro-batch
    (``gradient_accumulation_steps = 1``) and the boundary is set per micro-batch instead: inside
    ``no_sync`` accelerate's ``sync_gradients`` is off, its ``backward`` then marks no boundary and
    does not step; the last micro-batch's ``backward`` reduces, clips (``gradient_clipping``, set
    from ``train.grad_clip``) and steps. The optimiser accelerate returns has no-op ``step`` and
    ``zero_grad`` for that reason; ``accelerator.clip_grad_norm_`` returns the step's norm.
    """

    @contextmanager
    def no_sync(self, accelerator: Any) -> Iterator[None]:
        accelerator.sync_gradients = False
        try:
            yield
        finally:
            accelerator.sync_gradients = True


def _distributed_type(accelerator: Any) -> str:
    return str(accelerator.distributed_type).rsplit(".", 1)[-1]  # "MULTI_GPU", "FSDP", ...


def describe(accelerator: Any) -> str:
    """How the policy is made data-parallel, in a user's words: ``"DDP"``, ``"FSDP2"``, ``"HSDP (FSDP2,
    2 replicas x 8 shards)"``, ..."""
    kind = _distributed_type(accelerator)
    if kind == "DEEPSPEED":
        return f"DeepSpeed ZeRO-{accelerator.state.deepspeed_plugin.zero_stage}"
    if kind == "FSDP":
        if not getattr(accelerator, "is_fsdp2", False):
            return "FSDP1"
        mesh = getattr(accelerator, "parallelism_config", None)  # accelerate's parallelism_config (HSDP)
        if mesh is not None and mesh.dp_replicate_enabled:
            return f"HSDP (FSDP2, {mesh.dp_replicate_size} replicas x {mesh.dp_shard_size} shards)"
        return "FSDP2"
    return "DDP" if kind.startswith("MULTI_") else kind


def configure_launch(accelerator: Any, *, grad_clip: float | None, micro_batch_size: int) -> None:
    """Check the launch config against the recipe and fill what the recipe owns, before any model
    is built: a ZeRO-3 config, for one, would partition the model while it loads, a collective
    that deadlocks with the main process building first. Only DeepSpeed has such keys."""
    if accelerator.num_processes > 1 and _distributed_type(accelerator) == "DEEPSPEED":
        configure_deepspeed(accelerator.state.deepspeed_plugin, grad_clip, micro_batch_size)


def prepare_for_data_parallel(
    accelerator: Any, call: RoutableCall, optimizer: torch.optim.Optimizer
) -> tuple[RoutedDenoiser | None, torch.optim.Optimizer]:
    """Let accelerate make the denoiser of ``call`` data-parallel; returns the routing (DDP, DeepSpeed)
    and the optimiser to use.

    DDP wraps the module, so the core's calls with gradients go through the wrapper. FSDP2 shards
    the module in place (its parameters become ``DTensor`` slices that each forward gathers) and needs the
    optimiser prepared with it; the caller must then re-read the parameters (``sharded_state``).
    DeepSpeed ZeRO-2 (configured by ``configure_launch``) builds an engine from both: the module
    keeps whole weights, gradients and the optimiser state are partitioned, and its calls are
    routed like DDP's (``RoutedEngine``). One process: nothing changes.
    """
    if accelerator.num_processes == 1:
        return None, optimizer
    module = call.module
    kind = _distributed_type(accelerator)
    if kind == "DEEPSPEED":
        engine, optimizer = accelerator.prepare(module, optimizer)
        return RoutedEngine(call, engine), optimizer
    if kind == "FSDP":
        if not getattr(accelerator, "is_fsdp2", False):
            raise RecipeError("FSDP1 is not supported; set fsdp_version: 2 in the accelerate config")
        sharded, optimizer = accelerator.prepare(module, optimizer)
        if sharded is not module:  # FSDP2 shards in place: the core keeps calling the same module
            raise RecipeError("accelerate replaced the model instead of sharding it in place; use FSDP2")
        return None, optimizer
    wrapper = accelerator.prepare_model(module)
    if wrapper is module:  # a distributed type accelerate does not wrap: gradients would not sync
        raise RecipeError(
            f"accelerate's distributed type {accelerator.distributed_type} left the model unwrapped; "
            "launch with a DDP or FSDP2 config (see docs/scaling.md)"
        )
    return RoutedDenoiser(call, wrapper), optimizer


def configure_deepspeed(plugin: Any, grad_clip: float | None, micro_batch_size: int) -> None:
    """Fill the DeepSpeed config's keys that the recipe owns; stop on a config that contradicts it.

    ``gradient_accumulation_steps`` is 1 (vgrpo accumulates micro-batches itself, see
    ``RoutedEngine``), ``gradient_clipping`` is ``train.grad_clip`` (0: none) and
    ``train_micro_batch_size_per_gpu`` (DeepSpeed's throughput bookkeeping) ``train.micro_batch_size``.
    Only ZeRO-2 in fp32 without offloading is accepted: the combination the tests run, and the one
    whose numbers equal the other launchers' (accelerate passes ``run.mixed_precision`` to
    DeepSpeed, whose bf16 mode would store the trainable weights in bf16).
    """
    if plugin.zero_stage != 2:
        raise RecipeError(
            f"DeepSpeed ZeRO stage {plugin.zero_stage} is not supported; set zero_stage: 2 "
            "(recipes/accelerate/deepspeed_zero2_8gpu.yaml) or, to shard the parameters too, "
            "launch with recipes/accelerate/fsdp2_8gpu.yaml"
        )
    config = plugin.deepspeed_config
    zero = config.get("zero_optimization", {})
    if any(zero.get(k, {}).get("device", "none") != "none" for k in ("offload_optimizer", "offload_param")):
        raise RecipeError(
            "DeepSpeed offloading is not supported (it swaps in DeepSpeed's own CPU Adam); set "
            "offload_optimizer_device: none and offload_param_device: none in the accelerate config"
        )
    if any(str(config.get(k, {}).get("enabled", False)).lower() == "true" for k in ("bf16", "fp16")):
        raise RecipeError(
            "DeepSpeed's bf16/fp16 modes cast the whole model, LoRA included, to half precision (not "
            "run.mixed_precision's autocast); set run.mixed_precision = 'no' (the adapter's dtype = 'auto' "
            "still runs the base model in bf16 on GPUs) or launch with recipes/accelerate/fsdp2_8gpu.yaml"
        )
    steps = config.get("gradient_accumulation_steps", "auto")
    if steps not in ("auto", 1):
        raise RecipeError(
            f"the DeepSpeed config sets gradient_accumulation_steps: {steps}; set it to 1 "
            "(vgrpo accumulates micro-batches itself: train.micro_batch_size)"
        )
    clip = 0.0 if grad_clip is None else float(grad_clip)
    found = config.get("gradient_clipping", "auto")
    if found != "auto" and float(found) != clip:
        raise RecipeError(
            f"the DeepSpeed config sets gradient_clipping: {found} but train.grad_clip is {grad_clip}; "
            "remove gradient_clipping from the accelerate config (vgrpo sets it from train.grad_clip)"
        )
    config["gradient_accumulation_steps"], config["gradient_clipping"] = 1, clip
    if config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        config["train_micro_batch_size_per_gpu"] = micro_batch_size


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


def bypassed(routed: RoutedDenoiser | None) -> AbstractContextManager[None]:
    """Forwards inside reach the module itself (``RoutedDenoiser.bypassed``); without routing, nothing."""
    return routed.bypassed() if routed is not None else nullcontext()
