"""The ``hunyuan_video15`` adapter: HunyuanVideo 1.5 text-to-video via ``diffusers.HunyuanVideo15Pipeline``.

A clip's latent ``[C, f, h, w]`` (``C = 32``, ``f = (F - 1) / 4 + 1``, ``h, w = H / 16, W / 16``) is what the
surrogate noises; latents are the VAE's times ``scaling_factor``, as the pipeline samples them. The
transformer is called as the pipeline calls it for t2v: the latents concatenated with all-zero
conditioning latents and a zero mask channel (``2C + 1`` input channels), ``timestep = 1000 sigma`` in the
transformer's dtype, Qwen2.5-VL and ByT5 embeddings with their masks, and all-zero image embeddings
(the transformer masks them out for t2v). Guidance is the pipeline guider's true CFG,
``v_uncond + s (v_cond - v_uncond)``. Loading, the prompt cache, rollouts and full-weight export come from
``DiffusersFlowAdapter``; the LoRA export differs because the pipeline has no LoRA loader (see
``export_trained``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import HunyuanVideo15Pipeline
from diffusers.loaders import HunyuanVideoLoraLoaderMixin
from vgrpo_adapters._diffusers_common import (
    EXPORT_INFO,
    DiffusersFlowAdapter,
    PromptCache,
    TrueCFGMixin,
    static_shift,
)

from vgrpo_platform.finetune import uses_lora
from vgrpo_platform.protocols import Conditioning, Samples
from vgrpo_platform.schedules import RectifiedFlowSchedule

LORA_FILE = "pytorch_lora_weights.safetensors"
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


class HunyuanVideo15Adapter(TrueCFGMixin, DiffusersFlowAdapter):
    """HunyuanVideo 1.5 3D DiT (trained) + video VAE, Qwen2.5-VL and ByT5 (frozen), true CFG."""

    modality = "video"
    pipeline_class = HunyuanVideo15Pipeline
    # joint attention of the double-stream blocks, video and text streams (diffusers' HunyuanVideo layout);
    # the last block's text output projection is left out: the model discards that block's text stream
    LORA_SHARED: Sequence[str] = (
        "attn.to_q",
        "attn.to_k",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_q_proj",
        "attn.add_k_proj",
        "attn.add_v_proj",
    )
    LORA_TEXT_OUTPUT: Sequence[str] = ("attn.to_add_out",)
    lora_target_modules: Sequence[str] = (*LORA_SHARED, *LORA_TEXT_OUTPUT)  # before __init__ narrows it

    def __init__(  # noqa: PLR0913 - mirrors the config's options
        self,
        pipe: HunyuanVideo15Pipeline,
        *,
        height: int,
        width: int,
        num_frames: int,
        fps: float = 24.0,
        device: torch.device | str = "cpu",
        shift: float | None = None,
        max_sequence_length: int = 1000,
        vae_tiling: bool = False,
        cache_text_embeddings: bool = True,
        text_cache_device: str = "cpu",
        offload_text_encoders: bool = False,
        cfg_scale: float | None = None,
        cfg_in_training: bool = False,
        negative_prompt: str = "",
    ) -> None:
        # The base constructor reads an image VAE's config; set the same attributes for the video VAE.
        cfg_scale = guider_scale(getattr(pipe, "guider", None)) if cfg_scale is None else float(cfg_scale)
        if cfg_scale < 1.0:
            raise ValueError(f"cfg_scale must be >= 1 (1 = off), got {cfg_scale}")
        self.pipe = pipe
        self.device = torch.device(device)
        self.denoiser = pipe.transformer.to(self.device)
        self.dtype = self.denoiser.dtype
        blocks = len(self.denoiser.transformer_blocks)
        self.lora_target_modules = (
            *self.LORA_SHARED,
            *(f"transformer_blocks.{i}.{name}" for i in range(blocks - 1) for name in self.LORA_TEXT_OUTPUT),
        )
        self.vae = pipe.vae.requires_grad_(False).eval().to(self.device)
        if vae_tiling:
            self.vae.enable_tiling()
        self.text_encoders = [pipe.text_encoder, pipe.text_encoder_2]
        self.offload_text_encoders = offload_text_encoders
        for encoder in self.text_encoders:
            encoder.requires_grad_(False).eval().to("cpu" if offload_text_encoders else self.device)
        self.scale_spatial = int(pipe.vae_scale_factor_spatial)
        self.scale_temporal = int(pipe.vae_scale_factor_temporal)
        self._check_size(height, width, num_frames)
        self.height, self.width, self.num_frames, self.fps = height, width, num_frames, float(fps)
        self.resolution = (height, width, num_frames)  # recorded by export_trained
        self.max_sequence_length = max_sequence_length
        pipe.tokenizer_max_length = max_sequence_length  # what encode_prompt pads / truncates to
        self.decode_chunk_size = 1
        shift = shift if shift is not None else static_shift(pipe.scheduler.config, 0)
        self.schedule = RectifiedFlowSchedule(shift)
        cache_device = self.device if text_cache_device == "device" else torch.device("cpu")
        self.prompt_cache = PromptCache(cache_text_embeddings, cache_device)
        self.cfg_scale = cfg_scale
        self.cfg_in_training = cfg_in_training
        self.negative_prompt = negative_prompt

    @staticmethod
    def options_from_config(config: Any) -> dict[str, Any]:
        side = config.resolution
        return dict(
            height=side or config.height,
            width=side or config.width,
            num_frames=config.num_frames,
            fps=config.fps,
            shift=config.shift,
            max_sequence_length=config.max_sequence_length,
            vae_tiling=config.vae_tiling,
            cache_text_embeddings=config.cache_text_embeddings,
            text_cache_device=config.text_cache_device,
            offload_text_encoders=config.offload_text_encoders,
            cfg_scale=config.cfg_scale,
            cfg_in_training=config.cfg_in_training,
            negative_prompt=config.negative_prompt,
        )

    def _check_size(self, height: int, width: int, num_frames: int) -> None:
        step = self.scale_spatial * self.denoiser.config.patch_size
        if height % step or width % step:
            raise ValueError(
                f"HunyuanVideo 1.5 needs sides divisible by {step} (VAE x patch), got {height}x{width}"
            )
        if (num_frames - 1) % self.scale_temporal:
            raise ValueError(f"num_frames must be {self.scale_temporal}k + 1, got {num_frames}")

    def latent_shape(self) -> tuple[int, ...]:
        return (
            int(self.vae.config.latent_channels),
            (self.num_frames - 1) // self.scale_temporal + 1,
            self.height // self.scale_spatial,
            self.width // self.scale_spatial,
        )

    def _encode(self, prompts: list[str]) -> Conditioning:
        """Qwen2.5-VL states ``[B, max_sequence_length, D]`` and ByT5 glyph states ``[B, 256, D2]`` with
        their masks, exactly as ``encode_prompt`` returns them (masks in the transformer's dtype)."""
        embeds, mask, glyph, glyph_mask = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, dtype=self.dtype, batch_size=len(prompts)
        )
        return {"prompt_embeds": embeds, "prompt_mask": mask, "glyph_embeds": glyph, "glyph_mask": glyph_mask}

    def _transformer(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        z = z.to(self.device, self.dtype)  # [B, C, f, h, w]
        batch, _, frames, height, width = z.shape
        cond_latents = torch.zeros_like(z)  # t2v: no first-frame conditioning
        cond_mask = z.new_zeros(batch, 1, frames, height, width)
        image_embeds = z.new_zeros(batch, self.pipe.vision_num_semantic_tokens, self.pipe.vision_states_dim)
        return self.denoiser(
            hidden_states=torch.cat([z, cond_latents, cond_mask], dim=1),  # [B, 2C + 1, f, h, w]
            image_embeds=image_embeds,
            timestep=(t.to(self.device) * TIMESTEP_SCALE).to(self.dtype),
            encoder_hidden_states=cond["prompt_embeds"].to(self.device, self.dtype),
            encoder_attention_mask=cond["prompt_mask"].to(self.device, self.dtype),
            encoder_hidden_states_2=cond["glyph_embeds"].to(self.device, self.dtype),
            encoder_attention_mask_2=cond["glyph_mask"].to(self.device, self.dtype),
            return_dict=False,
        )[0]

    # --------------------------------------------------------------------------------------- CFG
    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """The negative prompt's encoding (cached), repeated over the batch."""
        negative = self.encode_prompts([self.negative_prompt])  # [1, ...]
        return {k: negative[k].expand(batch, *negative[k].shape[1:]) for k in cond}

    # ------------------------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> Samples:
        """Latents ``[B, C, f, h, w]`` -> clips ``[B, F, 3, H, W]`` float32 in ``[0, 1]``, clip by clip."""
        clips = []
        for part in latents.split(1):
            x = part.to(self.device, self.vae.dtype) / self.vae.config.scaling_factor
            video = self.vae.decode(x, return_dict=False)[0].float()  # [1, 3, F, H, W]
            clips.append(video.permute(0, 2, 1, 3, 4))  # [1, F, 3, H, W] in ~[-1, 1]
        return Samples("video", ((torch.cat(clips) + 1) / 2).clamp(0, 1), fps=self.fps)

    # ------------------------------------------------------------------------------------ export
    def export_trained(self, out_dir: str | Path) -> None:
        """LoRA: ``pytorch_lora_weights.safetensors`` in the diffusers layout (``transformer.``-prefixed keys,
        rank and alpha in its metadata). ``HunyuanVideo15Pipeline`` has no LoRA loader in diffusers 0.42, so
        it is written by the HunyuanVideo LoRA mixin and loads with ``pipe.transformer.load_lora_adapter(dir,
        prefix="transformer", weight_name="pytorch_lora_weights.safetensors")``.
        Full fine-tuning: as the base class (``out_dir/transformer``)."""
        if not uses_lora(self.denoiser):
            super().export_trained(out_dir)
            return
        from peft.utils import get_peft_model_state_dict

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {
            k: v.detach().to("cpu").contiguous() for k, v in get_peft_model_state_dict(self.denoiser).items()
        }
        peft_config = getattr(self.denoiser, "peft_config", {}).get("default")
        HunyuanVideoLoraLoaderMixin.save_lora_weights(
            out,
            transformer_lora_layers=state,
            transformer_lora_adapter_metadata=peft_config.to_dict() if peft_config is not None else None,
        )
        base = getattr(self.pipe, "name_or_path", None) or "<base model>"
        info = {
            "kind": "lora",
            "load": f"HunyuanVideo15Pipeline.from_pretrained('{base}').transformer"
            f".load_lora_adapter('{out}', prefix='transformer', weight_name='{LORA_FILE}')",
            "base_model": base,
            "resolution": self.resolution,
            "shift": self.schedule.shift,
        }
        (out / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
