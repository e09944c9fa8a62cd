"""The ``ltx2`` adapter: LTX-2 joint audio-video generation through ``diffusers.LTX2Pipeline``.

**The sample is both latents, as one flat vector.** LTX-2's transformer denoises a clip's video latents
``[C, f, h, w]`` and its soundtrack's audio latents ``[C_a, L, M]`` (``L`` latent audio frames of ``M``
mel bins) in one call, at one noise level, and predicts a velocity for each. The core's surrogates work on
one latent tensor ``[B, *L]``; the adapter hands them ``[B, N_video + N_audio]``: each sample's video
latents flattened, followed by its audio latents flattened (``split`` / ``join`` undo and redo it). The
rectified-flow forward process, the rollout ODE and the surrogate's per-element losses are elementwise,
so on the flat vector they are exactly the joint model's: one ``(t, eps)`` pair noises video and audio
together, as the pipeline does, and the ELBO surrogate is the mean over every element of the joint
sample (video dominates it in proportion to its element count, as it dominates the joint likelihood).
Nothing in the core changes, and no modality is left out of the likelihood; the alternatives (two
tensors through the core, or a sum of two surrogates with a weight) would change every surrogate.

Latents are the pipeline's own denoising space: video per-channel normalised by the VAE's
``latents_mean`` / ``latents_std`` (times ``scaling_factor``), audio normalised per packed feature by the
audio VAE's statistics; fresh noise is drawn in that space, as the pipeline draws it. The transformer sees
video packed into tokens (``LTX2Pipeline._pack_latents``) and audio as ``[L, C_a M]`` tokens
(``_pack_audio_latents``), at ``timestep = sigma = 1000 t`` for both.

Timestep shift: LTX-2 shifts dynamically (``mu`` linear in the video token count, LTX's defaults
``base_shift`` 0.95 at 1024 tokens to ``max_shift`` 2.05 at 4096) and may stretch the grid to a terminal
sigma (``shift_terminal``); as for Qwen-Image the adapter uses the static shift ``e^mu`` without the
stretch (rollouts equal the pipeline's on a scheduler without it); ``shift`` overrides it.

Guidance: the pipeline's CFG per modality, ``v_neg + s (v_cond - v_neg)`` with ``cfg_scale`` on the video
velocity and ``audio_cfg_scale`` on the audio one (its x0-space delta form is the same combination). Its
``guidance_rescale``, spatio-temporal guidance (``stg_scale``) and modality-isolation guidance
(``modality_scale``) need extra passes and are not reproduced: the rollouts equal the pipeline called with
``guidance_rescale=0, stg_scale=0, modality_scale=1`` (and the audio ones likewise).

Decoding gives a video ``Samples`` (``[B, F, 3, H, W]`` frames at ``fps``) whose ``audio`` is the
vocoder's waveform ``[B, channels, samples]`` at ``sample_rate``: video rewards score the frames, audio
rewards the soundtrack (``Samples.for_modalities``), a reward declaring both gets both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from diffusers import LTX2Pipeline
from vgrpo_adapters._diffusers_cfg import TrueCFGMixin
from vgrpo_adapters._diffusers_common import static_shift
from vgrpo_adapters._diffusers_video import DiffusersVideoAdapter

from vgrpo_platform.protocols import Conditioning, Samples

TIMESTEP_SCALE = 1000.0
"""LTX-2's transformer takes the scheduler's timesteps, ``1000 sigma``, as ``timestep`` and ``sigma``."""
LTX_SHIFT_DEFAULTS = {
    "base_image_seq_len": 1024,
    "max_image_seq_len": 4096,
    "base_shift": 0.95,
    "max_shift": 2.05,
}
"""What ``LTX2Pipeline`` takes for ``mu`` when its scheduler config lacks a key."""
FROZEN_PARTS = ("connectors", "audio_vae", "vocoder")
"""Pipeline components besides the VAE and the text encoder: frozen and kept on the device."""


def ltx2_static_shift(scheduler_config: Any, video_tokens: int) -> float:
    """``e^mu`` of the pipeline's dynamic shift at ``video_tokens`` tokens, without its terminal stretch."""
    return static_shift(
        {**LTX_SHIFT_DEFAULTS, **dict(scheduler_config), "shift_terminal": None}, video_tokens
    )


class LTX2Adapter(TrueCFGMixin, DiffusersVideoAdapter):
    """LTX-2 audio-video DiT (trained) + video VAE, audio VAE, vocoder, Gemma 3 and connectors (frozen)."""

    pipeline_class = LTX2Pipeline
    display_name = "LTX-2"
    default_fps = 24.0
    # Flow-Factory's LTX-2 targets: the 28 linear layers of each block (video and audio self- and text
    # cross-attention, audio-to-video and video-to-audio attention, both feed-forwards)
    lora_target_modules: Sequence[str] = tuple(
        f"{attn}.{proj}"
        for attn in (
            "attn1",
            "attn2",
            "audio_attn1",
            "audio_attn2",
            "audio_to_video_attn",
            "video_to_audio_attn",
        )
        for proj in ("to_q", "to_k", "to_v", "to_out.0")
    ) + ("ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2")

    def __init__(
        self,
        pipe: LTX2Pipeline,
        *,
        max_sequence_length: int = 1024,
        decode_chunk_size: int = 1,
        cfg_scale: float = 1.0,
        audio_cfg_scale: float | None = None,
        **kwargs: Any,
    ) -> None:
        for name in FROZEN_PARTS:  # before the base class moves the transformer: all on one device
            getattr(pipe, name).requires_grad_(False).eval()
        self.audio_cfg_scale = float(cfg_scale if audio_cfg_scale is None else audio_cfg_scale)
        super().__init__(
            pipe,
            max_sequence_length=max_sequence_length,
            decode_chunk_size=decode_chunk_size,
            cfg_scale=cfg_scale,
            **kwargs,
        )
        for name in FROZEN_PARTS:
            getattr(pipe, name).to(self.device)

    def _init_modality(
        self, *, height: int, width: int, num_frames: int, fps: float | None = None, vae_tiling: bool = False
    ) -> None:
        super()._init_modality(
            height=height, width=width, num_frames=num_frames, fps=fps, vae_tiling=vae_tiling
        )
        self.video_shape = (
            self._latent_channels(),
            (self.num_frames - 1) // self.scale_temporal + 1,
            self.height // self.scale_spatial,
            self.width // self.scale_spatial,
        )
        audio_vae = self.pipe.audio_vae
        per_second = self.pipe.audio_sampling_rate / self.pipe.audio_hop_length
        frames = round(
            self.num_frames / self.fps * per_second / self.pipe.audio_vae_temporal_compression_ratio
        )
        if frames < 1:
            raise ValueError(
                f"{self.num_frames} frames at {self.fps} fps are shorter than one audio latent frame"
            )
        mel_bins = int(audio_vae.config.mel_bins) // self.pipe.audio_vae_mel_compression_ratio
        self.audio_shape = (int(audio_vae.config.latent_channels), frames, mel_bins)
        self.sample_rate = int(self.pipe.vocoder.config.output_sampling_rate)

    # ------------------------------------------------------------------------------------ layout
    def latent_shape(self) -> tuple[int, ...]:
        return (math.prod(self.video_shape) + math.prod(self.audio_shape),)

    def split(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, N_video + N_audio]`` -> video ``[B, C, f, h, w]`` and audio ``[B, C_a, L, M]`` (views)."""
        video, audio = z.split([math.prod(self.video_shape), math.prod(self.audio_shape)], dim=1)
        return video.reshape(-1, *self.video_shape), audio.reshape(-1, *self.audio_shape)

    def join(self, video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """Video ``[B, C, f, h, w]`` and audio ``[B, C_a, L, M]`` -> the flat sample ``[B, N]``."""
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    def video_tokens(self) -> int:
        patch, patch_t = self._patch(), int(self.denoiser.config.patch_size_t)
        _, f, h, w = self.video_shape
        return (f // patch_t) * (h // patch) * (w // patch)

    # ------------------------------------------------------------------------------ model facts
    def _vae_scales(self) -> tuple[int, int]:
        return int(self.pipe.vae_spatial_compression_ratio), int(self.pipe.vae_temporal_compression_ratio)

    def _patch(self) -> int:
        return int(self.denoiser.config.patch_size)

    def _latent_channels(self) -> int:
        return int(self.vae.config.latent_channels)

    def default_shift(self) -> float:
        return ltx2_static_shift(self.pipe.scheduler.config, self.video_tokens())

    @property
    def uses_cfg(self) -> bool:
        return max(self.cfg_scale, self.audio_cfg_scale) > 1.0

    # ------------------------------------------------------------------------------------- text
    def _encode(self, prompts: list[str]) -> Conditioning:
        """The connectors' video and audio text states ``[B, S, D]`` and their mask ``[B, S]``, from Gemma's
        stacked hidden states of each prompt left-padded to ``max_sequence_length`` (a fixed length: a row
        never depends on its batch-mates)."""
        embeds, mask, _, _ = self.pipe.encode_prompt(
            prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        video, audio, text_mask = self.pipe.connectors(
            embeds, mask, padding_side=self.pipe.tokenizer.padding_side
        )
        return {"video_text": video, "audio_text": audio, "text_mask": text_mask}

    # ------------------------------------------------------------------------------- the network
    def denoiser_inputs(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        video, audio = self.split(z.to(self.device, self.dtype))
        patch, patch_t = self._patch(), int(self.denoiser.config.patch_size_t)
        _, f, h, w = self.video_shape
        timestep = t.to(self.device) * TIMESTEP_SCALE  # [B]
        mask = cond["text_mask"].to(self.device)
        return dict(
            hidden_states=self.pipeline_class._pack_latents(video, patch, patch_t),  # [B, N_v, C]
            audio_hidden_states=self.pipeline_class._pack_audio_latents(audio),  # [B, L, C_a M]
            encoder_hidden_states=cond["video_text"].to(self.device, self.dtype),
            audio_encoder_hidden_states=cond["audio_text"].to(self.device, self.dtype),
            timestep=timestep,
            sigma=timestep,
            encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask,
            num_frames=f // patch_t,
            height=h // patch,
            width=w // patch,
            fps=self.fps,
            audio_num_frames=self.audio_shape[1],
            use_cross_timestep=True,  # as LTX2Pipeline.__call__ calls it
            return_dict=False,
        )

    def denoiser_output(self, output: Any, z: torch.Tensor) -> torch.Tensor:
        """Both predicted velocities, unpacked and joined into the flat layout ``[B, N]``."""
        video, audio = output[0], output[1]
        patch, patch_t = self._patch(), int(self.denoiser.config.patch_size_t)
        _, f, h, w = self.video_shape
        video = self.pipeline_class._unpack_latents(
            video, f // patch_t, h // patch, w // patch, patch, patch_t
        )
        channels, frames, mel = self.audio_shape
        audio = self.pipeline_class._unpack_audio_latents(audio, frames, num_mel_bins=mel)
        return self.join(video, audio)

    # --------------------------------------------------------------------------------------- CFG
    def guided_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The pipeline's CFG: the video velocity guided with ``cfg_scale``, the audio one with
        ``audio_cfg_scale``, from one network call on the doubled batch."""
        v_null, v_cond, _ = self.doubled_batch_velocities(z, t, cond)
        null_video, null_audio = self.split(v_null)
        cond_video, cond_audio = self.split(v_cond)
        video = null_video + self.cfg_scale * (cond_video - null_video)
        audio = null_audio + self.audio_cfg_scale * (cond_audio - null_audio)
        return self.join(video, audio).to(z.dtype)

    # ------------------------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> Samples:
        """Clips ``[B, F, 3, H, W]`` in ``[0, 1]`` at ``fps`` with their soundtrack ``audio`` ``[B, channels,
        samples]`` in ``[-1, 1]`` at ``sample_rate``, decoded ``decode_chunk_size`` samples at a time."""
        clips, waves = [], []
        for part in latents.split(self.decode_chunk_size):
            video, audio = self.split(part.to(self.device, torch.float32))
            clips.append(self._vae_decode(video).permute(0, 2, 1, 3, 4))  # [b, F, 3, H, W] in ~[-1, 1]
            waves.append(self._audio_decode(audio))
        frames = ((torch.cat(clips) + 1) / 2).clamp(0, 1)
        audio = torch.cat(waves).clamp(-1, 1)
        return Samples("video", frames, fps=self.fps, sample_rate=self.sample_rate, audio=audio)

    def _vae_decode(self, video: torch.Tensor) -> torch.Tensor:
        """Normalised video latents ``[b, C, f, h, w]`` -> clips ``[b, 3, F, H, W]`` in ``~[-1, 1]``."""
        vae = self.vae
        x = self.pipeline_class._denormalize_latents(
            video, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
        timestep = None  # the pipeline's default decode_timestep 0: no decode noise
        if vae.config.timestep_conditioning:
            timestep = torch.zeros(x.shape[0], device=x.device, dtype=vae.dtype)
        return vae.decode(x.to(vae.dtype), timestep, return_dict=False)[0].float()

    def _audio_decode(self, audio: torch.Tensor) -> torch.Tensor:
        """Normalised audio latents ``[b, C_a, L, M]`` -> waveforms ``[b, channels, samples]``: denormalised
        per packed feature as the pipeline does, then the audio VAE's mel spectrogram and the vocoder."""
        audio_vae, (_, frames, mel) = self.pipe.audio_vae, self.audio_shape
        packed = self.pipeline_class._pack_audio_latents(audio)  # [b, L, C_a M]
        packed = self.pipeline_class._denormalize_audio_latents(
            packed, audio_vae.latents_mean, audio_vae.latents_std
        )
        x = self.pipeline_class._unpack_audio_latents(packed, frames, num_mel_bins=mel)
        mel_spectrogram = audio_vae.decode(x.to(audio_vae.dtype), return_dict=False)[0]
        return self.pipe.vocoder(mel_spectrogram).float()

    def _export_facts(self) -> dict[str, Any]:
        return {**super()._export_facts(), "sample_rate": self.sample_rate, "audio_latent": self.audio_shape}
