"""Deprecated path of the built-in rollout backends' entry module (now ``rollout_backends.entry``), kept
for one release for code that imports its configs or factories.
"""

from __future__ import annotations

import warnings

from vgrpo_platform.rollout_backends.entry import (  # noqa: F401 - the old module's names
    CachedConfig,
    InProcessConfig,
    WorkerConfig,
    build_cached,
    build_in_process,
    build_worker,
    register_components,
)

warnings.warn(
    "vgrpo_platform.rollout_backends.plugin is deprecated: import from vgrpo_platform.rollout_backends.entry",
    DeprecationWarning,
    stacklevel=2,
)
