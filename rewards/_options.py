"""Options every model-based image reward shares (cheap to import: pydantic only, no torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vgrpo_platform.registry import PluginConfig


class ModelRewardConfig(PluginConfig):
    """``dtype`` and ``batch_size`` of a reward that runs a network on the samples' device."""

    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="Weights and activations dtype; null = the run's dtype (float32 when unset)."
    )
    batch_size: int = Field(
        32, ge=1, description="Images per forward pass (bounds the reward's peak memory)."
    )
