"""User-facing errors: the CLI prints ``error: <str(exc)>`` and exits with code 2, no traceback.

Why a separate hierarchy: a bad recipe key or a broken plugin install is the user's to fix, not a
bug in vgrpo, so the message must name the problem *and* the fix on one line. Anything that is not
a ``VgrpoError`` is a bug and keeps its traceback.
"""

from __future__ import annotations


class VgrpoError(Exception):
    """A problem the user can fix; ``str()`` is one line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        # One line, always: the CLI prints it after "error: " and tests compare whole lines.
        super().__init__(" ".join(str(message).split()))


class RecipeError(VgrpoError):
    """The recipe file, a ``--set`` override or a prompt file is invalid."""


class PluginError(VgrpoError):
    """A plugin is unknown, registered twice, failed to import, or registered something invalid."""


class CheckpointError(VgrpoError):
    """A checkpoint is missing, corrupt, or does not match the recipe."""


class RewardError(VgrpoError):
    """A reward returned NaN, the wrong shape, or raised while scoring."""


class HubError(VgrpoError):
    """The Hugging Face Hub refused or failed an upload (``vgrpo push``)."""


class TrackerError(VgrpoError):
    """An experiment tracker (``log.trackers``) is not installed or failed to start."""


class RunFilesError(VgrpoError):
    """A run's checkpoint or record could not be written (disk full, read-only), or its run directory is
    in use by another process."""
