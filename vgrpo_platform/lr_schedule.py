"""Old path of the learning-rate schedule (now ``vgrpo_platform.training.iteration.optimizer``), kept for
plugins that pretrain with the same warm-up/cosine formula (``adapters/shapes/pretrain.py``).

A shim, not the home: the old name sat beside ``schedules`` (noise schedules) and read like one of
them; new code imports ``vgrpo_platform.training.iteration.optimizer``.
"""

from vgrpo_platform.training.iteration.optimizer import lr_factor

__all__ = ["lr_factor"]
