"""Component records and the base class every plugin config derives from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

KINDS = ("adapter", "reward", "surrogate", "rollout_backend")


class PluginConfig(BaseModel):
    """Base of every component's options model: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class ComponentSpec:
    """One registered component: what it is, who provides it, how to build it."""

    kind: str  # one of KINDS
    name: str
    factory: Callable[..., Any]  # factory(config, context) -> component
    config: type[PluginConfig]
    summary: str
    distribution: str  # the installed distribution that provides it ("vgrpo" for built-ins)
