"""The ``hunyuan_video15`` adapter: HunyuanVideo 1.5 text-to-video via ``diffusers.HunyuanVideo15Pipeline``.

A clip's latent ``[C, f, h, w]`` (``C = 32``, ``f = (F - 1) / 4 + 1``, ``h, w = H / 16, W / 16``) is what the
surrogate noises; latents are the VAE's times ``scaling_factor``, as the pipeline samples them. The
transformer is called as the pipeline calls it for t2v: the latents concatenated with all-zero
conditioning latents and a zero mask channel (``2C + 1`` input channels), ``timestep = 1000 sigma`` in the
transformer's dtype, Qwen2.5-VL and ByT5 embeddings with their masks, and all-zero image embeddings
(the transformer masks them out for t2v). Guidance is the pipeline guider's true CFG,
``v_uncond + s (v_cond - v_uncond)``. Loading, the prompt cache, rollouts, the clip geometry and
full-weight export come from ``DiffusersVideoAdapter``; the LoRA export differs because the pipeline has no
LoRA loader (see ``_save_lora``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import HunyuanVideo15Pipeline
from diffusers.loaders import HunyuanVideoLoraLoaderMixin
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import JOINT_ATTENTION, lora_targets_but_last_block, static_shift
from vgrpo_adapters._diffusers_export import LORA_FILE, lora_layers, lora_metadata, save_diffusers_lora
from vgrpo_adapters._diffusers_video import DiffusersVideoAdapter

from vgrpo_platform.protocols import Conditioning

TIMESTEP_SCALE = 1000.0
"""The pipeline feeds the scheduler's timesteps, ``1000 sigma``, to the transformer."""


def guider_scale(guider: Any) -> float:
    """The CFG scale the pipeline's ``ClassifierFreeGuidance`` guider applies (1 = none).

    Only the plain form over every step is reproduced: rescaling, a step window or the original
    formulation would change what the rollouts sample, so they are refused rather than ignored.
    """
    if guider is None or not getattr(guider, "_enabled", True):
        return 1.0
    cfg = guider.config
    if cfg.get("guidance_rescale", 0.0) or cfg.get("start", 0.0) != 0.0 or cfg.get("stop", 1.0) != 1.0:
        raise ValueError(
            "the pipeline's guider uses rescaling or a step window; set adapter.options.cfg_scale"
        )
    scale = float(cfg.get("guidance_scale", 1.0))
    return scale + 1.0 if cfg.get("use_original_formulation", False) else max(scale, 1.0)


class HunyuanVideo15Adapter(TrueCFGMixin, DiffusersVideoAdapter):
    """HunyuanVideo 1.5 3D DiT (trained) + video VAE, Qwen2.5-VL and ByT5 (frozen), true CFG."""

    pipeline_class = HunyuanVideo15Pipeline
    display_name = "HunyuanVideo 1.5"
    default_fps = 24.0
    # joint attention of the double-stream blocks, video and text streams (diffusers' HunyuanVideo layout);
    # the last block's text output projection is left out: the model discards that block's text stream
    LORA_SHARED: Sequence[str] = JOINT_ATTENTION
    LORA_TEXT_OUTPUT: Sequence[str] = ("attn.to_add_out",)
    lora_target_modules: Sequence[str] = (*LORA_SHARED, *LORA_TEXT_OUTPUT)  # before __init__ narrows it

    def __init__(
        self,
        pipe: HunyuanVideo15Pipeline,
        *,
        max_sequence_length: int = 1000,
        decode_chunk_size: int = 1,
        cfg_scale: float | None = None,
        **kwargs: Any,
    ) -> None:
        if decode_chunk_size != 1:
            raise ValueError(
                "decode_chunk_size must be 1: the VAE's causal mask broadcasts over one clip only"
            )
        cfg_scale = guider_scale(getattr(pipe, "guider", None)) if cfg_scale is None else float(cfg_scale)
        super().__init__(
            pipe, max_sequence_length=max_sequence_length, decode_chunk_size=1, cfg_scale=cfg_scale, **kwargs
        )
        blocks = len(self.denoiser.transformer_blocks)
        self.lora_target_modules = lora_targets_but_last_block(
            self.LORA_SHARED, self.LORA_TEXT_OUTPUT, blocks
        )
        pipe.tokenizer_max_length = max_sequence_length  # what encode_prompt pads / truncates to

    def _vae_scales(self) -> tuple[int, int]:
        return int(self.pipe.vae_scale_factor_spatial), int(self.pipe.vae_scale_factor_temporal)

    def _patch(self) -> int:
        return int(self.denoiser.config.patch_size)

    def _latent_channels(self) -> int:
        return int(self.vae.config.latent_channels)

    def default_shift(self) -> float:
        return static_shift(self.pipe.scheduler.config, 0)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """Qwen2.5-VL states ``[B, max_sequence_length, D]`` and ByT5 glyph states ``[B, 256, D2]`` with
        their masks, exactly as ``encode_prompt`` returns them (masks in the transformer's dtype)."""
        embeds, mask, glyph, glyph_mask = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, dtype=self.dtype, batch_size=len(prompts)
        )
        return {"prompt_embeds": embeds, "prompt_mask": mask, "glyph_embeds": glyph, "glyph_mask": glyph_mask}

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        z = z.to(self.device, self.dtype)  # [B, C, f, h, w]
        batch, _, frames, height, width = z.shape
        cond_latents = torch.zeros_like(z)  # t2v: no first-frame conditioning
        cond_mask = z.new_zeros(batch, 1, frames, height, width)
        image_embeds = z.new_zeros(batch, self.pipe.vision_num_semantic_tokens, self.pipe.vision_states_dim)
        return dict(
            hidden_states=torch.cat([z, cond_latents, cond_mask], dim=1),  # [B, 2C + 1, f, h, w]
            image_embeds=image_embeds,
            timestep=(t.to(self.device) * TIMESTEP_SCALE).to(self.dtype),
            encoder_hidden_states=cond["prompt_embeds"].to(self.device, self.dtype),
            encoder_attention_mask=cond["prompt_mask"].to(self.device, self.dtype),
            encoder_hidden_states_2=cond["glyph_embeds"].to(self.device, self.dtype),
            encoder_attention_mask_2=cond["glyph_mask"].to(self.device, self.dtype),
            return_dict=False,
        )

    # ------------------------------------------------------------------------------------ decode
    def _vae_decode(self, part: torch.Tensor) -> torch.Tensor:
        x = part.to(self.device, self.vae.dtype) / self.vae.config.scaling_factor
        return self.vae.decode(x, return_dict=False)[0].float()  # [1, 3, F, H, W]

    # ------------------------------------------------------------------------------------ export
    def _save_lora(self, out: Path, base: str) -> str:
        """``pytorch_lora_weights.safetensors`` in the diffusers layout (``transformer.``-prefixed keys, rank
        and alpha in its metadata). ``HunyuanVideo15Pipeline`` has no LoRA loader in diffusers 0.42, so it is
        written by the HunyuanVideo LoRA mixin and loads with ``pipe.transformer.load_lora_adapter(dir,
        prefix="transformer", weight_name="pytorch_lora_weights.safetensors")``."""
        save_diffusers_lora(
            HunyuanVideoLoraLoaderMixin, out, lora_layers(self.denoiser), lora_metadata(self.denoiser)
        )
        return (
            f"HunyuanVideo15Pipeline.from_pretrained('{base}').transformer"
            f".load_lora_adapter('{out}', prefix='transformer', weight_name='{LORA_FILE}')"
        )
