"""Deprecated path of ``vgrpo_platform.noise_schedules`` (renamed: "schedules" also read as the learning-rate
schedule). Importable for third-party adapters for one release; import ``noise_schedules`` instead."""

import warnings

from vgrpo_platform.noise_schedules import RectifiedFlowSchedule, expand_like

warnings.warn(
    "vgrpo_platform.schedules is deprecated; import vgrpo_platform.noise_schedules",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["RectifiedFlowSchedule", "expand_like"]
