"""Deprecated path of the learning-rate factor (now ``vgrpo_platform.training.iteration.optimizer``): the old
name sat beside the noise schedules and read like one of them. Importable for one release."""

import warnings

from vgrpo_platform.training.iteration.optimizer import lr_factor

warnings.warn(
    "vgrpo_platform.lr_schedule is deprecated; import lr_factor from "
    "vgrpo_platform.training.iteration.optimizer",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["lr_factor"]
