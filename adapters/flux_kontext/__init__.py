"""Entry module of the ``flux_kontext`` adapter: its options and registration only, no torch at import time.

FLUX.1 Kontext (image editing) through ``diffusers.FluxKontextPipeline``: each prompt's condition image
(the ``"image"`` of its JSONL line) is encoded by the VAE and its latents join the noisy latents as extra
tokens. The transformer is trained; VAE and the CLIP + T5 text encoders stay frozen. See docs/adapters.md.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from vgrpo_adapters.flux import FluxAdapterConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class FluxKontextAdapterConfig(FluxAdapterConfig):
    """Options of ``[adapter.options]`` for ``name = "flux_kontext"``."""

    takes_condition_image: ClassVar[bool] = True  # `vgrpo check`: every prompt needs an "image"

    model: str = Field(
        "black-forest-labs/FLUX.1-Kontext-dev",
        description="Hub id or local folder of a FLUX.1 Kontext pipeline in the diffusers layout "
        "(FLUX.1-Kontext-dev is gated: accept its licence on the hub, or point this at a downloaded copy).",
    )
    guidance: float = Field(
        2.5,
        ge=0,
        description="Kontext's embedded (distilled) guidance scale in rollouts and training (the model "
        "card's 2.5; diffusers' pipeline defaults to 3.5).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "flux_kontext",
            "vgrpo_adapters.flux_kontext.impl:FluxKontextAdapter.from_config",
            FluxKontextAdapterConfig,
            "FLUX.1 Kontext image editing (diffusers FluxKontextPipeline): each prompt's condition image "
            "as extra tokens; transformer trained, VAE + CLIP/T5 frozen.",
        ),
    ]
