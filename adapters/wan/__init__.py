"""Entry module of the ``wan`` adapter: its options and registration only, no torch at import time.

Wan 2.1 text-to-video through ``diffusers.WanPipeline``: the ``WanTransformer3DModel`` is trained, the
causal video VAE (``AutoencoderKLWan``) and the UMT5 text encoder stay frozen. The surrogate works on the
VAE's normalised video latents ``[16, (F - 1) / 4 + 1, H / 8, W / 8]``. See docs/video-audio.md.
Wan 2.2 T2V pipelines with two experts (``transformer_2`` and ``boundary_ratio``) are detected on
loading; ``cfg_scale_2`` and ``train_experts`` apply to them (docs/adapters.md).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersVideoConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class WanAdapterConfig(DiffusersVideoConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "wan"``."""

    model: str = Field(
        "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
        description="Hub id or local folder of a Wan 2.1 or 2.2 (two-expert) text-to-video pipeline in the "
        "diffusers layout.",
    )
    width: int = Field(832, ge=16, multiple_of=16, description="Frame width in pixels (multiple of 16).")
    fps: float = Field(16.0, gt=0, description="Frame rate the clips are written and scored at (Wan: 16).")
    max_sequence_length: int = Field(
        512, ge=1, le=512, description="UMT5 tokens per prompt (Wan's default 512; longer ones are cut)."
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="True classifier-free guidance scale; 1 = off. Wan's own sampling uses 5.0 (two passes).",
    )
    cfg_scale_2: float | None = Field(
        None,
        ge=1.0,
        description="Two-expert (Wan 2.2) models: CFG scale of the low-noise expert (WanPipeline's "
        "guidance_scale_2); cfg_scale is the high-noise expert's. null = cfg_scale. Needs cfg_scale > 1.",
    )
    train_experts: list[Literal["high", "low"]] | None = Field(
        None,
        min_length=1,
        description="Two-expert (Wan 2.2) models: which experts are trained (LoRA or full), 'high' = "
        "transformer (t >= boundary), 'low' = transformer_2; the others stay frozen. null = both.",
    )

    @model_validator(mode="after")
    def _experts_listed_once(self) -> WanAdapterConfig:
        if self.train_experts is not None and len(set(self.train_experts)) != len(self.train_experts):
            raise ValueError(f"train_experts lists an expert twice: {self.train_experts}")
        return self


class WanI2VAdapterConfig(WanAdapterConfig):
    """Options of ``[adapter.options]`` for ``name = "wan_i2v"``: ``wan``'s, for image-to-video."""

    takes_condition_image: ClassVar[bool] = True  # `vgrpo check`: every prompt needs an "image"

    model: str = Field(
        "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
        description="Hub id or local folder of a Wan 2.1 image-to-video pipeline (CLIP image encoder) or a "
        "Wan 2.2 I2V A14B one (two experts) in the diffusers layout; each prompt's image is the first frame.",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "wan",
            "vgrpo_adapters.wan.impl:WanAdapter.from_config",
            WanAdapterConfig,
            "Wan 2.1 / 2.2 text-to-video (diffusers): 3D DiT (Wan 2.2: its two experts) trained, "
            "video VAE + UMT5 frozen, optional CFG.",
        ),
        Component(
            "adapter",
            "wan_i2v",
            "vgrpo_adapters.wan.i2v:WanI2VAdapter.from_config",
            WanI2VAdapterConfig,
            "Wan 2.1 / 2.2 image-to-video (diffusers WanImageToVideoPipeline): each prompt's image is the "
            "first frame; 3D DiT trained, VAE + UMT5 (+ CLIP vision) frozen, optional CFG.",
        ),
    ]
