"""Entry module of the ``flux`` adapter: its options and registration only, no torch at import time.

FLUX.1 (dev / schnell and fine-tunes in the diffusers layout) through ``diffusers.FluxPipeline``: the
transformer is trained, VAE and the CLIP + T5 text encoders stay frozen. See docs/adapters.md.
"""

from __future__ import annotations

from pydantic import Field
from vgrpo_adapters._diffusers_options import DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class FluxAdapterConfig(DiffusersAdapterConfig):
    """Options of ``[adapter.options]`` for ``name = "flux"``."""

    model: str = Field(
        "black-forest-labs/FLUX.1-dev",
        description="Hub id or local folder of a FLUX.1 pipeline in the diffusers layout (FLUX.1-dev is "
        "gated: accept its licence on the hub, or point this at a downloaded copy).",
    )
    guidance: float = Field(
        3.5,
        ge=0,
        description="FLUX's embedded (distilled) guidance scale, fed to the transformer in rollouts and "
        "training; ignored by models without a guidance embedding (FLUX.1-schnell).",
    )
    max_sequence_length: int = Field(
        512, ge=1, le=512, description="T5 tokens per prompt (FLUX.1-dev: 512, schnell: 256)."
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "flux",
            "vgrpo_adapters.flux.impl:FluxAdapter.from_config",
            FluxAdapterConfig,
            "FLUX.1 text-to-image (diffusers FluxPipeline): transformer trained, VAE + CLIP/T5 frozen.",
        ),
    ]
