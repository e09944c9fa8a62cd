"""Entry module of the ``flux2`` and ``flux2_klein`` adapters: options and registration, no torch at import.

FLUX.2 [dev] through ``diffusers.Flux2Pipeline`` (embedded guidance, Mistral-3 text encoder) and FLUX.2
[klein] through ``diffusers.Flux2KleinPipeline`` (Qwen3 text encoder, optional true CFG): the transformer
is trained, the VAE and text encoder stay frozen. Two names because the two pipelines guide differently
and load different checkpoints; one implementation (``impl.py``) serves both. See docs/adapters.md.
"""

from __future__ import annotations

from pydantic import Field
from vgrpo_adapters._diffusers_options import CFGOptions, DiffusersAdapterConfig

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

SHIFT_STEPS_HELP = (
    "Step count whose empirical mu (FLUX.2's compute_empirical_mu, a function of the image token count "
    "and the step count) sets the static timestep shift exp(mu) of rollouts and the surrogate's t. Set it "
    "to rollout.steps to reproduce the pipeline's grid at that step count exactly; `shift` overrides it."
)


class Flux2AdapterConfig(DiffusersAdapterConfig):
    """Options of ``[adapter.options]`` for ``name = "flux2"`` (FLUX.2 [dev])."""

    model: str = Field(
        "black-forest-labs/FLUX.2-dev",
        description="Hub id or local folder of a FLUX.2 [dev] pipeline in the diffusers layout (FLUX.2-dev "
        "is gated: accept its licence on the hub, or point this at a downloaded copy).",
    )
    guidance: float = Field(
        4.0,
        ge=0,
        description="FLUX.2 [dev]'s embedded (distilled) guidance scale, fed to the transformer in rollouts "
        "and training (the pipeline's guidance_scale, default 4.0); one network pass per step.",
    )
    max_sequence_length: int = Field(
        512,
        ge=1,
        le=512,
        description="Mistral-3 tokens per prompt, system message included (padded; the pipeline's 512).",
    )
    shift_steps: int = Field(50, ge=1, description=SHIFT_STEPS_HELP)
    offload_text_encoders: bool = Field(
        False,
        description="Keep the Mistral-3 text encoder in host memory and move it to the device only while "
        "encoding prompts not yet cached (saves ~48 GB of GPU memory in bf16 for the 24B encoder).",
    )


class Flux2KleinAdapterConfig(DiffusersAdapterConfig, CFGOptions):
    """Options of ``[adapter.options]`` for ``name = "flux2_klein"`` (FLUX.2 [klein])."""

    model: str = Field(
        "black-forest-labs/FLUX.2-klein-4B",
        description="Hub id or local folder of a FLUX.2 [klein] pipeline in the diffusers layout: the "
        "step-distilled FLUX.2-klein-4B / -9B (4 steps, no CFG) or the base FLUX.2-klein-base-4B / -9B.",
    )
    max_sequence_length: int = Field(
        512, ge=1, le=512, description="Qwen3 tokens per prompt, chat template included (padded)."
    )
    cfg_scale: float = Field(
        1.0,
        ge=1.0,
        description="True classifier-free guidance scale (the pipeline's guidance_scale); 1 = off. The "
        "base models sample with 4.0 (two passes per step); step-distilled models refuse CFG.",
    )
    shift_steps: int = Field(4, ge=1, description=SHIFT_STEPS_HELP)
    offload_text_encoders: bool = Field(
        False,
        description="Keep the Qwen3 text encoder in host memory and move it to the device only while "
        "encoding prompts not yet cached (saves ~8 GB of GPU memory in bf16 for Qwen3-4B, ~16 GB for 8B).",
    )


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "adapter",
            "flux2",
            "vgrpo_adapters.flux2.impl:Flux2Adapter.from_config",
            Flux2AdapterConfig,
            "FLUX.2 [dev] text-to-image (diffusers Flux2Pipeline): transformer trained, VAE + Mistral-3 "
            "frozen, embedded guidance.",
        ),
        Component(
            "adapter",
            "flux2_klein",
            "vgrpo_adapters.flux2.impl:Flux2KleinAdapter.from_config",
            Flux2KleinAdapterConfig,
            "FLUX.2 [klein] text-to-image (diffusers Flux2KleinPipeline): transformer trained, VAE + "
            "Qwen3 frozen, optional true CFG.",
        ),
    ]
