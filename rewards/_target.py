"""A measured level as a reward, or minus its distance to a target level.

Loudness, motion and brightness rewards all read an optional ``target`` the same way; one function
keeps the rule (and its sign) the same for each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def toward_target(values: torch.Tensor, target: float | None) -> torch.Tensor:
    """``values`` as they are (more is better) without ``target``, else ``-|values - target|`` (0 at it)."""
    return values if target is None else -(values - target).abs()
