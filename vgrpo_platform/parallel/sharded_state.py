"""Sharded training state (FSDP2, DeepSpeed ZeRO-2): full tensors out of it for checkpoints and
exports, and back in.

Under FSDP2 every parameter of the policy, and the optimiser state beside it, is a ``DTensor`` of
which each rank holds a slice. Under ZeRO-2 the module's weights stay whole, but the optimiser
state and an fp32 master copy of the trainable weights are flat partitions, one per rank, that
DeepSpeed's tensor-fragment API (``deepspeed.utils.safe_get_full_*`` / ``safe_set_full_*``) reads
and writes per parameter. Checkpoints store full tensors in the very layout of a single-process
run (``trainable.safetensors`` by parameter name, the optimiser state by index), so a run may
resume on another number of processes or under another launcher. Gathering and scattering are
collectives: every rank calls these functions in the same order; plain tensors pass through.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def _is_sharded(tensor: Any) -> TypeGuard[DTensor]:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (all-gather of a ``DTensor``), detached."""
    return (tensor.full_tensor() if _is_sharded(tensor) else tensor).detach()


def like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``value`` (a full tensor) sharded as ``param`` is, on ``param``'s device and dtype."""
    value = value.to(param.device, param.dtype)
    if not _is_sharded(param):
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value, param.device_mesh, param.placements)


def _has_master(param: torch.Tensor) -> bool:
    """Whether DeepSpeed ZeRO keeps an fp32 master copy of ``param`` (partitioned over ranks)."""
    return hasattr(param, "_hp_mapping")


def full_weights(trainable: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Name -> full tensor, in a fixed order so every rank's gathers pair up (ZeRO: the fp32 master)."""
    out = {}
    for name in sorted(trainable):
        param = trainable[name]
        if _has_master(param):
            from deepspeed.utils import safe_get_full_fp32_param

            out[name] = safe_get_full_fp32_param(param).detach()
        else:
            out[name] = full(param)
    return out


def load_weights(trainable: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> None:
    """Copy full ``weights`` into the (possibly sharded) parameters, each rank keeping its slice,
    and into ZeRO's master copy, which the next optimiser step would otherwise write back."""
    with torch.no_grad():
        for name in sorted(trainable):
            param = trainable[name]
            param.copy_(like(weights[name], param))
            if _has_master(param):
                from deepspeed.utils import safe_set_full_fp32_param

                safe_set_full_fp32_param(param, weights[name].to(param.device, torch.float32))


def full_optimizer_state(state_dict: dict) -> dict:
    """``optimizer.state_dict()`` with every sharded state tensor gathered (same keys and order)."""
    state = {}
    for index in sorted(state_dict["state"]):
        entry = state_dict["state"][index]
        state[index] = {key: full(value) if torch.is_tensor(value) else value for key, value in entry.items()}
    return {"state": state, "param_groups": state_dict["param_groups"]}


def shard_optimizer_state(state_dict: dict, optimizer: torch.optim.Optimizer) -> dict:
    """The inverse of ``full_optimizer_state`` for ``optimizer``'s (possibly sharded) parameters.

    ``torch.optim`` numbers parameters in ``param_groups`` order; a state tensor shaped like its
    parameter is sharded like it, anything else (Adam's ``step``) is kept whole.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in state_dict["state"].items():
        param = params[int(index)]
        state[index] = {
            key: like(value, param) if torch.is_tensor(value) and value.shape == param.shape else value
            for key, value in entry.items()
        }
    return {"state": state, "param_groups": state_dict["param_groups"]}


def _zero_optimizer(optimizer: torch.optim.Optimizer) -> Any:
    """The DeepSpeed ZeRO optimiser behind accelerate's wrapper, or ``None``."""
    if "deepspeed" not in sys.modules:
        return None
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, ZeROOptimizer) else None


def _is_partitioned(value: Any, flat: torch.Tensor) -> bool:
    """A state tensor laid out like a ZeRO flat partition (Adam's moments), not a scalar (``step``)."""
    return torch.is_tensor(value) and value.shape == flat.shape


def _copy(value: Any) -> Any:
    return value.clone() if torch.is_tensor(value) else value


def gather_optimizer(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> dict:
    """The full optimiser state in the single-process layout (indices follow ``params``).

    ``torch.optim`` and FSDP2: ``full_optimizer_state``. ZeRO: the client optimiser steps one flat
    fp32 partition per parameter group; each parameter's slice of every moment is gathered by
    DeepSpeed's ``safe_get_full_optimizer_state``; each parameter gets its own copy of the group's
    scalars (``step``), as torch keeps them (one shared tensor would be advanced once per parameter).
    """
    zero = _zero_optimizer(optimizer)
    if zero is None:
        return full_optimizer_state(optimizer.state_dict())
    from deepspeed.utils import safe_get_full_optimizer_state

    index = {id(p): i for i, p in enumerate(params)}
    client = zero.optimizer  # the torch optimiser the trainer built; its groups hold the partitions
    state, groups = {}, []
    for group, members in zip(client.param_groups, zero.bit16_groups, strict=True):
        flat_state = client.state.get(group["params"][0], {})
        keys = sorted(k for k, v in flat_state.items() if _is_partitioned(v, group["params"][0]))
        for param in members:
            if flat_state:  # no state before the first step, as in torch
                shared = {k: _copy(v) for k, v in flat_state.items() if k not in keys}  # one per param
                moments = {key: safe_get_full_optimizer_state(param, key).detach() for key in keys}
                state[index[id(param)]] = {**shared, **moments}
        settings = {k: v for k, v in group.items() if k != "params"}
        groups.append({**settings, "params": [index[id(p)] for p in members]})
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def load_optimizer(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], state_dict: dict
) -> None:
    """Load a ``gather_optimizer`` state (single-process layout) into ``optimizer``, each rank its share.

    ZeRO: the client optimiser's state for each flat partition is created (zeros, and the group's
    ``step``), linked to the parameters as DeepSpeed does after a first step, then every moment is
    written through DeepSpeed's ``safe_set_full_optimizer_state``.
    """
    zero = _zero_optimizer(optimizer)
    if zero is None:
        optimizer.load_state_dict(shard_optimizer_state(state_dict, optimizer))
        return
    from deepspeed.utils import safe_set_full_optimizer_state

    client = zero.optimizer
    for group, saved in zip(client.param_groups, state_dict["param_groups"], strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})  # lr, betas, ... as saved
        entries = [(params[i], state_dict["state"][i]) for i in saved["params"] if i in state_dict["state"]]
        if not entries:
            continue
        flat = group["params"][0]
        param, entry = entries[0]
        client.state[flat] = {
            k: torch.zeros_like(flat) if _is_partitioned(v, param) else _copy(v) for k, v in entry.items()
        }
    zero._lazy_init_hp_params_optimizer_state()  # point each parameter's fragment at the new state
    for param, entry in ((params[i], e) for i, e in sorted(state_dict["state"].items())):
        for key, value in entry.items():
            if _is_partitioned(value, param):
                safe_set_full_optimizer_state(param, value.to(param.device, torch.float32), key)


@contextmanager
def unsharded(module: torch.nn.Module) -> Iterator[None]:
    """Inside, ``module``'s parameters are whole tensors on every rank; the sharded ones come back after.

    For code that reads the module directly, such as an adapter's ``export_trained`` (peft's
    ``get_peft_model_state_dict``, ``save_pretrained``). FSDP2's own ``unshard`` is not enough: outside
    a forward the module keeps its ``DTensor`` slices registered. So each ``DTensor`` parameter is
    all-gathered and registered in its place, in module order (every rank must enter: collectives). No
    forward may run inside. With no sharded parameter it does nothing.
    """
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is None or not _is_sharded(param.data):
                continue
            whole = torch.nn.Parameter(full(param), requires_grad=param.requires_grad)
            swapped.append((sub, name, param))  # a DTensor registered as a Parameter
            sub._parameters[name] = whole
    try:
        yield
    finally:
        for sub, name, param in reversed(swapped):
            sub._parameters[name] = param


@contextmanager
def gathered_while_generating(module: torch.nn.Module) -> Iterator[None]:
    """Inside, each FSDP2 unit of ``module`` all-gathers its weights at its first forward and keeps them
    whole until the block ends; after it, every unit is resharded and resharding after forward restored.

    Why: a rollout calls the denoiser once per solver step (and per CFG branch) without gradients; with
    FSDP2's ``reshard_after_forward`` each of those forwards all-gathers every unit again, a rollout of S
    steps S times over. Generating with whole weights costs one unit's full size per unit for the
    rollout's length, the memory a single process holds anyway. Every rank must enter; without FSDP2 units
    it does nothing.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    saved: list[tuple[Any, Any, bool | None, Any]] = []
    for unit in units:  # FSDP2 keeps the setting per unit: remember it exactly, root's automatic one too
        state = unit._get_fsdp_state()
        group = state._fsdp_param_group
        mesh_info = group.post_forward_mesh_info if group is not None else None
        saved.append((state, group, state._auto_reshard_after_forward, mesh_info))
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit_state, unit_group, auto, unit_mesh_info in saved:
            unit_state._auto_reshard_after_forward = auto
            if unit_group is not None:
                unit_group.post_forward_mesh_info = unit_mesh_info
        for unit in reversed(units):
            unit.reshard()
