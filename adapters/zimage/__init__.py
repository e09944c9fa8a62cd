"""Entry module of the ``zimage`` adapter: its options and registration only, no torch at import time.

Z-Image (the 6B single-stream S3-DiT of Tongyi-MAI) through ``diffusers.ZImagePipeline``: the transformer
is trained, the VAE and the Qwen3 text encoder stay frozen; true classifier-free guidance is optional in
rollouts and in the surrogate. See docs/adapters.md.
"""

from __future__ import annotations

from pydantic import Field
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component


class ZImageAdapterConfig(DiffusersAdapterConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "zimage"``."""

    model: str = Field(
        "Tongyi-MAI/Z-Image",
        description="Hub id or local folder of a Z-Image pipeline in the diffusers layout "
        "(Tongyi-MAI/Z-Image, or the step-distilled Tongyi-MAI/Z-Image-Turbo, which samples without CFG).",
    )
    max_sequence_length: int = Field(
        512,
        ge=1,
        le=1024,
        description="Qwen3 tokens per prompt, chat template included (the pipeline's default 512); longer "
        "prompts are cut. Only each prompt's own tokens reach the transformer.",
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="True classifier-free guidance scale v_neg + s (v_cond - v_neg); 1 = off. The pipeline's "
        "guidance_scale g is s = g + 1 here (it computes v_cond + g (v_cond - v_neg)): Z-Image's own "
        "sampling uses g = 4, i.e. cfg_scale 5 (two passes per step).",
    )
    offload_text_encoders: bool = Field(
        False,
        description="Keep the Qwen3-4B text encoder in host memory and move it to the device only while "
        "encoding prompts not yet cached (saves ~8 GB of GPU memory in bf16).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "zimage",
            "vgrpo_adapters.zimage.impl:ZImageAdapter.from_config",
            ZImageAdapterConfig,
            "Z-Image text-to-image (diffusers ZImagePipeline): S3-DiT trained, VAE + Qwen3 frozen, "
            "optional true CFG.",
        ),
    ]
