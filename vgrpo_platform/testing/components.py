"""``check_component``: the conformance kit for an installed plugin, by kind and name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgrpo_platform.testing.adapter_kit import check_adapter
from vgrpo_platform.testing.common import ConformanceReport
from vgrpo_platform.testing.reward_kit import check_reward


def check_component(
    kind: str,
    name: str,
    options: Mapping[str, Any] | None = None,
    context: Any = None,
    *,
    registry: Any = None,
    **kwargs: Any,
) -> ConformanceReport:
    """Run ``check_adapter`` / ``check_reward`` on an installed component, found by ``name``.

    ``options`` are its recipe options (validated by its ``Config``); ``registry`` defaults to every
    installed plugin. Extra keyword arguments go to the check function.
    """
    from vgrpo_platform.host.collect import default_registry

    registry = registry if registry is not None else default_registry()
    spec = registry.get(kind, name)
    config = registry.validate_options(kind, name, dict(options or {}))
    label = f"'{name}' ({spec.distribution})"
    if kind == "adapter":
        return check_adapter(spec.factory, config, context, label=label, **kwargs)
    if kind == "reward":
        return check_reward(spec.factory, config, context, label=label, **kwargs)
    raise ValueError(f"the conformance kit checks adapters and rewards, not {kind}s")
