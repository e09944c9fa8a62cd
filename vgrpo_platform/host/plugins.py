"""Deprecated path of the plugin host, kept for one release for code that imports it.

The host is now three modules: ``host.manager`` (loading plugins), ``host.collect`` (calling their
hooks) and ``host.components`` (the ``ComponentRegistry``).
"""

from __future__ import annotations

import warnings

from vgrpo_platform.host.collect import LEGACY_HOOKS as HOOKS
from vgrpo_platform.host.collect import collect_components, default_registry
from vgrpo_platform.host.components import PLURAL, ComponentRegistry
from vgrpo_platform.host.manager import ENTRY_POINT_GROUP, VgrpoPluginManager, build_plugin_manager

warnings.warn(
    "vgrpo_platform.host.plugins is deprecated: import build_plugin_manager from "
    "vgrpo_platform.host.manager, collect_components and default_registry from vgrpo_platform.host.collect, "
    "ComponentRegistry from vgrpo_platform.host.components",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "HOOKS",
    "PLURAL",
    "ComponentRegistry",
    "VgrpoPluginManager",
    "build_plugin_manager",
    "collect_components",
    "default_registry",
]
