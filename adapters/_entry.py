"""Deprecated: the adapters' former registration helper, kept for one release for plugins that copied it.

Entry modules now return ``vgrpo_platform.registry.Component`` records from ``register_components``;
a lazy ``"package.module:attr"`` factory string does what ``deferred_factory`` did (docs/plugins.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Factory, lazy_factory

AdapterRow = tuple[str, str, type, str]
"""``(name, "package.module:attribute.path", config class, summary)`` of one adapter."""


def _deprecated(what: str, entry_module: str) -> None:
    warnings.warn(
        f"{entry_module} uses the deprecated vgrpo_adapters._entry.{what}; return "
        "vgrpo_platform.registry.Component records (with a 'module:attr' factory string) from the "
        "register_components() hook instead (docs/plugins.md)",
        DeprecationWarning,
        stacklevel=3,
    )


def deferred_factory(entry_module: str, name: str, target: str) -> Factory:
    """Deprecated: ``vgrpo_platform.registry.lazy_factory``, which the host applies to factory strings."""
    _deprecated("deferred_factory", entry_module)
    return lazy_factory(target, entry_module, name)


def adapter_hook(entry_module: str, *rows: AdapterRow) -> Callable[[Any], None]:
    """Deprecated: the entry module's ``register_adapters`` hook, registering each row lazily."""
    _deprecated("adapter_hook", entry_module)

    @hookimpl
    def register_adapters(register: Any) -> None:
        for name, target, config, summary in rows:
            register(name, lazy_factory(target, entry_module, name), config, summary=summary)

    register_adapters.__module__ = entry_module
    return register_adapters
