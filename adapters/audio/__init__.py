"""Entry module of the ``longcat_audio`` adapter: options and registration only, no torch at import time.

Text-to-audio with LongCat-AudioDiT through ``diffusers.LongCatAudioDiTPipeline``. Chosen over Stable Audio
Open (``StableAudioPipeline``) because it is a rectified-flow model: its network predicts a velocity on
``z_t = (1 - t) x + t eps`` (with time reversed), which is exactly the parameterisation the V-GRPO ELBO
surrogate and the core's flow ODE solvers assume, whereas Stable Audio is an EDM (v-prediction, cosine)
diffusion model that would need a second noise schedule and sampler in the core. The DiT is trained; the
waveform VAE and the UMT5 text encoder stay frozen. See docs/video-audio.md.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from vgrpo_adapters._diffusers_options import DiffusersModelConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class LongCatAudioConfig(DiffusersModelConfig):
    """Options of ``[adapter.options]`` for ``name = "longcat_audio"``."""

    modality: ClassVar[str] = "audio"

    model: str = Field(
        "ruixiangma/LongCat-AudioDiT-1B-Diffusers",
        description="Hub id or local folder of a LongCatAudioDiTPipeline in the diffusers layout.",
    )
    duration_s: float = Field(
        5.0, gt=0, le=30.0, description="Clip length in seconds (rounded down to whole latent frames)."
    )
    max_sequence_length: int = Field(
        128, ge=1, le=512, description="UMT5 tokens per prompt (padded to this length, longer ones are cut)."
    )
    shift: float | None = Field(
        None, gt=0, description="Timestep shift s of t -> s t / (1 + (s - 1) t); null = the scheduler's (1)."
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="Classifier-free guidance scale; 1 = off. LongCat samples with 4.0 (two passes).",
    )
    cfg_in_training: bool = Field(
        False,
        description="Also guide the surrogate's predictions (doubles training cost); needs cfg_scale > 1",
    )
    decode_chunk_size: int = Field(8, ge=1, description="Clips the waveform VAE decodes at once.")
    offload_text_encoders: bool = Field(
        False, description="Keep UMT5 in host memory, on the device only while encoding new prompts."
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "longcat_audio",
            "vgrpo_adapters.audio.impl:LongCatAudioAdapter.from_config",
            LongCatAudioConfig,
            "LongCat-AudioDiT text-to-audio (diffusers, rectified flow): DiT trained, VAE + UMT5 frozen.",
        ),
    ]
