"""Entry module of the ``qwen_image`` adapter: its options and registration only, no torch at import time.

Qwen-Image (20B MMDiT) through ``diffusers.QwenImagePipeline``: the transformer is trained, the video VAE
and the Qwen2.5-VL text encoder stay frozen; true classifier-free guidance is optional in rollouts and in
the surrogate. See docs/adapters.md.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class QwenImageAdapterConfig(DiffusersAdapterConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "qwen_image"``."""

    model: str = Field(
        "Qwen/Qwen-Image",
        description="Hub id or local folder of a Qwen-Image pipeline in the diffusers layout.",
    )
    max_sequence_length: int = Field(
        512,
        ge=1,
        le=1024,
        description="Text tokens kept per prompt (after the chat template's prefix is dropped; the "
        "pipeline's default is 512, its maximum 1024). Shorter prompts are padded and masked.",
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="True classifier-free guidance scale (the pipeline's true_cfg_scale, with its norm "
        "rescaling); 1 = off. Qwen-Image's own sampling uses 4.0 (two passes per step).",
    )
    negative_prompt: str = Field(
        " ", description="The unconditional prompt of CFG (the pipeline's examples: ' ')."
    )
    offload_text_encoders: bool = Field(
        False,
        description="Keep the Qwen2.5-VL text encoder in host memory and move it to the device only while "
        "encoding prompts not yet cached (saves ~16 GB of GPU memory in bf16 for Qwen2.5-VL-7B).",
    )


class QwenImageEditPlusAdapterConfig(QwenImageAdapterConfig):
    """Options of ``[adapter.options]`` for ``name = "qwen_image_edit_plus"``."""

    takes_condition_image: ClassVar[bool] = True  # `vgrpo check`: every prompt needs an "image"

    model: str = Field(
        "Qwen/Qwen-Image-Edit-2509",
        description="Hub id or local folder of a Qwen-Image-Edit pipeline the QwenImageEditPlusPipeline "
        "loads (Qwen-Image-Edit-2509 / 2511), in the diffusers layout.",
    )
    max_sequence_length: int = Field(
        1024,
        ge=1,
        le=1024,
        description="Tokens kept per instruction read with its images (Qwen2.5-VL's, after the template's "
        "prefix; ~200 per 384^2 source); longer ones are refused, shorter ones padded and masked.",
    )
    vae_image_area: int = Field(
        1024 * 1024,
        ge=32 * 32,
        description="Pixels of each source as the VAE encodes it (the pipeline's VAE_IMAGE_SIZE, at the "
        "source's aspect ratio, sides multiples of 32): its latents are the extra tokens.",
    )
    condition_image_area: int = Field(
        384 * 384,
        ge=28 * 28,
        description="Pixels of each source as Qwen2.5-VL reads it (the pipeline's CONDITION_IMAGE_SIZE).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "qwen_image",
            "vgrpo_adapters.qwen_image.impl:QwenImageAdapter.from_config",
            QwenImageAdapterConfig,
            "Qwen-Image text-to-image (diffusers QwenImagePipeline): transformer trained, VAE + "
            "Qwen2.5-VL frozen, optional true CFG.",
        ),
        Component(
            "adapter",
            "qwen_image_edit_plus",
            "vgrpo_adapters.qwen_image.edit_plus:QwenImageEditPlusAdapter.from_config",
            QwenImageEditPlusAdapterConfig,
            "Qwen-Image-Edit (diffusers QwenImageEditPlusPipeline): one or several source images read by "
            "Qwen2.5-VL and appended as latent tokens; transformer trained, optional true CFG.",
        ),
    ]
