"""Collecting components: call each plugin's ``register_components`` through pluggy and store the records.

Each plugin is called on its own (``pm.subset_hook_caller``) so the host knows which distribution
provided every record, while pluggy's tracing, monitoring and other plugins' wrappers still apply.
Policy lives here, not in plugins: records are validated (name, factory, config) and a failure is one
line naming the distribution and the fix. The deprecated ``register_<kind>s(register)`` hooks are
still called, with a ``DeprecationWarning`` naming the plugin.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pluggy

from vgrpo_platform.errors import PluginError, VgrpoError
from vgrpo_platform.host.components import PLURAL, ComponentRegistry
from vgrpo_platform.host.manager import build_plugin_manager, distribution
from vgrpo_platform.registry import (
    KINDS,
    LAZY_TARGET,
    Component,
    ComponentSpec,
    PluginConfig,
    lazy_factory,
)

HOOK = "register_components"
LEGACY_HOOKS = {
    "adapter": "register_adapters",
    "reward": "register_rewards",
    "surrogate": "register_surrogates",
    "rollout_backend": "register_rollout_backends",
}
"""The deprecated per-kind hooks (``register(name, factory, config, summary="")``), kept one release."""


class _Provider:
    """One plugin being collected: who it is, for records and error messages."""

    def __init__(self, pm: pluggy.PluginManager, impl: pluggy.HookImpl) -> None:
        self.plugin = impl.plugin_name
        self.dist = distribution(pm, impl.plugin_name)
        plugin = impl.plugin
        self.module = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
        self.where = f"plugin '{self.plugin}' from distribution '{self.dist}'"


def _one_by_one(pm: pluggy.PluginManager, hook_name: str) -> Iterator[tuple[_Provider, pluggy.HookCaller]]:
    """Each implementing plugin, in registration order, with a caller of ``hook_name`` for it alone.

    Wrappers are kept (they register nothing themselves but may observe or amend every call)."""
    impls = [i for i in getattr(pm.hook, hook_name).get_hookimpls() if not (i.hookwrapper or i.wrapper)]
    for impl in impls:
        others = [i.plugin for i in impls if i is not impl]
        yield _Provider(pm, impl), pm.subset_hook_caller(hook_name, remove_plugins=others)


def _call(provider: _Provider, hook_name: str, caller: pluggy.HookCaller, **kwargs: Any) -> list[Any]:
    """Call the hook through pluggy; a plugin's own exception becomes one line naming its distribution."""
    try:
        return list(caller(**kwargs))
    except VgrpoError:
        raise
    except Exception as exc:
        dist = provider.dist
        raise PluginError(
            f"plugin '{provider.plugin}' from distribution '{dist}' failed in {hook_name}: "
            f"{type(exc).__name__}: {exc}; fix or uninstall {dist}"
        ) from exc


def _spec(record: Component, provider: _Provider) -> ComponentSpec:
    """The validated ``ComponentSpec`` of ``record`` (a lazy factory bound to the entry module)."""
    where, kind, name = provider.where, record.kind, record.name
    factory, config = record.factory, record.config
    if kind not in KINDS:
        raise PluginError(
            f"{where} returned a component of unknown kind {kind!r}; use one of {', '.join(KINDS)}"
        )
    if not isinstance(name, str) or not name or name != name.strip():
        raise PluginError(f"{where} registered a {kind} named {name!r}; use a non-empty string")
    if isinstance(factory, str):
        if not LAZY_TARGET.match(factory):
            raise PluginError(
                f"{where} registered {kind} '{name}' with factory {factory!r}, which is not a "
                "'package.module:attribute' string; name the factory as module:attribute or pass a callable"
            )
        factory = lazy_factory(factory, provider.module, name)
    elif not callable(factory):
        raise PluginError(f"{where} registered {kind} '{name}' with a factory that is not callable")
    if not (isinstance(config, type) and issubclass(config, PluginConfig)):
        raise PluginError(
            f"{where} registered {kind} '{name}' with config {config!r}, which is not a subclass of "
            "vgrpo_platform.registry.PluginConfig; derive the Config from PluginConfig"
        )
    return ComponentSpec(kind, name, factory, config, str(record.summary or ""), provider.dist)


def _records(result: list[Any], provider: _Provider) -> Iterator[Component]:
    """The records of one plugin's ``register_components`` (pluggy drops a ``None`` result)."""
    for returned in result:
        if not isinstance(returned, (list, tuple)):
            raise PluginError(
                f"{provider.where} returned {type(returned).__name__} from {HOOK}; "
                "return a list of vgrpo_platform.registry.Component"
            )
        for record in returned:
            if not isinstance(record, Component):
                raise PluginError(
                    f"{provider.where} returned {record!r} from {HOOK}; "
                    "return a list of vgrpo_platform.registry.Component"
                )
            yield record


def _legacy_register(registry: ComponentRegistry, kind: str, provider: _Provider) -> Callable[..., None]:
    """The ``register`` callable a deprecated hook receives: it files a ``Component`` like the new door."""

    def register(name: str, factory: Any, config: type[PluginConfig], summary: str = "") -> None:
        registry.add(_spec(Component(kind, name, factory, config, summary), provider))

    return register


def _warn_legacy(provider: _Provider, kind: str, hook_name: str) -> None:
    warnings.warn(
        f"{provider.where} registers {PLURAL[kind]} through the deprecated hook {hook_name}(register); "
        f"return vgrpo_platform.registry.Component records from {HOOK}() instead (docs/plugins.md)",
        DeprecationWarning,
        stacklevel=3,
    )


def collect_components(pm: pluggy.PluginManager) -> ComponentRegistry:
    """Every plugin's components: ``register_components`` plugin by plugin, then the deprecated hooks."""
    registry = ComponentRegistry()
    for provider, caller in _one_by_one(pm, HOOK):
        for record in _records(_call(provider, HOOK, caller), provider):
            registry.add(_spec(record, provider))
    for kind, hook_name in LEGACY_HOOKS.items():
        for provider, caller in _one_by_one(pm, hook_name):
            _warn_legacy(provider, kind, hook_name)
            _call(provider, hook_name, caller, register=_legacy_register(registry, kind, provider))
    return registry


def default_registry() -> ComponentRegistry:
    """The components of every installed plugin (entry points in group ``vgrpo``)."""
    return collect_components(build_plugin_manager())
