"""Reward models on the accelerator only while they score (``train.offload_rewards``).

Why: a reward model (PickScore or HPSv2 ~2 GB in bf16, ImageReward ~1 GB) sits idle through the
rollout and the update, which is where the generator needs its memory. Parked in host memory between
uses (``park`` once after building, ``on_device`` around each call) it frees that much accelerator
memory, for two host<->device copies per scoring call.

Plugin-agnostic: a reward need not cooperate. Its ``torch.nn.Module``s are found by looking at the
object, its attributes and a few levels below them (containers and plain holder objects), which is
how rewards keep their models: ``self.model``, ``self.clip.model`` (a bundle), ``self.inner.clip.model``
(a reward wrapping another), ``self.heads = [...]``. Only modules move; a plain tensor attribute
stays where the reward put it.

Safety: ``on_device`` puts every module back on the device it came from, so a module a reward
borrows from the generator (say its VAE, still on the GPU) is never left elsewhere; ``park`` skips
modules reachable from ``keep`` (the adapter) for the same reason.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

_LEAVES = (str, bytes, bytearray, int, float, complex, bool, torch.Tensor, torch.dtype, torch.device)
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def modules_of(obj: Any, depth: int = 3) -> list[torch.nn.Module]:
    """The ``nn.Module``s reachable from ``obj`` within ``depth`` steps, each once, in visiting order.

    A step is an attribute, a list/tuple/set item or a dict value. Modules are not searched inside
    (``.to`` moves their children with them); Python modules, classes and functions are never entered.
    """
    found: dict[int, torch.nn.Module] = {}
    seen: set[int] = set()

    def visit(x: Any, level: int) -> None:
        if isinstance(x, torch.nn.Module):
            found.setdefault(id(x), x)
            return
        if x is None or isinstance(x, _LEAVES + _OPAQUE) or id(x) in seen or level >= depth:
            return
        seen.add(id(x))
        if isinstance(x, Mapping):
            children = list(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            children = list(x)
        else:
            children = list(getattr(x, "__dict__", {}).values())
        for child in children:
            visit(child, level + 1)

    visit(obj, 0)
    return list(found.values())


def device_of(module: torch.nn.Module) -> torch.device | None:
    """The one device holding all of ``module``'s tensors; None when it has none or spans several
    (a model dispatched over devices manages its own placement and is left alone)."""
    devices = {t.device for t in itertools.chain(module.parameters(), module.buffers())}
    return devices.pop() if len(devices) == 1 else None


def park(obj: Any, keep: Any = None) -> int:
    """Move ``obj``'s modules to host memory, except modules reachable from ``keep`` (the adapter, so
    a reward sharing the generator's VAE does not take it off the GPU). Returns how many moved."""
    kept = {id(sub) for module in modules_of(keep) for sub in module.modules()} if keep is not None else set()
    moved = 0
    for module in modules_of(obj):
        if id(module) not in kept and device_of(module) is not None:
            module.to("cpu")
            moved += 1
    return moved


@contextmanager
def on_device(obj: Any, device: torch.device | str | None) -> Iterator[list[torch.nn.Module]]:
    """``obj``'s modules on ``device`` inside the block; after it (also on error) each goes back to
    where it was: host memory for a parked reward. Yields the modules moved.

    No-op (yields ``[]``) when ``device`` is None or the CPU: there is nothing to free.
    """
    target = torch.device(device) if device is not None else None
    if target is None or target.type == "cpu":
        yield []
        return
    homes = [(m, home) for m in modules_of(obj) if (home := device_of(m)) is not None]
    try:
        for module, _ in homes:
            module.to(target)
        yield [m for m, _ in homes]
    finally:
        for module, home in homes:
            module.to(home)
