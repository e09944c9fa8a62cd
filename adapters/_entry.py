"""Registration of the built-in adapters without importing torch.

Each entry module names its implementation as a string; the factory made here imports it only when a
run builds the adapter, so ``vgrpo check``, ``--help`` and the registry can load every entry module
cheaply. Written once here instead of a ``build_*`` function and hook per entry module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from vgrpo_platform.hookspecs import hookimpl

AdapterRow = tuple[str, str, type, str]
"""``(name, "package.module:attribute.path", config class, summary)`` of one adapter."""


def deferred_factory(entry_module: str, name: str, target: str) -> Callable[[Any, Any], Any]:
    """A factory calling ``target`` (``"package.module:Class.from_config"``), imported on the first build.

    It reports ``entry_module`` as its module: the conformance kit then checks that the entry module, not
    this helper, imports no torch.
    """
    module_name, _, attribute = target.partition(":")

    def build(config: Any, context: Any) -> Any:
        return attrgetter(attribute)(importlib.import_module(module_name))(config, context)

    build.__module__ = entry_module
    build.__name__ = build.__qualname__ = f"build_{name}"
    build.__doc__ = (
        f"Factory of ``{name}``: imports {module_name} (torch, diffusers) only when a run builds it."
    )
    return build


def adapter_hook(entry_module: str, *rows: AdapterRow) -> Callable[[Any], None]:
    """The entry module's ``register_adapters`` hook, registering each row with a deferred factory."""

    @hookimpl
    def register_adapters(register: Any) -> None:
        for name, target, config, summary in rows:
            register(name, deferred_factory(entry_module, name, target), config, summary=summary)

    register_adapters.__module__ = entry_module
    return register_adapters
