"""Entry module of the ``hunyuan_video15`` adapter: options and registration only, no torch at import time.

HunyuanVideo 1.5 text-to-video through ``diffusers.HunyuanVideo15Pipeline``: the 8.3B
``HunyuanVideo15Transformer3DModel`` is trained; the causal video VAE (``AutoencoderKLHunyuanVideo15``),
the Qwen2.5-VL text encoder and the ByT5 glyph encoder stay frozen. True classifier-free guidance as the
pipeline's guider does it. See docs/adapters.md.
"""

from __future__ import annotations

from pydantic import Field
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersVideoConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class HunyuanVideo15AdapterConfig(DiffusersVideoConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "hunyuan_video15"``."""

    model: str = Field(
        "hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v",
        description="Hub id or local folder of a HunyuanVideo 1.5 text-to-video pipeline (diffusers layout).",
    )
    width: int = Field(848, ge=16, multiple_of=16, description="Frame width in pixels (multiple of 16).")
    fps: float = Field(
        24.0, gt=0, description="Frame rate the clips are written and scored at (HunyuanVideo: 24)."
    )
    max_sequence_length: int = Field(
        1000,
        ge=1,
        le=1000,
        description="Qwen2.5-VL tokens per prompt after the system template (the pipeline's 1000; padded "
        "tokens are masked). The ByT5 glyph encoder always takes the pipeline's 256.",
    )
    decode_chunk_size: int = Field(
        1,
        ge=1,
        le=1,
        description="Clips the VAE decodes at once: 1 (the VAE's causal attention mask in diffusers 0.42 "
        "only broadcasts over a batch of one clip).",
    )
    cfg_scale: float | None = Field(
        None,
        ge=1.0,
        description="True classifier-free guidance scale; 1 = off (one pass per step); null = the "
        "pipeline's own guider (its guidance_scale when enabled: 6.0 for the released t2v models).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "hunyuan_video15",
            "vgrpo_adapters.hunyuan_video.impl:HunyuanVideo15Adapter.from_config",
            HunyuanVideo15AdapterConfig,
            "HunyuanVideo 1.5 text-to-video (diffusers): 8.3B DiT trained, video VAE + Qwen2.5-VL/ByT5 "
            "frozen, CFG as the pipeline's guider.",
        ),
    ]
