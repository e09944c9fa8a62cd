"""Sharded parameters (FSDP2): full tensors out of them for checkpoints and exports, and back in.

Under FSDP2 every parameter of the policy, and the optimiser state beside it, is a ``DTensor`` of
which each rank holds a slice. Checkpoints store full tensors in the very layout of a
single-process run (``trainable.safetensors`` by parameter name, the optimiser state by index), so
a run may resume on another number of processes or without FSDP. Gathering and scattering are
collectives: every rank calls these functions in the same order; plain tensors pass through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _is_sharded(tensor: Any) -> bool:
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


def full_weights(trainable: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Name -> full tensor, in a fixed order so every rank's gathers pair up."""
    return {name: full(trainable[name]) for name in sorted(trainable)}


def load_weights(trainable: dict[str, torch.nn.Parameter], weights: dict[str, torch.Tensor]) -> None:
    """Copy full ``weights`` into the (possibly sharded) parameters, each rank keeping its slice."""
    with torch.no_grad():
        for name in sorted(trainable):
            param = trainable[name]
            param.copy_(like(weights[name], param))


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


@contextmanager
def unsharded(module: torch.nn.Module) -> Iterator[None]:
    """Inside, ``module``'s parameters are whole on every rank (FSDP2 ``unshard`` of each unit).

    For code that reads the module directly, such as an adapter's ``export_trained``. Every rank
    must enter; with no FSDP unit inside ``module`` it does nothing.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in reversed(units):
            unit.reshard()
