"""Options shared by the diffusers-backed adapters (``flux``, ``sd3``); pydantic only, no torch at import.

The entry modules of both adapters subclass ``DiffusersAdapterConfig`` and add their model-specific
knobs (FLUX's embedded guidance, SD3's true CFG).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from vgrpo_platform.registry import PluginConfig


class DiffusersAdapterConfig(PluginConfig):
    """Options every diffusers text-to-image flow adapter accepts."""

    modality: ClassVar[str] = "image"  # lets `vgrpo check` match rewards to the adapter without torch

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
    resolution: int = Field(
        512, ge=16, multiple_of=16, description="Image side in pixels (square images); a multiple of 16."
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
