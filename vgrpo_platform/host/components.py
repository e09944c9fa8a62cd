"""The component registry: every registered component by kind and name, looked up and built by name.

Only storage and lookup policy live here (duplicate names, close-match suggestions, option
validation with TOML paths); loading plugins is ``host.manager``'s job and calling their hooks is
``host.collect``'s.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from vgrpo_platform.errors import PluginError, RecipeError
from vgrpo_platform.host.validation_errors import format_validation_error
from vgrpo_platform.registry import KINDS, ComponentSpec, PluginConfig

PLURAL = {
    "adapter": "adapters",
    "reward": "rewards",
    "surrogate": "surrogates",
    "rollout_backend": "rollout backends",
}


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
