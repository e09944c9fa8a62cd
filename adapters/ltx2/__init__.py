"""Entry module of the ``ltx2`` adapter: its options and registration only, no torch at import time.

LTX-2 (Lightricks' joint audio-video DiT) through ``diffusers.LTX2Pipeline``: one transformer denoises a
clip's video latents and its soundtrack's audio latents together; both are the sample. The transformer is
trained; the video and audio VAEs, the vocoder, the Gemma 3 text encoder and its text connectors stay
frozen. Samples are video clips carrying their audio (``Samples.audio``): video rewards score the frames,
audio rewards the soundtrack. See docs/adapters.md.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersVideoConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class LTX2AdapterConfig(DiffusersVideoConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "ltx2"``."""

    companion_modalities: ClassVar[tuple[str, ...]] = ("audio",)  # its video samples carry their audio

    model: str = Field(
        "Lightricks/LTX-2",
        description="Hub id or local folder of an LTX-2 text-to-audio-video pipeline in the diffusers "
        "layout.",
    )
    height: int = Field(512, ge=16, multiple_of=16, description="Frame height in pixels (LTX-2: 512).")
    width: int = Field(768, ge=16, multiple_of=16, description="Frame width in pixels (LTX-2: 768).")
    num_frames: int = Field(
        121,
        ge=1,
        description="Frames per clip: 8k + 1 for LTX-2's VAE (it keeps the first frame, then compresses "
        "8:1); the soundtrack lasts num_frames / fps seconds.",
    )
    fps: float = Field(
        24.0,
        gt=0,
        description="Frame rate the clip is generated at (RoPE conditioning), written and scored at.",
    )
    max_sequence_length: int = Field(
        1024, ge=1, le=1024, description="Gemma tokens per prompt, left-padded (the pipeline's default 1024)."
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="Classifier-free guidance scale of the video latents (the pipeline's guidance_scale, "
        "without its guidance_rescale, spatio-temporal and modality guidance); 1 = off.",
    )
    audio_cfg_scale: float | None = Field(
        None,
        ge=1.0,
        description="Classifier-free guidance scale of the audio latents (the pipeline's "
        "audio_guidance_scale); null = cfg_scale.",
    )

    @model_validator(mode="after")
    def _audio_cfg_needs_cfg(self) -> LTX2AdapterConfig:
        if self.cfg_in_training and max(self.cfg_scale, self.audio_cfg_scale or 1.0) <= 1.0:
            raise ValueError("cfg_in_training needs cfg_scale or audio_cfg_scale > 1")
        return self


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "ltx2",
            "vgrpo_adapters.ltx2.impl:LTX2Adapter.from_config",
            LTX2AdapterConfig,
            "LTX-2 text-to-audio+video (diffusers LTX2Pipeline): one DiT denoises video and audio latents "
            "together (both are the sample); VAEs, vocoder, Gemma 3 frozen; optional CFG per modality.",
        ),
    ]
