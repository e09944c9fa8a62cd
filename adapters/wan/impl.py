"""The ``wan`` adapter: Wan 2.1 text-to-video through ``diffusers.WanPipeline``.

A video is one sample: its latent ``[C, f, h, w]`` (``C = z_dim``, ``f = (F - 1) / 4 + 1``, ``h, w = H / 8,
W / 8``) is what the surrogate noises and the transformer denoises. Latents are the VAE's per-channel
normalised ones (``(x - latents_mean) / latents_std``), as ``WanPipeline`` samples them. Loading, prompt
cache, rollouts, LoRA export and the clip geometry come from ``DiffusersVideoAdapter``; this module adds
the VAE's normalisation, the 3D transformer call and the two experts' guidance.

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
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import latent_stats, static_shift
from vgrpo_adapters._diffusers_video import DiffusersVideoAdapter
from vgrpo_adapters.wan.experts import EXPERTS, WanExperts
from vgrpo_adapters.wan.export import export_experts

from vgrpo_platform.protocols import Conditioning

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


class WanAdapter(TrueCFGMixin, DiffusersVideoAdapter):
    """Wan 3D DiT (trained) + video VAE and UMT5 (frozen), optional true CFG."""

    pipeline_class = WanPipeline
    display_name = "Wan"
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

    def __init__(
        self,
        pipe: WanPipeline,
        *,
        max_sequence_length: int = 512,
        decode_chunk_size: int = 1,
        cfg_scale: float = 1.0,
        cfg_scale_2: float | None = None,
        train_experts: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if pipe.config.get("expand_timesteps", False):
            raise ValueError("wan supports text-to-video pipelines with one timestep per clip (not TI2V)")
        self.experts = two_experts(pipe, train_experts)  # read by _load_denoiser
        if self.experts is None and (cfg_scale_2 is not None or train_experts is not None):
            raise ValueError("cfg_scale_2 and train_experts apply to two-expert (Wan 2.2) pipelines only")
        if cfg_scale_2 is not None and cfg_scale_2 != 1.0 and cfg_scale == 1.0:
            raise ValueError(
                "cfg_scale_2 needs cfg_scale > 1: WanPipeline guides only when guidance_scale > 1"
            )
        super().__init__(
            pipe,
            max_sequence_length=max_sequence_length,
            decode_chunk_size=decode_chunk_size,
            cfg_scale=cfg_scale,
            **kwargs,
        )
        self.cfg_scale_2 = float(cfg_scale if cfg_scale_2 is None else cfg_scale_2)
        self._latents_mean, self._latents_std = latent_stats(self.vae.config)  # [1, C, 1, 1, 1] each

    def _load_denoiser(self, pipe: WanPipeline) -> torch.nn.Module:
        if self.experts is None:
            return pipe.transformer.to(self.device)
        return self.experts.to_device(self.device)

    def _vae_scales(self) -> tuple[int, int]:
        return int(self.vae.config.scale_factor_spatial), int(self.vae.config.scale_factor_temporal)

    def _patch(self) -> int:
        return int(self.denoiser.config.patch_size[1])

    def _latent_channels(self) -> int:
        return int(self.vae.config.z_dim)

    def default_shift(self) -> float:
        return wan_shift(self.pipe.scheduler.config)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, max_sequence_length, D]``: UMT5 states, zero past each prompt's end."""
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return {"prompt_embeds": embeds}

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        return dict(
            hidden_states=z.to(self.device, self.dtype),  # [B, C, f, h, w]
            timestep=t.to(self.device) * TIMESTEP_SCALE,
            encoder_hidden_states=cond["prompt_embeds"].to(self.device, self.dtype),
            return_dict=False,
        )

    # --------------------------------------------------------------------------------------- CFG
    def guided_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Two experts: each row guided with its expert's scale (``cfg_scale`` high, ``cfg_scale_2`` low)."""
        if self.experts is None:
            return super().guided_velocity(z, t, cond)
        v_null, v_cond, t = self.doubled_batch_velocities(z, t, cond)
        high = self.experts.is_high(t * TIMESTEP_SCALE).view(-1, *[1] * (z.dim() - 1))  # [B, 1, ...]
        scale = torch.where(high, self.cfg_scale, self.cfg_scale_2).to(v_cond.dtype)
        return (v_null + scale * (v_cond - v_null)).to(z.dtype)

    # ------------------------------------------------------------------------------------ decode
    def _vae_decode(self, part: torch.Tensor) -> torch.Tensor:
        x = part.to(self.device, torch.float32)
        x = x * self._latents_std.to(x.device) + self._latents_mean.to(x.device)
        return self.vae.decode(x.to(self.vae.dtype), return_dict=False)[0].float()  # [b, 3, F, H, W]

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
