"""What a checkpoint's files must hold, checked when they are read, before anything is loaded from them.

Files that parse can still be wrong inside (``state.json`` = ``[]``, ``"iteration": "six"``, an
``rng.safetensors`` with other keys, ``optimizer.pt`` = ``{}``); loaded as they are, each would end in a
traceback far from the file. ``check`` names the file and what is wrong, and ``checkpoint.py`` raises
that as ``DamagedCheckpoint``, which every reader (``--resume``, ``vgrpo sample``, ``eval``, ``export``)
skips for the next older checkpoint of the run, as it does an unreadable file.

What is checked depends on the reader (``Expect``): every reader needs the weights and ``state.json``'s
iteration; ``--resume`` also needs the optimiser, the random generators and the prompt position, and
knows the model's weight shapes and the run's length.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

RNG_KEYS = frozenset({"rollout", "surrogate", "shuffle", "torch"})  # run_state.LoopState.rng_state
_ITER = re.compile(r"^\.?(?:old_)?iter_(\d+)(?:_\d+)?$")  # iter_000006, or the aside .old_iter_000006_PID


@dataclass(frozen=True)
class Expect:
    """What the reader will load. ``resume``: all of it (optimiser, RNG, prompt position); ``shapes``: the
    model's trainable weights by name, and ``param_shapes`` the optimiser's parameters in order (checked
    when the checkpoint's fingerprint is ``fingerprint``: another model's checkpoint is the caller's error,
    not damage); ``total_iterations``: ``train.iterations``, the last iteration a checkpoint can hold."""

    resume: bool = False
    fingerprint: str | None = None
    shapes: dict[str, tuple[int, ...]] | None = None
    param_shapes: list[tuple[int, ...]] | None = None
    total_iterations: int | None = None


class Problem(ValueError):
    """One file's contents are wrong: ``file`` and ``what`` (a phrase)."""

    def __init__(self, file: str, what: str) -> None:
        super().__init__(f"{file}: {what}")
        self.file, self.what = file, what


def check(
    path: Path,
    *,
    weights: dict[str, torch.Tensor],
    optimizer: Any,
    rng: dict[str, torch.Tensor],
    state: Any,
    averaged: dict[str, torch.Tensor] | None,
    expect: Expect,
) -> None:
    """Raise ``Problem`` for the first thing in the checkpoint at ``path`` its reader cannot use."""
    check_state(path, state, expect)
    if averaged is not None and _shapes(averaged) != _shapes(weights):
        raise Problem("averaged.safetensors", "its names or shapes differ from trainable.safetensors")
    # another model's checkpoint is the caller's error (fingerprint), not damage: its shapes are not checked
    ours = expect.fingerprint is None or state.get("fingerprint") == expect.fingerprint
    if expect.shapes is not None and ours:
        _check_weights(weights, expect.shapes)
    if expect.resume:
        _check_rng(rng)
        _check_optimizer(optimizer, expect.param_shapes if ours else None)


def check_state(path: Path, state: Any, expect: Expect) -> None:
    """``state.json``: an object whose iteration is a whole number within the run (and the folder's)."""
    file = "state.json"
    if not isinstance(state, dict):
        raise Problem(file, f"holds {_kind(state)}, not an object")
    if "iteration" not in state:
        raise Problem(file, "has no 'iteration'")
    iteration = state["iteration"]
    if not _is_int(iteration) or iteration < 0:
        raise Problem(file, f"'iteration' is {iteration!r}, not a whole number >= 0")
    named = _ITER.match(path.name)
    if named and int(named.group(1)) != iteration:
        raise Problem(file, f"'iteration' is {iteration}, but the folder is {path.name}")
    if expect.total_iterations is not None and iteration > expect.total_iterations:
        raise Problem(
            file,
            f"'iteration' is {iteration}, beyond train.iterations = {expect.total_iterations} "
            "(raise train.iterations to go on past it)",
        )
    fingerprint = state.get("fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise Problem(file, f"'fingerprint' is {_kind(fingerprint)}, not a string")
    elapsed = state.get("elapsed_seconds", 0.0)
    if not _is_number(elapsed) or not math.isfinite(elapsed) or elapsed < 0:
        raise Problem(file, f"'elapsed_seconds' is {elapsed!r}, not a number of seconds >= 0")
    pending = state.get("eval_pending")
    if pending is not None and not (isinstance(pending, dict) and _is_number(pending.get("wall_seconds"))):
        raise Problem(file, "'eval_pending' is not an object with a number 'wall_seconds'")
    if expect.resume:
        if not isinstance(fingerprint, str):
            raise Problem(file, "has no 'fingerprint' (which model and LoRA setup wrote it)")
        sampler = state.get("prompt_sampler")
        if not isinstance(sampler, dict) or not all(
            _is_int(sampler.get(k)) and sampler[k] >= 0 for k in ("epoch", "position")
        ):
            raise Problem(file, f"'prompt_sampler' is {_short(sampler)}, not {{'epoch': N, 'position': N}}")


def _check_weights(weights: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    found = _shapes(weights)
    if found == expected:
        return
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    shaped = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
    first = (missing or extra or shaped)[0]
    raise Problem(
        "trainable.safetensors",
        f"does not fit the model ({len(missing)} weights missing, {len(extra)} unknown, {len(shaped)} of "
        f"another shape; first: {first})",
    )


def _check_rng(rng: dict[str, torch.Tensor]) -> None:
    file = "rng.safetensors"
    if set(rng) != RNG_KEYS:
        raise Problem(file, f"holds {sorted(rng)}, not the generators {sorted(RNG_KEYS)}")
    for key, value in rng.items():
        try:
            torch.Generator().set_state(value)  # a throwaway generator: the check that loading makes
        except (RuntimeError, TypeError) as exc:
            why = " ".join(str(exc).split())[:80]
            raise Problem(file, f"'{key}' is not a generator state ({why})") from exc


def _check_optimizer(optimizer: Any, param_shapes: list[tuple[int, ...]] | None) -> None:
    file = "optimizer.pt"
    if not isinstance(optimizer, dict) or not {"optimizer", "lr_schedule"} <= set(optimizer):
        raise Problem(file, f"holds {_short(optimizer)}, not {{'optimizer': ..., 'lr_schedule': ...}}")
    if not isinstance(optimizer["lr_schedule"], dict):
        raise Problem(file, f"'lr_schedule' is {_kind(optimizer['lr_schedule'])}, not a state dict")
    inner = optimizer["optimizer"]
    if not (isinstance(inner, dict) and isinstance(inner.get("state"), dict)):
        raise Problem(file, "'optimizer' is not a state dict with 'state' and 'param_groups'")
    groups = inner.get("param_groups")
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(_is_int(i) for i in g["params"])
        for g in groups
    ):
        raise Problem(file, "'param_groups' is not a list of groups with parameter indices")
    if param_shapes is None:
        return
    indices = sorted(i for g in groups for i in g["params"])
    if indices != list(range(len(param_shapes))):
        raise Problem(file, f"numbers {len(indices)} parameters; the model trains {len(param_shapes)}")
    for index, entry in inner["state"].items():
        if not _is_int(index) or not 0 <= index < len(param_shapes) or not isinstance(entry, dict):
            raise Problem(file, f"has a state entry for parameter {index!r}, which the model lacks")
        for key, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0 and tuple(value.shape) != param_shapes[index]:
                raise Problem(
                    file,
                    f"'{key}' of parameter {index} is shaped {tuple(value.shape)}, the parameter "
                    f"{param_shapes[index]}",
                )


def _shapes(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {list: "a list", dict: "an object", str: "a string", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
