"""The hooks a vgrpo plugin may implement.

One door for every component kind: ``register_components()`` returns ``Component`` records, and the
host decides how they are stored (it records the providing distribution, refuses duplicate names and
keeps each config model so ``vgrpo plugins`` can print its options). The idiom is described once, in
docs/plugins.md. Entry modules must stay cheap to import: name the implementation with a lazy
``"package.module:attr"`` factory or import it inside the factory.

The four ``register_<kind>s(register)`` hooks are the previous form, deprecated: still called (with a
``DeprecationWarning`` naming the plugin) for one release, then removed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from vgrpo_platform.registry import Component

PROJECT_NAME = "vgrpo"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_components() -> list[Component]:
    """Return the plugin's components as ``vgrpo_platform.registry.Component`` records.

    ``Component(kind, name, factory, config, summary="")``: ``kind`` is one of
    ``vgrpo_platform.registry.KINDS`` (adapter, reward, surrogate, rollout_backend); ``factory`` is
    ``factory(config, context)`` or a lazy ``"package.module:attr.path"`` string; ``config`` is a
    ``PluginConfig`` subclass validating the component's options table. What each kind's factory
    returns is in docs/hooks.md.
    """
    raise NotImplementedError  # a specification: pluggy calls the plugins' implementations


@hookspec
def register_commands(app: Any) -> None:  # app: the root typer.Typer (typer is imported lazily)
    """Add sub-commands to the ``vgrpo`` command line; ``app`` is the root ``typer.Typer``."""


# ----------------------------------------------------------------------------- deprecated forms


def _deprecated_spec(name: str, kind: str) -> Callable[..., None]:
    """The previous release's per-kind hook ``name(register)``: one spec per kind, same contract."""

    def spec(register: Any) -> None:  # the host's register(name, factory, config, summary="")
        pass

    spec.__name__ = spec.__qualname__ = name
    spec.__doc__ = (
        f'Deprecated: return ``Component("{kind}", ...)`` records from ``register_components`` instead; '
        "the host still calls it for one release, warning with the plugin's name."
    )
    return hookspec(spec)


register_adapters = _deprecated_spec("register_adapters", "adapter")
register_rewards = _deprecated_spec("register_rewards", "reward")
register_surrogates = _deprecated_spec("register_surrogates", "surrogate")
register_rollout_backends = _deprecated_spec("register_rollout_backends", "rollout_backend")
