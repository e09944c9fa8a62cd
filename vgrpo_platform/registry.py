"""Component records and the base class every plugin config derives from.

A plugin declares what it offers as ``Component`` records returned from its ``register_components``
hook (docs/plugins.md); the host validates them and stores each as a ``ComponentSpec`` stamped with
the distribution that provided it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from pydantic import BaseModel, ConfigDict

KINDS = ("adapter", "reward", "surrogate", "rollout_backend")

Factory = Callable[[Any, Any], Any]
"""``factory(config, context) -> component``."""

LAZY_TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
"""A lazy factory's ``"package.module:attr.path"``: a dotted module, a colon, a dotted attribute."""


class PluginConfig(BaseModel):
    """Base of every component's options model: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Component:
    """What a plugin offers: one record per component, returned from ``register_components``.

    Plain data, so the host (not the plugin) decides how it is validated and stored. ``factory`` is a
    callable ``factory(config, context)`` or a ``"package.module:attr.path"`` string imported on the
    first build: the string keeps torch out of the entry module without writing a ``build_*`` function.
    """

    kind: str  # one of KINDS
    name: str  # the name recipes use; unique within its kind
    factory: Factory | str
    config: type[PluginConfig]  # validates the component's options table
    summary: str = ""  # one line for `vgrpo plugins`


@dataclass(frozen=True)
class ComponentSpec:
    """One registered component: what it is, who provides it, how to build it."""

    kind: str  # one of KINDS
    name: str
    factory: Callable[..., Any]  # factory(config, context) -> component
    config: type[PluginConfig]
    summary: str
    distribution: str  # the installed distribution that provides it ("vgrpo" for built-ins)


def lazy_factory(target: str, entry_module: str, name: str) -> Factory:
    """A factory calling ``target`` (``"package.module:Class.from_config"``), imported on the first build.

    It reports ``entry_module`` as its module, so the conformance kit checks that the entry module
    (not this helper) imports no torch.
    """
    module_name, _, attribute = target.partition(":")

    def build(config: Any, context: Any) -> Any:
        return attrgetter(attribute)(importlib.import_module(module_name))(config, context)

    build.__module__ = entry_module
    build.__name__ = build.__qualname__ = f"build_{name}"
    build.__doc__ = f"Factory of ``{name}``: imports {module_name} only when a run builds it."
    build.target = target  # type: ignore[attr-defined]  # what `vgrpo plan` reads class attributes from
    return build
