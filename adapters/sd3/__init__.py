"""Entry module of the ``sd3`` adapter: its options and registration only, no torch at import time.

Stable Diffusion 3 / 3.5 (Medium, Large, Large Turbo) through ``diffusers.StableDiffusion3Pipeline``: the
MMDiT transformer is trained, VAE and the CLIP-L, CLIP-G and T5 text encoders stay frozen. True
classifier-free guidance is optional in rollouts and in the surrogate. See docs/adapters.md.
"""

from __future__ import annotations

from pydantic import Field
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class SD3AdapterConfig(DiffusersAdapterConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "sd3"``."""

    model: str = Field(
        "stabilityai/stable-diffusion-3.5-medium",
        description="Hub id or local folder of an SD3 / SD3.5 pipeline in the diffusers layout (the "
        "stabilityai repositories are gated: accept the licence on the hub, or point this at a local copy).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "sd3",
            "vgrpo_adapters.sd3.impl:SD3Adapter.from_config",
            SD3AdapterConfig,
            "Stable Diffusion 3 / 3.5 (diffusers): MMDiT trained, VAE + CLIP/T5 frozen, optional CFG.",
        ),
    ]
