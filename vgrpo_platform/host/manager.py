"""Loading plugins: a pluggy manager filled from the ``vgrpo`` entry points, remembering who provides what.

The manager is built in a function, never at import time, so tests can build one from chosen
plugins without entry points. Failures name the distribution and the fix in one line.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence

import pluggy

from vgrpo_platform import hookspecs
from vgrpo_platform.errors import PluginError

ENTRY_POINT_GROUP = "vgrpo"


class VgrpoPluginManager(pluggy.PluginManager):
    """A pluggy manager that also remembers which distribution provides each plugin."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.distributions: dict[str, str] = {}  # plugin name -> distribution name

    def distribution_of(self, plugin_name: str) -> str:
        return self.distributions.get(plugin_name, plugin_name)


def _plugin_label(plugin: object) -> str:
    """Where a plugin passed in code comes from: ``vgrpo_distribution`` attribute, else its module."""
    dist = getattr(plugin, "vgrpo_distribution", None)
    if isinstance(dist, str):
        return dist
    return getattr(plugin, "__name__", None) or type(plugin).__module__


def _register(pm: VgrpoPluginManager, plugin: object, name: str | None, dist: str) -> None:
    try:
        registered = pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(
            f"plugin '{name or dist}' from distribution '{dist}' is invalid: {exc}; fix or uninstall {dist}"
        ) from exc
    except ValueError as exc:  # name or object already registered
        raise PluginError(
            f"plugin '{name or dist}' from distribution '{dist}' is registered twice ({exc}); "
            f"uninstall the duplicate"
        ) from exc
    if registered is None:  # pluggy skips a name that was blocked
        raise PluginError(f"plugin '{name or dist}' from distribution '{dist}' is blocked; unblock it")
    pm.distributions[registered] = dist


def _load_entry_points(pm: VgrpoPluginManager) -> None:
    """Our own loop (not pluggy's ``load_setuptools_entrypoints``): it errors on duplicate names
    instead of silently skipping them, and names the distribution when an import fails."""
    seen: dict[str, tuple[str, str]] = {}  # entry-point name -> (distribution, value)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "unknown distribution"
        if ep.name in seen:
            if seen[ep.name] == (dist, ep.value):  # the same install seen twice on sys.path
                continue
            raise PluginError(
                f"entry point '{ep.name}' in group '{ENTRY_POINT_GROUP}' is declared by both "
                f"'{seen[ep.name][0]}' and '{dist}'; uninstall one of them"
            )
        seen[ep.name] = (dist, ep.value)
        if pm.get_plugin(ep.name) is not None:
            raise PluginError(
                f"entry point '{ep.name}' from distribution '{dist}' clashes with an already registered "
                f"plugin of that name ({pm.distribution_of(ep.name)}); rename or uninstall one"
            )
        try:
            plugin = ep.load()
        except Exception as exc:  # any import-time failure of third-party code
            raise PluginError(
                f"plugin '{ep.name}' from distribution '{dist}' failed to import: "
                f"{type(exc).__name__}: {exc}; fix or uninstall {dist}"
            ) from exc
        _register(pm, plugin, ep.name, dist)


def build_plugin_manager(
    *, load_entry_points: bool = True, extra_plugins: Sequence[object] = ()
) -> pluggy.PluginManager:
    """A fresh plugin manager with ``extra_plugins`` (tests, embedding) and the installed plugins.

    A plugin passed in code may set ``vgrpo_distribution = "name"`` to be reported as coming from
    that distribution; otherwise its module name is used.
    """
    pm = VgrpoPluginManager()
    pm.add_hookspecs(hookspecs)
    for plugin in extra_plugins:
        _register(pm, plugin, None, _plugin_label(plugin))
    if load_entry_points:
        _load_entry_points(pm)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or "?"
        dist = pm.distribution_of(name) if isinstance(pm, VgrpoPluginManager) else name
        raise PluginError(
            f"plugin '{name}' from distribution '{dist}' is invalid: {exc}; fix or uninstall {dist}"
        ) from exc
    return pm


def distribution(pm: pluggy.PluginManager, plugin_name: str) -> str:
    """The distribution that provides ``plugin_name`` (its own name for a plain pluggy manager)."""
    if isinstance(pm, VgrpoPluginManager):
        return pm.distribution_of(plugin_name)
    return plugin_name
