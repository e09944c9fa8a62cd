"""Deprecated path of the built-in surrogates' entry module (now ``algo.surrogates.entry``), kept for one
release for code that imports its configs or factories; the configs' home is ``algo.surrogates.configs``.
"""

from __future__ import annotations

import warnings

from vgrpo_platform.algo.surrogates.entry import *  # noqa: F403 - the old module's names
from vgrpo_platform.algo.surrogates.entry import (  # noqa: F401 - not in entry's __all__
    build_awm,
    build_flow_grpo,
    build_nft,
    build_vgrpo,
    register_components,
)

warnings.warn(
    "vgrpo_platform.algo.surrogates.plugin is deprecated: import the configs from "
    "vgrpo_platform.algo.surrogates.configs (the entry module is vgrpo_platform.algo.surrogates.entry)",
    DeprecationWarning,
    stacklevel=2,
)
