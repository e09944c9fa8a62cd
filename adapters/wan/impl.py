"""The ``wan`` adapter: Wan 2.1 text-to-video through ``diffusers.WanPipeline``.

A video is one sample: its latent ``[C, f, h, w]`` (``C = z_dim``, ``f = (F - 1) / 4 + 1``, ``h, w = H / 8,
W / 8``) is what the surrogate noises and the transformer denoises, so the core's image code paths apply
unchanged with ``*L = [C, f, h, w]``. Latents are the VAE's per-channel normalised ones
(``(x - latents_mean) / latents_std``), as ``WanPipeline`` samples them. Everything the image adapters
share (loading, prompt cache, rollouts, LoRA export) comes from ``DiffusersFlowAdapter``; this module adds
the video VAE, the 3D transformer call and optional true CFG.

Wan 2.2 T2V (A14B) pipelines hold two experts (``transformer`` for high noise, ``transformer_2`` for low
noise) and a ``boundary_ratio`` in ``model_index.json``: ``denoiser`` is then a ``WanExperts`` that routes
each row as ``WanPipeline`` routes each step (``experts.py``), with a guidance scale per expert.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import WanPipeline
from vgrpo_adapters._diffusers_common import DiffusersFlowAdapter, PromptCache, TrueCFGMixin, static_shift
from vgrpo_adapters.wan.experts import EXPERTS, WanExperts
from vgrpo_adapters.wan.export import export_experts

from vgrpo_platform.protocols import Conditioning, Samples
from vgrpo_platform.schedules import RectifiedFlowSchedule

TIMESTEP_SCALE = 1000.0
"""Wan's transformer embeds ``timestep = 1000 sigma``."""


def wan_shift(scheduler_config: Any) -> float:
    """The model's static timestep shift: Wan ships a flow UniPC scheduler whose shift is ``flow_shift``."""
    get = (
        scheduler_config.get
        if hasattr(scheduler_config, "get")
        else lambda k, d=None: getattr(scheduler_config, k, d)
    )
    if get("use_flow_sigmas", False):
        return float(get("flow_shift", 1.0))
    return static_shift(scheduler_config, 0)


class WanAdapter(TrueCFGMixin, DiffusersFlowAdapter):
    """Wan 3D DiT (trained) + video VAE and UMT5 (frozen), optional true CFG."""

    modality = "video"
    pipeline_class = WanPipeline
    # self-attention and text cross-attention projections (diffusers' Wan LoRA layout)
    lora_target_modules: Sequence[str] = (
        "attn1.to_q",
        "attn1.to_k",
        "attn1.to_v",
        "attn1.to_out.0",
        "attn2.to_q",
        "attn2.to_k",
        "attn2.to_v",
        "attn2.to_out.0",
    )

    def __init__(  # noqa: PLR0913 - mirrors the config's options
        self,
        pipe: WanPipeline,
        *,
        height: int,
        width: int,
        num_frames: int,
        fps: float = 16.0,
        device: torch.device | str = "cpu",
        shift: float | None = None,
        max_sequence_length: int = 512,
        decode_chunk_size: int = 1,
        vae_tiling: bool = False,
        cache_text_embeddings: bool = True,
        text_cache_device: str = "cpu",
        offload_text_encoders: bool = False,
        cfg_scale: float = 1.0,
        cfg_in_training: bool = False,
        negative_prompt: str = "",
        cfg_scale_2: float | None = None,
        train_experts: Sequence[str] | None = None,
    ) -> None:
        # The base constructor reads an image VAE's config; the video VAE's differs, so set the same
        # attributes here and reuse every method of the base class.
        if pipe.config.get("expand_timesteps", False):
            raise ValueError("wan supports text-to-video pipelines with one timestep per clip (not TI2V)")
        if cfg_scale < 1.0:
            raise ValueError(f"cfg_scale must be >= 1 (1 = off), got {cfg_scale}")
        self.pipe = pipe
        self.device = torch.device(device)
        self.experts = two_experts(pipe, train_experts)
        if self.experts is None:
            if cfg_scale_2 is not None or train_experts is not None:
                raise ValueError("cfg_scale_2 and train_experts apply to two-expert (Wan 2.2) pipelines only")
            self.denoiser = pipe.transformer.to(self.device)
        else:
            self.denoiser = self.experts.to_device(self.device)
        self.dtype = self.denoiser.dtype
        self.cfg_scale_2 = float(cfg_scale if cfg_scale_2 is None else cfg_scale_2)
        if cfg_scale_2 is not None and cfg_scale_2 != 1.0 and cfg_scale == 1.0:
            raise ValueError(
                "cfg_scale_2 needs cfg_scale > 1: WanPipeline guides only when guidance_scale > 1"
            )
        self.vae = pipe.vae.requires_grad_(False).eval().to(self.device)
        if vae_tiling:
            self.vae.enable_tiling()
        self.text_encoders = [pipe.text_encoder]
        self.offload_text_encoders = offload_text_encoders
        pipe.text_encoder.requires_grad_(False).eval().to("cpu" if offload_text_encoders else self.device)
        self.scale_spatial = int(self.vae.config.scale_factor_spatial)
        self.scale_temporal = int(self.vae.config.scale_factor_temporal)
        self._check_size(height, width, num_frames)
        self.height, self.width, self.num_frames, self.fps = height, width, num_frames, float(fps)
        self.resolution = (height, width, num_frames)  # recorded by export_trained
        self.max_sequence_length = max_sequence_length
        self.decode_chunk_size = decode_chunk_size
        shift = shift if shift is not None else wan_shift(pipe.scheduler.config)
        self.schedule = RectifiedFlowSchedule(shift)
        cache_device = self.device if text_cache_device == "device" else torch.device("cpu")
        self.prompt_cache = PromptCache(cache_text_embeddings, cache_device)
        self.cfg_scale = float(cfg_scale)
        self.cfg_in_training = cfg_in_training
        self.negative_prompt = negative_prompt
        cfg = self.vae.config
        self._latents_mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1)  # [1, C, 1, 1, 1]
        self._latents_std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1)

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
            decode_chunk_size=config.decode_chunk_size,
            vae_tiling=config.vae_tiling,
            cache_text_embeddings=config.cache_text_embeddings,
            text_cache_device=config.text_cache_device,
            offload_text_encoders=config.offload_text_encoders,
            cfg_scale=config.cfg_scale,
            cfg_in_training=config.cfg_in_training,
            negative_prompt=config.negative_prompt,
            cfg_scale_2=config.cfg_scale_2,
            train_experts=config.train_experts,
        )

    def _check_size(self, height: int, width: int, num_frames: int) -> None:
        step = self.scale_spatial * self.denoiser.config.patch_size[1]
        if height % step or width % step:
            raise ValueError(f"Wan needs sides divisible by {step} (VAE x patch), got {height}x{width}")
        if (num_frames - 1) % self.scale_temporal:
            raise ValueError(f"num_frames must be {self.scale_temporal}k + 1, got {num_frames}")

    def latent_shape(self) -> tuple[int, ...]:
        return (
            int(self.vae.config.z_dim),
            (self.num_frames - 1) // self.scale_temporal + 1,
            self.height // self.scale_spatial,
            self.width // self.scale_spatial,
        )

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, max_sequence_length, D]``: UMT5 states, zero past each prompt's end."""
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return {"prompt_embeds": embeds}

    def _transformer(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.denoiser(
            hidden_states=z.to(self.device, self.dtype),  # [B, C, f, h, w]
            timestep=t.to(self.device) * TIMESTEP_SCALE,
            encoder_hidden_states=cond["prompt_embeds"].to(self.device, self.dtype),
            return_dict=False,
        )[0]

    # --------------------------------------------------------------------------------------- CFG
    def guided_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Two experts: each row guided with its expert's scale (``cfg_scale`` high, ``cfg_scale_2`` low)."""
        if self.experts is None:
            return super().guided_velocity(z, t, cond)
        batch = z.shape[0]
        null = self.null_conditioning(cond, batch)
        both = {k: torch.cat([null[k].to(self.device), cond[k].to(self.device)]) for k in cond}
        t = t.to(device=z.device, dtype=torch.float32).expand(batch)  # [B]
        v_null, v_cond = self._transformer(torch.cat([z, z]), torch.cat([t, t]), both).chunk(2)
        high = self.experts.is_high(t * TIMESTEP_SCALE).view(-1, *[1] * (z.dim() - 1))  # [B, 1, ...]
        scale = torch.where(high, self.cfg_scale, self.cfg_scale_2).to(v_cond.dtype)
        return (v_null + scale * (v_cond - v_null)).to(z.dtype)

    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """The negative prompt's encoding (cached), repeated over the batch."""
        negative = self.encode_prompts([self.negative_prompt])  # [1, ...]
        return {k: negative[k].expand(batch, *negative[k].shape[1:]) for k in cond}

    # ------------------------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> Samples:
        """Latents ``[B, C, f, h, w]`` -> clips ``[B, F, 3, H, W]`` float32 in ``[0, 1]``, in chunks."""
        clips = []
        for part in latents.split(self.decode_chunk_size):
            x = part.to(self.device, torch.float32)
            x = x * self._latents_std.to(x.device) + self._latents_mean.to(x.device)
            video = self.vae.decode(x.to(self.vae.dtype), return_dict=False)[0].float()  # [b, 3, F, H, W]
            clips.append(video.permute(0, 2, 1, 3, 4))  # [b, F, 3, H, W] in ~[-1, 1]
        return Samples("video", ((torch.cat(clips) + 1) / 2).clamp(0, 1), fps=self.fps)

    # -------------------------------------------------------------------------------------- export
    def export_trained(self, out_dir: str | Path) -> None:
        """Wan 2.1: the base class's. Two experts: one folder per trained expert (see ``export.py``)."""
        if self.experts is None:
            return super().export_trained(out_dir)
        export_experts(self, Path(out_dir))


def two_experts(pipe: WanPipeline, train_experts: Sequence[str] | None) -> WanExperts | None:
    """The pipeline's two-expert layout as a ``WanExperts`` (None for one transformer).

    ``WanPipeline`` switches to ``transformer_2`` below ``boundary_ratio * num_train_timesteps``; a
    ``transformer_2`` without a boundary (never used by the pipeline) or a boundary without it (the
    pipeline would fail at the low-noise steps) is rejected rather than guessed.
    """
    low, ratio = getattr(pipe, "transformer_2", None), pipe.config.get("boundary_ratio", None)
    if low is None and ratio is None:
        return None
    if low is None or ratio is None or pipe.transformer is None:
        raise ValueError(
            "a two-expert Wan 2.2 pipeline needs transformer, transformer_2 and boundary_ratio "
            f"(got transformer_2={'set' if low is not None else None}, boundary_ratio={ratio})"
        )
    boundary = float(ratio) * pipe.scheduler.config.num_train_timesteps
    return WanExperts(
        pipe.transformer, low, boundary, trained=EXPERTS if train_experts is None else train_experts
    )
