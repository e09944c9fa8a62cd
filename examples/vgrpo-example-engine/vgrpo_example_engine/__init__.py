"""Entry module of the ``http_engine`` rollout backend: its options and registration, no torch at import.

The backend sends each rollout request to a generation engine over HTTP and receives the final latents;
after each update it sends the trainable weights. ``fake_engine.py`` is such an engine, for tests and
for trying the contract out: it loads the same model through vgrpo and samples with it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class EngineConfig(PluginConfig):
    """``[rollout.backend_options]`` for ``backend = "http_engine"``."""

    exact: ClassVar[bool] = False  # another engine's numerics: never offered to the MDP surrogates
    overlaps: ClassVar[bool] = True  # requests run in a background thread: rollout.overlap may use it
    url: str = Field("http://127.0.0.1:8100", description="The engine's base URL.")
    timeout: float = Field(600.0, gt=0, description="Seconds to wait for one request.")
    send_noise: bool = Field(
        True, description="Send the trainer's initial noise; false: send seeds only, the engine draws it."
    )


def build_http_engine(config: EngineConfig, context: Any = None) -> Any:
    """Factory: imports the torch side only when a run builds the backend."""
    from vgrpo_example_engine.backend import HttpEngineBackend

    return HttpEngineBackend(config.url, timeout=config.timeout, send_noise=config.send_noise)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "rollout_backend",
            "http_engine",
            build_http_engine,
            EngineConfig,
            summary="Rollouts from a generation engine behind HTTP (weights pushed after each update).",
        ),
    ]
