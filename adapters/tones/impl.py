"""The ``tones`` adapter: a tiny LongCat-AudioDiT transformer over spectrogram latents, CLIP text encoder.

Latents are the codec's log-magnitude spectrograms ``[BINS, FRAMES]`` (``codec.py`` says why); the
transformer takes them time-major ``[B, FRAMES, BINS]``, one token per frame. The network keeps
LongCat's convention, as the ``longcat_audio`` adapter reads it: it sees ``s = 1 - t`` and predicts
``x - eps``, so the core's velocity is ``v(z, t) = -net(z, 1 - t)``. ``decode`` runs Griffin-Lim to
``Samples`` audio ``[B, 1, 8000]`` at 8 kHz, which the ``tones`` reward scores.

Export: a LoRA as peft files (LongCat's pipeline has no LoRA loader, as for ``longcat_audio``); full
fine-tuning writes a whole model folder that ``adapter.options.model_path`` loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import LongCatAudioDiTTransformer
from transformers import CLIPTextModelWithProjection, CLIPTokenizer
from vgrpo_adapters._diffusers_export import TransformerExport, save_peft_lora
from vgrpo_adapters._tiny_models import load_model_folder, padded_tokens, resolve_model_path

from vgrpo_platform.errors import PluginError
from vgrpo_platform.network import CoreCalledAdapter
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule
from vgrpo_platform.protocols import BuildContext, Conditioning, Samples

from . import WEIGHTS_DIR, Config
from .codec import BINS, FRAMES, N_SAMPLES, SAMPLE_RATE, SpectrogramCodec


class TonesAdapter(CoreCalledAdapter, TransformerExport):
    """LongCat-AudioDiT DiT (trained) + CLIP text encoder (frozen) + byte-level CLIP tokenizer."""

    modality = "audio"
    lora_target_modules: Sequence[str] = ("to_q", "to_k", "to_v", "to_out.0")

    def __init__(
        self,
        transformer: LongCatAudioDiTTransformer,
        text_encoder: CLIPTextModelWithProjection,
        tokenizer: CLIPTokenizer,
        shift: float = 1.0,
        model_folder: str | Path | None = None,
    ) -> None:
        if transformer.config.latent_dim != BINS:
            raise PluginError(
                f"the tones adapter's latents have {BINS} frequency bins, but this transformer's latent_dim "
                f"is {transformer.config.latent_dim}; load a folder written by `vgrpo pretrain-tones`"
            )
        self.denoiser = transformer
        self.text_encoder = text_encoder.requires_grad_(False).eval()  # frozen: conditioning has no grad
        self.tokenizer = tokenizer
        self.codec = SpectrogramCodec()
        self.schedule = RectifiedFlowSchedule(shift)
        self.device = transformer.device
        self.dtype = transformer.dtype
        self.max_prompt_tokens = min(tokenizer.model_max_length, text_encoder.config.max_position_embeddings)
        self.model_folder = model_folder
        self.resolution = N_SAMPLES  # samples per clip, recorded by export_trained

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        shift: float = 1.0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        allow_pickle_weights: bool = False,
    ) -> TonesAdapter:
        """Load a folder with ``transformer/``, ``text_encoder/``, ``tokenizer/`` (``from_pretrained``);
        safetensors only unless ``allow_pickle_weights``."""
        path = Path(path)
        transformer, text_encoder, tokenizer = load_model_folder(
            path,
            LongCatAudioDiTTransformer,
            CLIPTextModelWithProjection,
            dtype=dtype or torch.float32,
            allow_pickle=allow_pickle_weights,
            fix="write one with `vgrpo pretrain-tones --out DIR` and point adapter.options.model_path at it",
        )
        return cls(transformer.to(device), text_encoder.to(device), tokenizer, shift=shift, model_folder=path)

    def latent_shape(self) -> tuple[int, ...]:
        return (BINS, FRAMES)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """``prompt_embeds`` ``[B, S, D]`` (CLIP's last hidden states) and ``prompt_mask`` ``[B, S]`` (the
        prompt's own tokens, BOS and EOS included: LongCat's cross-attention ignores the padding)."""
        return self.encode_with_grad(prompts)

    def encode_with_grad(self, prompts: Sequence[str]) -> Conditioning:
        """``encode_prompts`` without its ``no_grad``: the text encoder trains in pretraining."""
        ids, mask = padded_tokens(self.tokenizer, prompts, self.max_prompt_tokens, self.device)
        out = self.text_encoder(input_ids=ids, attention_mask=mask)
        return {"prompt_embeds": out.last_hidden_state, "prompt_mask": mask.bool()}

    def denoiser_inputs(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> dict[str, Any]:
        """LongCat's inputs: latents as ``[B, FRAMES, BINS]`` and reversed time ``1 - t``."""
        return {
            "hidden_states": z_t.to(self.device, self.dtype).transpose(1, 2),
            "encoder_hidden_states": cond["prompt_embeds"].to(self.device, self.dtype),
            "encoder_attention_mask": cond["prompt_mask"].to(self.device),
            "timestep": (1 - t.to(self.device)).to(self.dtype),
            "return_dict": False,
        }

    def denoiser_output(self, output: Any, z_t: torch.Tensor) -> torch.Tensor:
        """The core's velocity ``[B, BINS, FRAMES]`` from LongCat's reversed-time ``x - eps``."""
        return -output[0].transpose(1, 2)

    def decode(self, latents: torch.Tensor) -> Samples:
        """Latents ``[B, BINS, FRAMES]`` -> waveforms ``[B, 1, N_SAMPLES]`` in ``[-1, 1]`` at 8 kHz."""
        waves = self.codec.decode(latents.detach().float().cpu())  # [B, N_SAMPLES]
        return Samples("audio", waves.unsqueeze(1).to(latents.device), sample_rate=SAMPLE_RATE)

    # ------------------------------------------------------------------------------------ export
    def _base_model(self) -> str:
        return str(self.model_folder) if self.model_folder is not None else "<tones model folder>"

    def _save_lora(self, out: Path, base: str) -> str:
        return save_peft_lora(self.denoiser, out)

    def _save_full(self, out: Path) -> None:
        """A whole model folder, so ``adapter.options.model_path`` can point at the export."""
        self.denoiser.save_pretrained(out / "transformer")
        self.text_encoder.save_pretrained(out / "text_encoder")
        self.tokenizer.save_pretrained(out / "tokenizer")

    def _full_load_hint(self, folder: Path) -> str:
        return f"[adapter.options] model_path = '{folder.parent}' (or TonesAdapter.load('{folder.parent}'))"

    def _export_facts(self) -> dict[str, Any]:
        return {"samples": N_SAMPLES, "sample_rate": SAMPLE_RATE, "shift": self.schedule.shift}


def model_folder(config: Config, context: BuildContext | None = None) -> Path:
    """``config.model_path``, relative to the recipe's folder when relative, else the shipped model."""
    return resolve_model_path(config.model_path, context) or WEIGHTS_DIR


def load_tones_adapter(config: Config, context: BuildContext) -> TonesAdapter:
    """The factory's work: ``TonesAdapter.load`` on the resolved folder."""
    return TonesAdapter.load(
        model_folder(config, context),
        shift=config.shift,
        device=context.device,
        dtype=context.dtype,
        allow_pickle_weights=config.allow_pickle_weights,
    )
