"""The video part of the diffusers-backed adapters (``wan``, ``hunyuan_video15``).

A clip is one sample: its latent ``[C, f, h, w]`` (``f = (F - 1) / temporal + 1``, ``h, w = H / spatial,
W / spatial``) is what the surrogate noises, so the core's image code paths apply unchanged with
``*L = [C, f, h, w]``. What the two video models share (frame size and count, the VAE's compression,
tiling, decoding to ``[B, F, 3, H, W]`` clips, the ``resolution`` shorthand of their configs) is here once.
"""

from __future__ import annotations

from typing import Any

import torch
from vgrpo_adapters._diffusers_common import DiffusersFlowAdapter

from vgrpo_platform.protocols import Samples


class DiffusersVideoAdapter(DiffusersFlowAdapter):
    """A text-to-video pipeline. Subclasses say how their VAE compresses (``_vae_scales``), the
    transformer's spatial patch (``_patch``), the latent channels and how a chunk decodes (``_vae_decode``).
    """

    modality = "video"
    display_name: str = "this model"
    default_fps: float = 16.0

    def _init_modality(
        self, *, height: int, width: int, num_frames: int, fps: float | None = None, vae_tiling: bool = False
    ) -> None:
        if vae_tiling:
            self.vae.enable_tiling()
        self.scale_spatial, self.scale_temporal = self._vae_scales()
        self._check_size(height, width, num_frames)
        self.height, self.width, self.num_frames = height, width, num_frames
        self.fps = float(self.default_fps if fps is None else fps)
        self.resolution = (height, width, num_frames)  # recorded by export_trained

    @classmethod
    def options_from_config(cls, config: Any) -> dict[str, Any]:
        """As the base's, with the config's ``resolution`` shorthand for square frames."""
        side = config.resolution
        return {
            **super().options_from_config(config),
            "height": side or config.height,
            "width": side or config.width,
        }

    def _vae_scales(self) -> tuple[int, int]:
        """``(spatial, temporal)`` downsampling of the VAE."""
        raise NotImplementedError

    def _patch(self) -> int:
        """Latent pixels per transformer token side."""
        raise NotImplementedError

    def _latent_channels(self) -> int:
        raise NotImplementedError

    def _check_size(self, height: int, width: int, num_frames: int) -> None:
        step = self.scale_spatial * self._patch()
        if height % step or width % step:
            raise ValueError(
                f"{self.display_name} needs sides divisible by {step} (VAE x patch), got {height}x{width}"
            )
        if (num_frames - 1) % self.scale_temporal:
            raise ValueError(f"num_frames must be {self.scale_temporal}k + 1, got {num_frames}")

    def latent_shape(self) -> tuple[int, ...]:
        return (
            self._latent_channels(),
            (self.num_frames - 1) // self.scale_temporal + 1,
            self.height // self.scale_spatial,
            self.width // self.scale_spatial,
        )

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> Samples:
        """Latents ``[B, C, f, h, w]`` -> clips ``[B, F, 3, H, W]`` float32 in ``[0, 1]``, in chunks."""
        clips = []
        for part in latents.split(self.decode_chunk_size):
            video = self._vae_decode(part)  # [b, 3, F, H, W]
            clips.append(video.permute(0, 2, 1, 3, 4))  # [b, F, 3, H, W] in ~[-1, 1]
        return Samples("video", ((torch.cat(clips) + 1) / 2).clamp(0, 1), fps=self.fps)

    def _vae_decode(self, part: torch.Tensor) -> torch.Tensor:
        """A chunk of latents -> clips ``[b, 3, F, H, W]`` float32 in ``~[-1, 1]``."""
        raise NotImplementedError
