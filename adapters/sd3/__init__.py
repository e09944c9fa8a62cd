"""Entry module of the ``sd3`` adapter: its options and registration only, no torch at import time.

Stable Diffusion 3 / 3.5 (Medium, Large, Large Turbo) through ``diffusers.StableDiffusion3Pipeline``: the
MMDiT transformer is trained, VAE and the CLIP-L, CLIP-G and T5 text encoders stay frozen. True
classifier-free guidance is optional in rollouts and in the surrogate. See docs/adapters.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from vgrpo_adapters._diffusers_options import DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl


class SD3AdapterConfig(DiffusersAdapterConfig):
    """Options of ``[adapter.options]`` for ``name = "sd3"``."""

    model: str = Field(
        "stabilityai/stable-diffusion-3.5-medium",
        description="Hub id or local folder of an SD3 / SD3.5 pipeline in the diffusers layout (the "
        "stabilityai repositories are gated: accept the licence on the hub, or point this at a local copy).",
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="True classifier-free guidance scale; 1 = off (one network pass). Above 1 every rollout "
        "step costs two passes: v = v_neg + s (v_cond - v_neg).",
    )
    cfg_in_training: bool = Field(
        False,
        description="Also guide the surrogate's predictions (the trained policy is then the guided one; "
        "doubles training cost). Only used when cfg_scale > 1.",
    )
    negative_prompt: str = Field("", description="The unconditional prompt of CFG (SD3's default: empty).")


def build_sd3_adapter(config: SD3AdapterConfig, context: Any) -> Any:
    """Factory: imports torch and diffusers only when a run builds the adapter."""
    from vgrpo_adapters.sd3.impl import SD3Adapter

    return SD3Adapter.from_config(config, context)


@hookimpl
def register_adapters(register):  # noqa: ANN001 - the host's Register callable
    register(
        "sd3",
        build_sd3_adapter,
        SD3AdapterConfig,
        summary="Stable Diffusion 3 / 3.5 (diffusers): MMDiT trained, VAE + CLIP/T5 frozen, optional CFG.",
    )
