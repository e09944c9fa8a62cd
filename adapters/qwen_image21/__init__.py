"""Entry module of the ``qwen_image21`` adapter: its options and registration only, no torch at import time.

Qwen-Image 2.x through ``diffusers.QwenImage21Pipeline``: the single-stream block-causal transformer is
trained, the RGBA video VAE and the Qwen3-VL text encoder stay frozen; true classifier-free guidance is
optional in rollouts and in the surrogate. Text-to-image only (no condition images). See docs/adapters.md.
"""

from __future__ import annotations

from pydantic import Field
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class QwenImage21AdapterConfig(DiffusersAdapterConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "qwen_image21"``."""

    model: str = Field(
        "Qwen/Qwen-Image-2.1",
        description="Hub id or local folder of a Qwen-Image 2.x pipeline (QwenImage21Pipeline) in the "
        "diffusers layout.",
    )
    resolution: int = Field(
        1024,
        ge=32,
        multiple_of=32,
        description="Image side in pixels (square images); a multiple of 32 (VAE factor 16 x the 2x2 "
        "tokens of one encoder slot). The pipeline's default is 1024.",
    )
    max_sequence_length: int = Field(
        512,
        ge=1,
        le=4096,
        description="Text tokens stored per prompt (after the system prefix is dropped). The pipeline never "
        "truncates, so a longer prompt is refused rather than cut; shorter ones are padded and masked.",
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="True classifier-free guidance scale (the pipeline's true_cfg_scale: "
        "v_neg + s (v_cond - v_neg), no rescaling); 1 = off.",
    )
    negative_prompt: str = Field(
        " ", description="The unconditional prompt of CFG (the pipeline encodes an empty one as ' ')."
    )
    offload_text_encoders: bool = Field(
        False,
        description="Keep the Qwen3-VL text encoder in host memory and move it to the device only while "
        "encoding prompts not yet cached.",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "qwen_image21",
            "vgrpo_adapters.qwen_image21.impl:QwenImage21Adapter.from_config",
            QwenImage21AdapterConfig,
            "Qwen-Image 2.x text-to-image (diffusers QwenImage21Pipeline): transformer trained, VAE + "
            "Qwen3-VL frozen, optional true CFG.",
        ),
    ]
