"""How the denoiser's compute runs: regional compilation and the attention kernel (``train.compile``,
``train.attention_backend``).

Both are settings of the module itself, not wrappers around its call, so they are applied once, where
the core has just built the denoiser (``training.session.build_session``, and the rollout worker that
builds its own copy), after LoRA layers are in place (the compiled code must include them) and before
accelerate makes the module data-parallel, so DDP's wrapper and FSDP2's per-block units are put around
blocks that are already compiled. Every call of the denoiser, rollout and training alike, then runs
the compiled blocks and the chosen kernel.

Only diffusers models offer either switch: a denoiser that does not is stopped with a one-line
``RecipeError`` rather than silently run uncompiled, so a recipe never claims a speed-up it did not get.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from vgrpo_platform.errors import RecipeError

COMPILE_MODES = ("off", "blocks")
"""``train.compile``: ``"off"``, or ``"blocks"`` (``torch.compile`` on each repeated transformer block)."""


def attention_backends() -> list[str]:
    """The attention backend names the installed diffusers knows (its ``AttentionBackendName``)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [member.value for member in AttentionBackendName]


def check_attention_backend(name: str) -> str:
    """``name`` if the installed diffusers has such a backend; else a ``ValueError`` naming the choices
    (the recipe loader turns it into its one-line message)."""
    choices = attention_backends()
    if name.lower() not in choices:
        raise ValueError(
            f"not an attention backend of the installed diffusers; choose one of: {', '.join(choices)}"
        )
    return name.lower()


def compiled_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The sub-modules of ``module`` whose calls run compiled (``nn.Module.compile`` sets their
    ``_compiled_call_impl``)."""
    return [m for m in module.modules() if getattr(m, "_compiled_call_impl", None) is not None]


def compile_blocks(module: torch.nn.Module, owner: str) -> int:
    """Compile each repeated block of a diffusers model in place (diffusers' regional compilation:
    one block's graph is compiled once and reused by its siblings, so compiling takes seconds where
    the whole model takes minutes). Returns the number of blocks compiled."""
    blocks = getattr(module, "_repeated_blocks", None)
    if not blocks or not hasattr(module, "compile_repeated_blocks"):
        raise RecipeError(
            "train.compile = 'blocks' needs a diffusers model that lists its repeated blocks "
            f"(_repeated_blocks); {owner}'s denoiser {type(module).__name__} has none: "
            "set train.compile = 'off'"
        )
    model: Any = module  # a diffusers ModelMixin (checked above)
    model.compile_repeated_blocks()
    return len(compiled_blocks(module))


def set_attention_backend(module: torch.nn.Module, name: str, owner: str) -> int:
    """Route the model's attention through diffusers' backend ``name``; returns how many attention
    layers took it. A model none of whose layers go through diffusers' dispatcher (older attention
    processors) would ignore the setting: that is an error, as is a backend whose package is missing."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    model: Any = module  # a diffusers ModelMixin, duck-typed: torch's stubs type unknown attributes as Tensor
    if not hasattr(model, "set_attention_backend"):
        raise RecipeError(
            f"train.attention_backend needs a diffusers model; {owner}'s denoiser {type(module).__name__} "
            "is not one: remove the key"
        )
    try:
        model.set_attention_backend(check_attention_backend(name))
    except (RuntimeError, ValueError, ImportError) as exc:  # a backend whose package is not installed
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RecipeError(f"train.attention_backend = {name!r}: {first}") from exc
    wanted = AttentionBackendName(name.lower())
    took = sum(
        1
        for m in module.modules()
        if getattr(getattr(m, "processor", None), "_attention_backend", None) == wanted
    )
    if took == 0:
        raise RecipeError(
            f"train.attention_backend = {name!r}: {owner}'s denoiser {type(module).__name__} has no "
            "attention layer that goes through diffusers' attention dispatcher; remove the key"
        )
    return took


class SpeedSwitches(Protocol):
    """The recipe keys read here (``config.schema.TrainSection`` has them)."""

    @property
    def compile(self) -> str: ...

    @property
    def attention_backend(self) -> str | None: ...


def apply_to_denoiser(module: torch.nn.Module, train: SpeedSwitches, owner: str) -> list[str]:
    """Apply the recipe's ``train.attention_backend`` and ``train.compile`` to ``module`` (``owner``: the
    adapter's name, for messages). The kernel goes first: compiled code traces whichever kernel is set.
    Returns what was done, one line each, for the run's start-up log; nothing for the defaults."""
    if train.compile not in COMPILE_MODES:
        raise RecipeError(f"train.compile: expected one of {COMPILE_MODES}, got {train.compile!r}")
    done = []
    if train.attention_backend is not None:
        layers = set_attention_backend(module, train.attention_backend, owner)
        done.append(f"attention backend: {train.attention_backend} ({layers} attention layers)")
    if train.compile == "blocks":
        blocks = compile_blocks(module, owner)
        done.append(f"compiled: {blocks} repeated blocks (torch.compile; the first calls compile them)")
    return done
