"""Old path of the plugin host (now ``vgrpo_platform.host.plugins``), kept for plugins that look up
other components: a reward may build another installed reward by name (``rewards/video`` does).

A shim, not the home: new code imports ``vgrpo_platform.host.plugins``.
"""

from vgrpo_platform.host.plugins import ComponentRegistry, default_registry

__all__ = ["ComponentRegistry", "default_registry"]
