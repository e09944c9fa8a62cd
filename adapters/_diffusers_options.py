"""Options shared by the diffusers-backed adapters; pydantic only, no torch at import.

``DiffusersModelConfig`` holds what every modality accepts, ``DiffusersAdapterConfig`` adds the image
size, ``DiffusersVideoConfig`` the clip size, and ``CFGOptions`` true classifier-free guidance. The entry
modules subclass them and add (or re-describe) their model-specific knobs. Field names are the adapters'
constructor keywords (``DiffusersFlowAdapter.options_from_config`` matches them by name).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator
from vgrpo_adapters._weights import PickleWeightsOption

from vgrpo_platform.registry import PluginConfig


class DiffusersModelConfig(PickleWeightsOption):
    """Options every diffusers flow adapter accepts, whatever it generates."""

    model: str = Field(
        description="Hub id (e.g. 'black-forest-labs/FLUX.1-dev') or a local folder in the diffusers layout "
        "(model_index.json + transformer/, vae/, text_encoder*/, tokenizer*/, scheduler/). A relative path "
        "that exists next to the recipe is taken as a folder; anything else is looked up on the hub cache "
        "(set HF_HUB_OFFLINE=1 to forbid downloads).",
    )
    revision: str | None = Field(
        None, description="Hub revision (branch, tag or commit); null = the default."
    )
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="Weight dtype of every component: 'auto' = bf16 on CUDA, fp32 on the CPU."
    )
    max_sequence_length: int = Field(
        256, ge=1, le=512, description="T5 tokens per prompt (longer prompts are truncated)."
    )
    shift: float | None = Field(
        None,
        gt=0,
        description="Timestep shift s of t -> s t / (1 + (s - 1) t) for rollouts and the surrogate's t; "
        "null = the model's own (scheduler config: its static 'shift', or exp(mu) at this resolution when it "
        "shifts dynamically, as FLUX does).",
    )
    decode_chunk_size: int = Field(
        4, ge=1, description="Images the VAE decodes at once (bounds the decoder's activation memory)."
    )
    cache_text_embeddings: bool = Field(
        True, description="Encode each distinct prompt once and keep its embeddings (keyed by the prompt)."
    )
    text_cache_device: Literal["cpu", "device"] = Field(
        "cpu", description="Where cached embeddings live: 'cpu' (host memory) or 'device' (GPU memory)."
    )
    offload_text_encoders: bool = Field(
        False,
        description="Keep the text encoders in host memory and move them to the device only while encoding "
        "prompts not yet cached (saves their GPU memory, e.g. ~9.5 GB for FLUX's T5-XXL in bf16).",
    )


class DiffusersAdapterConfig(DiffusersModelConfig):
    """Options every diffusers text-to-image flow adapter accepts."""

    modality: ClassVar[str] = "image"  # lets `vgrpo check` match rewards to the adapter without torch

    resolution: int = Field(
        512, ge=16, multiple_of=16, description="Image side in pixels (square images); a multiple of 16."
    )


class DiffusersVideoConfig(DiffusersModelConfig):
    """Options every diffusers text-to-video flow adapter accepts (subclasses add ``width`` and ``fps``)."""

    modality: ClassVar[str] = "video"

    resolution: int | None = Field(
        None,
        ge=16,
        multiple_of=16,
        description="Shorthand for square frames (sets height and width); null = use height and width.",
    )
    height: int = Field(480, ge=16, multiple_of=16, description="Frame height in pixels (multiple of 16).")
    num_frames: int = Field(
        33, ge=1, description="Frames per clip; 4k + 1 (the VAE keeps the first frame, then compresses 4:1)."
    )
    decode_chunk_size: int = Field(
        1, ge=1, description="Clips the VAE decodes at once (a clip's decoder activations are large)."
    )
    vae_tiling: bool = Field(
        False, description="Decode each clip in overlapping spatial tiles (bounds memory at high resolution)."
    )

    @model_validator(mode="after")
    def _frames_fit_the_vae(self) -> DiffusersVideoConfig:
        if (self.num_frames - 1) % 4:
            raise ValueError(
                f"num_frames must be 4k + 1 (the VAE compresses time 4:1), got {self.num_frames}"
            )
        return self


class CFGOptions(PluginConfig):
    """True classifier-free guidance (``TrueCFGMixin``); put it after the adapter's base config."""

    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="True classifier-free guidance scale; 1 = off (one network pass). Above 1 every rollout "
        "step costs two passes: v = v_neg + s (v_cond - v_neg).",
    )
    cfg_in_training: bool = Field(
        False,
        description="Also guide the surrogate's predictions (doubles training cost); needs cfg_scale > 1.",
    )
    negative_prompt: str = Field(
        "", description="The unconditional prompt of CFG (the pipeline's default: empty)."
    )
