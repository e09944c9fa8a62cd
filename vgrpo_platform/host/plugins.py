"""The plugin host: load plugins, collect their components, look components up and build them.

Policy lives here, not in plugins: hooks receive a ``register`` callable and the host records who
registered what, refuses duplicate names (naming both distributions) and keeps each component's
config model. The plugin manager is built in a function, never at import time, so tests can build
one from chosen plugins without entry points.
"""

from __future__ import annotations

import difflib
import importlib.metadata
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pluggy
from pydantic import ValidationError

from vgrpo_platform import hookspecs
from vgrpo_platform.errors import PluginError, RecipeError, VgrpoError
from vgrpo_platform.host.validation_errors import format_validation_error
from vgrpo_platform.registry import KINDS, ComponentSpec, PluginConfig

ENTRY_POINT_GROUP = "vgrpo"
HOOKS = {
    "adapter": "register_adapters",
    "reward": "register_rewards",
    "surrogate": "register_surrogates",
    "rollout_backend": "register_rollout_backends",
}
PLURAL = {
    "adapter": "adapters",
    "reward": "rewards",
    "surrogate": "surrogates",
    "rollout_backend": "rollout backends",
}


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


def _distribution(pm: pluggy.PluginManager, plugin_name: str) -> str:
    if isinstance(pm, VgrpoPluginManager):
        return pm.distribution_of(plugin_name)
    return plugin_name


class ComponentRegistry:
    """Every registered component, by kind and name."""

    def __init__(self) -> None:
        self._specs: dict[str, dict[str, ComponentSpec]] = {kind: {} for kind in KINDS}

    def add(self, spec: ComponentSpec) -> None:
        """Store ``spec``; a name already taken within its kind is an error naming both providers."""
        table = self._specs[spec.kind]
        if spec.name in table:
            other = table[spec.name].distribution
            raise PluginError(
                f"{spec.kind} '{spec.name}' is registered twice: by distribution '{other}' and by "
                f"distribution '{spec.distribution}'; uninstall one of them"
            )
        table[spec.name] = spec

    def names(self, kind: str) -> list[str]:
        return sorted(self._table(kind))

    def specs(self, kind: str | None = None) -> list[ComponentSpec]:
        """Specs of one kind, or all in ``KINDS`` order; sorted by name."""
        kinds = [kind] if kind is not None else list(KINDS)
        return [self._table(k)[n] for k in kinds for n in sorted(self._table(k))]

    def __iter__(self) -> Iterator[ComponentSpec]:
        return iter(self.specs())

    def __contains__(self, key: tuple[str, str]) -> bool:
        kind, name = key
        return name in self._table(kind)

    def _table(self, kind: str) -> dict[str, ComponentSpec]:
        if kind not in self._specs:
            raise ValueError(f"unknown component kind {kind!r}; expected one of {KINDS}")
        return self._specs[kind]

    def get(self, kind: str, name: str) -> ComponentSpec:
        """The component ``name`` of ``kind``; unknown names get a close-match suggestion."""
        table = self._table(kind)
        if name in table:
            return table[name]
        names = sorted(table)
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else "."
        installed = ", ".join(names) if names else f"no {PLURAL[kind]}"
        raise PluginError(
            f"unknown {kind} '{name}'{hint} Installed: {installed}. Run `vgrpo plugins` to list them."
        )

    def validate_options(
        self,
        kind: str,
        name: str,
        options: dict[str, Any],
        *,
        where: str | None = None,
        source: str | None = None,
    ) -> PluginConfig:
        """``options`` validated by the component's own ``Config``; errors name the TOML path
        (``where``, default ``<kind>.options``) and, if given, the recipe file ``source``."""
        spec = self.get(kind, name)
        try:
            return spec.config.model_validate(options)
        except ValidationError as exc:
            prefix = where if where is not None else f"{kind}.options"
            msg = format_validation_error(exc, model=spec.config, prefix=prefix, source=source)
            raise RecipeError(msg) from None

    def build(
        self,
        kind: str,
        name: str,
        options: dict[str, Any],
        context: Any,
        *,
        where: str | None = None,
        source: str | None = None,
    ) -> Any:
        """Validate ``options`` then call the factory: ``factory(config, context)``."""
        config = self.validate_options(kind, name, options, where=where, source=source)
        return self.get(kind, name).factory(config, context)


def _make_register(registry: ComponentRegistry, kind: str, plugin: str, dist: str) -> Callable[..., None]:
    """The ``register`` callable one plugin's hook receives: it stamps the provider on each spec."""

    def register(
        name: str, factory: Callable[..., Any], config: type[PluginConfig], summary: str = ""
    ) -> None:
        where = f"plugin '{plugin}' from distribution '{dist}'"
        if not isinstance(name, str) or not name or name != name.strip():
            raise PluginError(f"{where} registered a {kind} named {name!r}; use a non-empty string")
        if not callable(factory):
            raise PluginError(f"{where} registered {kind} '{name}' with a factory that is not callable")
        if not (isinstance(config, type) and issubclass(config, PluginConfig)):
            raise PluginError(
                f"{where} registered {kind} '{name}' with config {config!r}, which is not a subclass of "
                "vgrpo_platform.registry.PluginConfig; derive the Config from PluginConfig"
            )
        registry.add(ComponentSpec(kind, name, factory, config, str(summary or ""), dist))

    return register


def collect_components(pm: pluggy.PluginManager) -> ComponentRegistry:
    """Call each plugin's registration hooks one by one, so every spec knows its distribution."""
    registry = ComponentRegistry()
    for kind, hook_name in HOOKS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.hookwrapper or impl.wrapper:
                continue  # a wrapper registers nothing itself
            dist = _distribution(pm, impl.plugin_name)
            register = _make_register(registry, kind, impl.plugin_name, dist)
            kwargs = {"register": register} if "register" in impl.argnames else {}
            try:
                impl.function(**kwargs)
            except VgrpoError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin '{impl.plugin_name}' from distribution '{dist}' failed in {hook_name}: "
                    f"{type(exc).__name__}: {exc}; fix or uninstall {dist}"
                ) from exc
    return registry


def default_registry() -> ComponentRegistry:
    """The components of every installed plugin (entry points in group ``vgrpo``)."""
    return collect_components(build_plugin_manager())
