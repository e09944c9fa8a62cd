"""The ``moving_shapes`` adapter: a pixel-space Wan 3D DiT, called by the core (no VAE, no pipeline).

Latents are the clips themselves in Wan's layout, ``[B, 3, F, R, R]`` in ``[-1, 1]``; ``decode`` rescales
them to video ``Samples`` ``[B, F, 3, R, R]`` in ``[0, 1]``. ``WanPipeline`` needs a VAE, so the adapter
follows the ``toy`` adapter's pattern: ``CoreCalledAdapter`` (the core samples and calls the denoiser),
``FolderModelExport`` with Wan's LoRA layout (``WanPipeline.save_lora_weights``) for the export.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import WanTransformer3DModel
from transformers import CLIPTokenizer, UMT5EncoderModel
from vgrpo_adapters._diffusers_export import FolderModelExport
from vgrpo_adapters._tiny_models import load_model_folder, padded_tokens, resolve_model_path
from vgrpo_adapters.wan.impl import TIMESTEP_SCALE, WanAdapter
from vgrpo_rewards.moving_shapes.world import DEFAULT_FRAMES, DEFAULT_SIZE

from vgrpo_platform.network import CoreCalledAdapter
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import BuildContext, Conditioning, Samples

from . import WEIGHTS_DIR, Config


class MovingShapesAdapter(CoreCalledAdapter, FolderModelExport):
    """Wan 3D DiT (trained) + UMT5 text encoder (frozen) + byte-level tokenizer, in pixel space."""

    modality = "video"
    folder_placeholder = "<moving-shapes model folder>"
    lora_target_modules: Sequence[str] = WanAdapter.lora_target_modules  # diffusers' Wan LoRA layout

    def __init__(
        self,
        transformer: WanTransformer3DModel,
        text_encoder: UMT5EncoderModel,
        tokenizer: CLIPTokenizer,
        *,
        resolution: int = DEFAULT_SIZE,
        num_frames: int = DEFAULT_FRAMES,
        fps: float = 8.0,
        shift: float = 1.0,
        model_folder: str | Path | None = None,
    ) -> None:
        cfg = transformer.config
        if cfg.in_channels != 3 or (cfg.out_channels or cfg.in_channels) != 3:
            raise ValueError(
                "the moving_shapes adapter works in pixel space: the transformer needs 3 input and output "
                f"channels, got in_channels={cfg.in_channels}, out_channels={cfg.out_channels}"
            )
        pt, ph, pw = cfg.patch_size
        if resolution % ph or resolution % pw or num_frames % pt:
            raise ValueError(
                f"{num_frames} frames of {resolution} px do not split into the transformer's patches "
                f"{tuple(cfg.patch_size)}: choose a resolution divisible by {ph} and frames by {pt}"
            )
        self.denoiser = transformer
        self.text_encoder = text_encoder.requires_grad_(False).eval()  # frozen: conditioning has no grad
        self.tokenizer = tokenizer
        self.side, self.num_frames, self.fps = resolution, num_frames, float(fps)
        self.resolution = (resolution, resolution, num_frames)  # (height, width, frames): the export's note
        self.schedule = RectifiedFlowSchedule(shift)
        self.device = transformer.device
        self.dtype = transformer.dtype
        self.max_prompt_tokens = int(tokenizer.model_max_length)
        self.model_folder = model_folder  # where it was loaded from: the export's base model

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        resolution: int = DEFAULT_SIZE,
        num_frames: int = DEFAULT_FRAMES,
        fps: float = 8.0,
        shift: float = 1.0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        allow_pickle_weights: bool = False,
    ) -> MovingShapesAdapter:
        """Load a folder with ``transformer/``, ``text_encoder/``, ``tokenizer/`` (``from_pretrained``);
        safetensors only unless ``allow_pickle_weights`` (``vgrpo_adapters._weights``)."""
        path = Path(path)
        transformer, text_encoder, tokenizer = load_model_folder(
            path,
            WanTransformer3DModel,
            UMT5EncoderModel,
            dtype=dtype or torch.float32,
            allow_pickle=allow_pickle_weights,
            fix="point adapter.options.model_path at a folder written by "
            "`vgrpo pretrain-moving-shapes --out DIR`",
        )
        return cls(
            transformer.to(device),
            text_encoder.to(device),
            tokenizer,
            resolution=resolution,
            num_frames=num_frames,
            fps=fps,
            shift=shift,
            model_folder=path,
        )

    def latent_shape(self) -> tuple[int, ...]:
        return (3, self.num_frames, self.side, self.side)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, S, D]``: UMT5 states, zero past each prompt's end (as ``WanPipeline``)."""
        return self.encode_with_grad(prompts)

    def encode_with_grad(self, prompts: Sequence[str]) -> Conditioning:
        """``encode_prompts`` without its ``no_grad``: the text encoder trains in pretraining."""
        ids, mask = padded_tokens(self.tokenizer, prompts, self.max_prompt_tokens, self.device)
        states = self.text_encoder(input_ids=ids, attention_mask=mask)
        return {"prompt_embeds": states.last_hidden_state * mask.unsqueeze(-1).to(states.last_hidden_state)}

    def denoiser_inputs(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """The Wan transformer's inputs for clips ``z_t`` ``[B, 3, F, R, R]`` at ``t`` ``[B]`` in ``[0, 1]``;
        its output is the velocity ``v ~ eps - x0``."""
        return {
            "hidden_states": z_t.to(self.dtype),
            "timestep": t * TIMESTEP_SCALE,
            "encoder_hidden_states": cond["prompt_embeds"].to(self.dtype),
            "return_dict": False,
        }

    def decode(self, latents: torch.Tensor) -> Samples:
        """``[B, 3, F, R, R]`` in ``[-1, 1]`` -> clips ``[B, F, 3, R, R]`` in ``[0, 1]`` (float32)."""
        clips = ((latents.float() + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4)
        return Samples("video", clips, fps=self.fps)

    # ------------------------------------------------------------------------------------ export
    @property
    def pipeline_class(self) -> type:
        """Only the LoRA saver (``save_lora_weights`` is a classmethod): Wan's layout; nothing is built."""
        from diffusers import WanPipeline

        return WanPipeline


def load_moving_shapes_adapter(config: Config, context: BuildContext) -> MovingShapesAdapter:
    """The factory's work: resolve ``model_path`` (relative to the recipe's folder; unset: the shipped
    model) and load it."""
    return MovingShapesAdapter.load(
        resolve_model_path(config.model_path, context) or WEIGHTS_DIR,
        resolution=config.resolution,
        num_frames=config.num_frames,
        fps=config.fps,
        shift=config.shift,
        device=context.device,
        dtype=context.dtype,
        allow_pickle_weights=config.allow_pickle_weights,
    )
