"""The ``longcat_audio`` adapter: LongCat-AudioDiT text-to-audio via ``diffusers.LongCatAudioDiTPipeline``.

Latents are the waveform VAE's ``[C, T]`` (``C = latent_dim``, ``T`` frames of ``downsampling_ratio``
samples); the transformer takes them time-major ``[B, T, C]``, so ``predict`` transposes. LongCat runs
time backwards: its network sees ``s = 1 - t`` (``s = 1`` is data) and predicts ``x - eps``; in the core's
convention (``t = 1`` noise, ``v = eps - x``) that is ``v(z, t) = -net(z, 1 - t)``. Its own sampler is the
Euler grid of the core's ``euler`` sampler, so rollouts equal the pipeline's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from diffusers import LongCatAudioDiTPipeline
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import DiffusersFlowAdapter, static_shift
from vgrpo_adapters._diffusers_export import save_peft_lora

from vgrpo_platform.protocols import Conditioning, Samples


class LongCatAudioAdapter(TrueCFGMixin, DiffusersFlowAdapter):
    """LongCat-AudioDiT DiT (trained) + waveform VAE and UMT5 (frozen), optional CFG against empty text."""

    modality = "audio"
    pipeline_class = LongCatAudioDiTPipeline
    lora_target_modules: Sequence[str] = ("to_q", "to_k", "to_v", "to_out.0")

    def __init__(
        self,
        pipe: LongCatAudioDiTPipeline,
        *,
        max_sequence_length: int = 128,
        decode_chunk_size: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            pipe, max_sequence_length=max_sequence_length, decode_chunk_size=decode_chunk_size, **kwargs
        )

    def _init_modality(self, *, duration_s: float) -> None:
        self.sample_rate = int(self.pipe.sample_rate)
        self.hop = int(self.pipe.vae_scale_factor)  # waveform samples per latent frame
        self.frames = int(duration_s * self.sample_rate // self.hop)
        if self.frames < 1:
            raise ValueError(f"duration_s={duration_s} is shorter than one latent frame ({self.hop} samples)")
        self.resolution = self.frames * self.hop  # samples per clip, recorded by export_trained

    def default_shift(self) -> float:
        return static_shift(self.pipe.scheduler.config, 0)

    def latent_shape(self) -> tuple[int, ...]:
        return (int(self.pipe.latent_dim), self.frames)

    def _encode(self, prompts: list[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, S, D]`` zero past each prompt's length up to ``S = max_sequence_length``,
        and ``prompt_lengths`` ``[B]``. Fixed ``S`` makes each prompt's rows independent of its batch-mates
        (the network masks positions past a prompt's length, but its text ConvNeXt's global norm sees the
        padded length); zeroing the encoder's states at the pad tokens of a longer batch-mate (masked, so
        no prediction changes) makes a cached row the same whichever prompts it was encoded with."""
        from diffusers.pipelines.longcat_audio_dit.pipeline_longcat_audio_dit import _normalize_text

        embeds, lengths = self.pipe.encode_prompt([_normalize_text(p) for p in prompts], self.device)
        s = self.max_sequence_length
        lengths = lengths.clamp(max=s).long()  # [B]
        embeds = F.pad(embeds[:, :s], (0, 0, 0, max(0, s - embeds.shape[1])))  # [B, S, D]
        own = torch.arange(s, device=embeds.device)[None] < lengths.to(embeds.device)[:, None]  # [B, S]
        return {"prompt_embeds": embeds * own[..., None], "prompt_lengths": lengths}

    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """LongCat's inputs: latents as ``[B, T, C]`` and reversed time ``1 - t``."""
        hidden = z.to(self.device, self.dtype).transpose(1, 2)  # [B, T, C]
        embeds = cond["prompt_embeds"].to(self.device, self.dtype)  # [B, S, D]
        positions = torch.arange(embeds.shape[1], device=self.device)
        text_mask = positions[None] < cond["prompt_lengths"].to(self.device)[:, None]  # [B, S]
        return dict(
            hidden_states=hidden,
            encoder_hidden_states=embeds,
            encoder_attention_mask=text_mask,
            timestep=(1 - t.to(self.device)).to(self.dtype),
            attention_mask=torch.ones(hidden.shape[:2], dtype=torch.bool, device=self.device),
            latent_cond=torch.zeros_like(hidden),
        )

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        """The core's velocity ``[B, C, T]`` from LongCat's reversed-time ``x - eps`` prediction."""
        return -output.sample.transpose(1, 2)

    # --------------------------------------------------------------------------------------- CFG
    def null_conditioning(self, cond: Conditioning, batch: int) -> Conditioning:
        """Zero text states with the prompt's mask: the pipeline's default without a negative prompt."""
        return {
            "prompt_embeds": torch.zeros_like(cond["prompt_embeds"]),
            "prompt_lengths": cond["prompt_lengths"],
        }

    # ------------------------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> Samples:
        """Latents ``[B, C, T]`` -> waveforms ``[B, 1, T * hop]`` in ``[-1, 1]`` at ``sample_rate``."""
        waves = [
            self.vae.decode(part.to(self.device, self.vae.dtype)).sample.float()  # [b, 1, T * hop]
            for part in latents.split(self.decode_chunk_size)
        ]
        return Samples("audio", torch.cat(waves).clamp(-1, 1), sample_rate=self.sample_rate)

    # ------------------------------------------------------------------------------------ export
    def _save_lora(self, out: Path, base: str) -> str:
        """``transformer_lora.safetensors`` + ``transformer_lora_config.json``: the pipeline has no LoRA
        loader, so they load with peft's ``inject_adapter_in_model`` + ``set_peft_model_state_dict``."""
        return save_peft_lora(self.denoiser, out)

    def _full_load_hint(self, folder: Path) -> str:
        return f"LongCatAudioDiTTransformer.from_pretrained('{folder}')"

    def _export_facts(self) -> dict[str, Any]:
        return {"samples": self.resolution, "sample_rate": self.sample_rate}
