"""``cached``: the trainer's sampler with one of diffusers' step caches over the rollout's forwards.

diffusers ships caches that skip or extrapolate most of a transformer's work on steps where its
features barely move (FirstBlockCache, TaylorSeer, MagCache). They are registered on the denoiser
through diffusers' own ``HookRegistry`` for one chunk's ODE solve and removed after it, so the cache's
state starts fresh for every chunk and no training forward, evaluation or old-policy value ever runs
through it. The calls happen inside a diffusers ``CacheContext`` named after the core's call branch
(``"cond"``, or ``"uncond"`` for an adapter that makes a second CFG call per step), as the pipelines
name theirs. The result is not the exact sampler's: ``exact = False``, and the trainer measures the
gap (``rollout.mismatch_every``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vgrpo_platform.errors import RecipeError
from vgrpo_platform.network import denoiser_call_of
from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.rollout_backends.in_process import InProcessBackend

CACHES = {
    # recipe name: (diffusers config class, its apply function, the hook names it registers), in
    # diffusers.hooks; the hook names are those CacheMixin.disable_cache removes
    "first_block": (
        "FirstBlockCacheConfig",
        "apply_first_block_cache",
        ("first_block_cache", "_FBC_LEADER_BLOCK_HOOK", "_FBC_BLOCK_HOOK"),
    ),
    "taylorseer": (
        "TaylorSeerCacheConfig",
        "apply_taylorseer_cache",
        ("taylorseer_cache", "_TAYLORSEER_CACHE_HOOK"),
    ),
    "mag": (
        "MagCacheConfig",
        "apply_mag_cache",
        ("mag_cache", "_MAG_CACHE_LEADER_BLOCK_HOOK", "_MAG_CACHE_BLOCK_HOOK"),
    ),
}
"""``rollout.backend_options.cache`` -> how diffusers applies and names it."""
DEFAULT_OPTIONS = {"taylorseer": {"cache_interval": 2, "disable_cache_before_step": 3}}
"""Options under the recipe's own: TaylorSeer recomputes every second step after the third, the
setting ``python -m benchmarks.rollout_backends --probe`` chose on the 8-step quickstart (0.80x the exact
rollout's time at 0.13 relative latent distance; diffusers' defaults, made for 28-50 steps, saved
little there at 0.24)."""


def cache_config(cache: str, options: dict[str, Any]) -> Any:
    """The diffusers config object; a one-line error for an unknown cache or option."""
    import diffusers.hooks

    if cache not in CACHES:
        raise RecipeError(
            f"rollout.backend_options.cache = {cache!r} is unknown; use one of {', '.join(CACHES)}"
        )
    cls = getattr(diffusers.hooks, CACHES[cache][0])
    options = {k: _dtype(v) if k.endswith("dtype") else v for k, v in options.items()}
    try:
        return cls(**options)
    except TypeError as exc:
        raise RecipeError(
            f"rollout.backend_options.options: {exc}; see diffusers' {cls.__name__} for its fields"
        ) from None


def _dtype(value: Any) -> Any:
    """A dtype named in a recipe (``"float32"``, ``"bfloat16"``) as torch's; anything else as given."""
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if not isinstance(found, torch.dtype):
            raise RecipeError(
                f"rollout.backend_options.options: {value!r} is not a torch dtype; use e.g. 'float32'"
            )
        return found
    return value


@contextmanager
def cache_installed(module: torch.nn.Module, cache: str, config: Any) -> Iterator[None]:
    """diffusers' cache ``config`` on ``module`` inside, removed (with its state) after.

    Applied through ``diffusers.hooks``' functions rather than ``CacheMixin.enable_cache``: some models
    (SD3's transformer in diffusers 0.42) lack the mixin, and the hooks work on them all the same.
    """
    import importlib

    import diffusers.hooks
    from diffusers.hooks import HookRegistry

    _, apply_name, (module_name, *hook_constants) = CACHES[cache]
    getattr(diffusers.hooks, apply_name)(module, config)
    registry = HookRegistry.check_if_exists_or_initialize(module)
    registry.invalidate_child_registries_cache()
    names = [getattr(importlib.import_module(f"diffusers.hooks.{module_name}"), c) for c in hook_constants]
    try:
        yield
    finally:
        for name in names:
            registry.remove_hook(name, recurse=True)
        registry.invalidate_child_registries_cache()


@contextmanager
def cache_context(module: torch.nn.Module, branch: str) -> Iterator[None]:
    """A ``DenoiserCall`` hook: the call runs in diffusers' cache context named ``branch`` (what
    ``CacheMixin.cache_context`` sets, for models with or without the mixin)."""
    from diffusers.hooks.hooks import CacheContext, _set_cache_context

    _set_cache_context(module, CacheContext(branch))
    try:
        yield
    finally:
        _set_cache_context(module, None)


class CachedBackend(InProcessBackend):
    exact = False
    name = "cached"

    def __init__(self, cache: str = "first_block", options: dict[str, Any] | None = None) -> None:
        self.cache = cache
        self.options = {**DEFAULT_OPTIONS.get(cache, {}), **(options or {})}
        self.config = cache_config(cache, self.options)

    def sample_chunk(self, noise: torch.Tensor, cond: dict, sampler: SamplerSpec) -> torch.Tensor:
        call = denoiser_call_of(self.adapter)
        config = cache_config(self.cache, self.options)
        with cache_installed(call.module, self.cache, config), call.hooked(cache_context):
            return self.adapter.sample(noise, cond, sampler)
