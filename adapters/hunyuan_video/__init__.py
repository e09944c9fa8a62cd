"""Entry module of the ``hunyuan_video15`` adapter: options and registration only, no torch at import time.

HunyuanVideo 1.5 text-to-video through ``diffusers.HunyuanVideo15Pipeline``: the 8.3B
``HunyuanVideo15Transformer3DModel`` is trained; the causal video VAE (``AutoencoderKLHunyuanVideo15``),
the Qwen2.5-VL text encoder and the ByT5 glyph encoder stay frozen. True classifier-free guidance as the
pipeline's guider does it. See docs/adapters.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator
from vgrpo_adapters._diffusers_options import DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl


class HunyuanVideo15AdapterConfig(DiffusersAdapterConfig):
    """Options of ``[adapter.options]`` for ``name = "hunyuan_video15"``."""

    modality: ClassVar[str] = "video"

    model: str = Field(
        "hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v",
        description="Hub id or local folder of a HunyuanVideo 1.5 text-to-video pipeline (diffusers layout).",
    )
    resolution: int | None = Field(
        None,
        ge=16,
        multiple_of=16,
        description="Shorthand for square frames (sets height and width); null = use height and width.",
    )
    height: int = Field(480, ge=16, multiple_of=16, description="Frame height in pixels (multiple of 16).")
    width: int = Field(848, ge=16, multiple_of=16, description="Frame width in pixels (multiple of 16).")
    num_frames: int = Field(
        33, ge=1, description="Frames per clip; 4k + 1 (the VAE keeps the first frame, then compresses 4:1)."
    )
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
    vae_tiling: bool = Field(
        False, description="Decode each clip in overlapping spatial tiles (bounds memory at 480p / 720p)."
    )
    cfg_scale: float | None = Field(
        None,
        ge=1.0,
        description="True classifier-free guidance scale; 1 = off (one pass per step); null = the "
        "pipeline's own guider (its guidance_scale when enabled: 6.0 for the released t2v models).",
    )
    cfg_in_training: bool = Field(
        False,
        description="Also guide the surrogate's predictions (doubles training cost); needs cfg_scale > 1.",
    )
    negative_prompt: str = Field(
        "", description="The unconditional prompt of CFG (the pipeline's default: empty)."
    )

    @model_validator(mode="after")
    def _frames_fit_the_vae(self) -> HunyuanVideo15AdapterConfig:
        if (self.num_frames - 1) % 4:
            raise ValueError(
                f"num_frames must be 4k + 1 (the VAE compresses time 4:1), got {self.num_frames}"
            )
        return self


def build_hunyuan_video15_adapter(config: HunyuanVideo15AdapterConfig, context: Any) -> Any:
    """Factory: imports torch and diffusers only when a run builds the adapter."""
    from vgrpo_adapters.hunyuan_video.impl import HunyuanVideo15Adapter

    return HunyuanVideo15Adapter.from_config(config, context)


@hookimpl
def register_adapters(register):  # noqa: ANN001 - the host's Register callable
    register(
        "hunyuan_video15",
        build_hunyuan_video15_adapter,
        HunyuanVideo15AdapterConfig,
        summary="HunyuanVideo 1.5 text-to-video (diffusers): 8.3B DiT trained, video VAE + Qwen2.5-VL/ByT5 "
        "frozen, CFG as the pipeline's guider.",
    )
