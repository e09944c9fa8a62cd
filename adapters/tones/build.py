"""Write a tiny, randomly initialised tones model in the diffusers folder layout.

Real library classes at toy size, loaded back with ``from_pretrained`` like any checkpoint:

- ``transformer/``: ``diffusers.LongCatAudioDiTTransformer``, the class of the ``longcat_audio``
  adapter's pipeline, over the spectrogram latents (``latent_dim`` = the codec's frequency bins, one
  token per 8 ms frame). Its text ConvNeXt and latent condition (LongCat's audio-prompt input) are off:
  the world has no audio prompts, and the ConvNeXt would double the text path of a 5-word prompt.
- ``text_encoder/`` and ``tokenizer/``: the ``toy`` model's tiny CLIP text encoder and byte-level CLIP
  tokenizer with the world's words as whole tokens. Chosen over LongCat's UMT5 because a UMT5 tokenizer
  needs a trained SentencePiece model (a download or a training step of its own), while the byte-level
  CLIP tokenizer is built in memory and gives each of the world's 17 words one token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import LongCatAudioDiTTransformer
from vgrpo_adapters.toy.build import byte_level_tokenizer, tiny_clip_text_encoder

from .codec import BINS


@dataclass(frozen=True)
class ModelSize:
    """Architecture of a tones model (``LongCatAudioDiTTransformer`` and CLIP knobs)."""

    dit_dim: int = 128
    dit_depth: int = 4
    dit_heads: int = 4  # 32 channels a head
    ff_mult: float = 2.0
    text_dim: int = 64
    text_layers: int = 2
    text_heads: int = 2
    max_prompt_tokens: int = 12  # the longest prompt is 7 words + BOS + EOS


def build_tones_model(
    folder: str | Path, size: ModelSize = ModelSize(), seed: int = 0, words: tuple[str, ...] = ()
) -> Path:
    """Write ``transformer/``, ``text_encoder/``, ``tokenizer/`` under ``folder``; returns the folder.
    Deterministic: the same arguments give the same weights (CPU init under ``torch.manual_seed``)."""
    folder = Path(folder)
    tokenizer = byte_level_tokenizer(size.max_prompt_tokens, words)
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        text_encoder = tiny_clip_text_encoder(
            tokenizer, size.text_dim, size.text_layers, size.text_heads, size.max_prompt_tokens
        )
        transformer = LongCatAudioDiTTransformer(
            dit_dim=size.dit_dim,
            dit_depth=size.dit_depth,
            dit_heads=size.dit_heads,
            dit_text_dim=size.text_dim,
            latent_dim=BINS,
            ff_mult=size.ff_mult,
            text_conv=False,
            use_latent_condition=False,
        )
    transformer.save_pretrained(folder / "transformer")
    text_encoder.save_pretrained(folder / "text_encoder")
    tokenizer.save_pretrained(folder / "tokenizer")
    return folder
