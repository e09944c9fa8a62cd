"""Entry module of the ``signal_flow`` adapter and its reward: options and registration only.

No torch at import time: ``vgrpo plugins`` and ``vgrpo check`` import this module, and they must stay
fast. The factories import the model code when a run builds the components.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class SignalFlowConfig(PluginConfig):
    """Options of ``[adapter.options]`` for ``name = "signal_flow"``."""

    modality: ClassVar[str] = "signal"  # lets `vgrpo check` match rewards to this adapter without torch

    length: int = Field(32, ge=8, description="Samples per signal: the latent is [1, length].")
    hidden: int = Field(128, ge=8, description="Width of the velocity MLP.")
    prior_std: float = Field(
        0.3, gt=0, le=1, description="Std of the white noise the untrained model generates (its exact prior)."
    )
    init_seed: int = Field(0, description="Seed of the random initial weights (independent of the run seed).")
    shift: float = Field(1.0, gt=0, description="Timestep shift of sampling and training.")


class ToneConfig(PluginConfig):
    """Options of ``[rewards.options]`` for ``name = "signal_flow_tone"``."""

    modalities: ClassVar[frozenset[str]] = frozenset({"signal"})

    default_cycles: int = Field(
        2, ge=1, description="Cycles per signal wanted when the prompt names none ('a tone at 3 cycles')."
    )


def build_adapter(config: SignalFlowConfig, context: Any) -> Any:
    """Factory of the adapter: torch is imported here, not when the plugin is listed."""
    from vgrpo_example_adapter.model import SignalFlowAdapter

    return SignalFlowAdapter.from_config(config, context)


def build_tone(config: ToneConfig, context: Any) -> Any:
    from vgrpo_example_adapter.reward import ToneReward

    return ToneReward(default_cycles=config.default_cycles)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "signal_flow",
            build_adapter,
            SignalFlowConfig,
            summary="Tiny prompt-conditioned rectified-flow MLP that generates 1-D signals.",
        ),
        Component(
            "reward",
            "signal_flow_tone",
            build_tone,
            ToneConfig,
            summary="Share of a signal's energy at the frequency its prompt asks for, in [0, 1].",
        ),
    ]
