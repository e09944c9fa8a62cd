"""Deprecated path of the plugin host, kept for one release for plugins that look up other components.

New code imports ``default_registry`` from ``vgrpo_platform.host.collect`` and ``ComponentRegistry``
from ``vgrpo_platform.host.components``.
"""

from __future__ import annotations

import warnings

from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.host.components import ComponentRegistry

warnings.warn(
    "vgrpo_platform.plugins is deprecated: import default_registry from vgrpo_platform.host.collect and "
    "ComponentRegistry from vgrpo_platform.host.components",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ComponentRegistry", "default_registry"]
