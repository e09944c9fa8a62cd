"""Entry module of the built-in rollout backends: registration, options and factories, no torch at import.

``in_process`` (the default, exact), ``cached`` (a diffusers step cache over the rollout's forwards) and
``worker`` (a process with its own copy of the denoiser, able to generate the next rollout during an
update with ``rollout.overlap = true``). A third-party backend registers the same way through the
``vgrpo`` entry-point group (``register_components``, docs/plugins.md); ``contract.py`` is what it implements.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class InProcessConfig(PluginConfig):
    """The trainer's own sampler on its own weights: no options."""

    exact: ClassVar[bool] = True  # the backend's promise, readable without building it (``vgrpo check``)
    overlaps: ClassVar[bool] = False


class CachedConfig(PluginConfig):
    """A diffusers step cache over each rollout chunk (``cache``), configured by ``options``: the fields
    of diffusers' ``TaylorSeerCacheConfig`` / ``FirstBlockCacheConfig`` / ``MagCacheConfig``, over
    vgrpo's defaults (TaylorSeer: ``cache_interval = 2``, ``disable_cache_before_step = 3``); a dtype
    field takes a name such as ``"float32"``."""

    exact: ClassVar[bool] = False
    overlaps: ClassVar[bool] = False
    cache: Literal["taylorseer", "first_block", "mag"] = "taylorseer"
    options: dict[str, Any] = Field(default_factory=dict)


class WorkerConfig(PluginConfig):
    """A spawned process holding its own copy of the denoiser; it receives the trainable weights after each
    update. ``device``: where it runs (e.g. ``"cuda:1"``; None = the run's device); ``threads``: its torch
    threads (None = torch's default)."""

    exact: ClassVar[bool] = False
    overlaps: ClassVar[bool] = True
    device: str | None = None
    threads: int | None = Field(None, ge=1)
    start_timeout: float = Field(600.0, gt=0)  # seconds to build the model in the worker


def build_in_process(config: InProcessConfig, context: Any = None) -> Any:
    from vgrpo_platform.rollout_backends.in_process import InProcessBackend

    return InProcessBackend()


def build_cached(config: CachedConfig, context: Any = None) -> Any:
    from vgrpo_platform.rollout_backends.cached import CachedBackend

    return CachedBackend(config.cache, config.options)


def build_worker(config: WorkerConfig, context: Any = None) -> Any:
    from vgrpo_platform.rollout_backends.worker import WorkerBackend

    return WorkerBackend(config, context)


@hookimpl
def register_components() -> list[Component]:
    """The built-in rollout backends, in registration order."""
    return [
        Component(
            "rollout_backend",
            "in_process",
            build_in_process,
            InProcessConfig,
            "The trainer's own sampler and weights (exact; default).",
        ),
        Component(
            "rollout_backend",
            "cached",
            build_cached,
            CachedConfig,
            "Rollouts under a diffusers step cache (TaylorSeer, FirstBlock, Mag).",
        ),
        Component(
            "rollout_backend",
            "worker",
            build_worker,
            WorkerConfig,
            "A worker process with its own denoiser copy; overlaps the update.",
        ),
    ]
