"""Write a tiny, randomly initialised text-to-video flow model of the moving-shapes world.

Real library classes at toy size, so the adapter loads it through ``from_pretrained`` like a checkpoint:

- ``transformer/``: ``diffusers.WanTransformer3DModel`` (the ``wan`` adapter's denoiser) in pixel space:
  3 channels in and out, patch ``(1, 4, 4)``: 8 x 8 tokens a frame at 32 px, one token row per frame;
- ``text_encoder/``: ``transformers.UMT5EncoderModel``, the class Wan's pipelines use (per-token states
  for cross-attention, zero past the prompt's end as ``WanPipeline`` pads them);
- ``tokenizer/``: the ``toy`` adapter's byte-level ``CLIPTokenizer`` with the world's words as whole tokens.
  Wan's own tokenizer (T5's SentencePiece) needs a trained vocabulary file, which a test cannot build
  offline; the encoder only sees token ids, so any tokenizer that ``from_pretrained`` loads serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel
from transformers import UMT5Config, UMT5EncoderModel
from vgrpo_adapters.toy.build import byte_level_tokenizer
from vgrpo_rewards.moving_shapes.world import COLORS, DEFAULT_FRAMES, DEFAULT_SIZE, MOTIONS, SHAPES


def world_words() -> list[str]:
    """Every word the world's prompts use: each becomes one token of the tokenizer."""
    words = {"a", "while", *COLORS, *SHAPES}
    words |= {w for phrase in MOTIONS.values() for w in phrase.split()}
    return sorted(words)


@dataclass(frozen=True)
class ModelSize:
    """Architecture of the moving-shapes model (the ``build_moving_shapes_model`` knobs)."""

    resolution: int = DEFAULT_SIZE
    num_frames: int = DEFAULT_FRAMES  # motion is the change over them
    patch_size: tuple[int, int, int] = (1, 4, 4)  # (frames, height, width) per token: 256 tokens a clip
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 24  # Wan's 3D RoPE splits it 8 (frames) / 8 / 8
    ffn_dim: int = 192
    freq_dim: int = 64  # the timestep's sinusoidal embedding
    text_dim: int = 64
    text_layers: int = 2
    text_heads: int = 4
    max_prompt_tokens: int = 16  # the longest prompt is 11 words + BOS + EOS

    def __post_init__(self) -> None:
        """A clip must split into whole tokens: refused here, before any weights or folder are made."""
        pt, ph, pw = self.patch_size
        if self.resolution % ph or self.resolution % pw or self.num_frames % pt:
            raise ValueError(
                f"{self.num_frames} frames of {self.resolution} px do not split into patches "
                f"{self.patch_size}"
            )


def build_moving_shapes_model(folder: str | Path, size: ModelSize = ModelSize(), seed: int = 0) -> Path:
    """Write ``transformer/``, ``text_encoder/``, ``tokenizer/`` under ``folder``; returns the folder.

    Deterministic: the same size and seed give the same weights (CPU init under ``torch.manual_seed``,
    the caller's global RNG left untouched)."""
    folder = Path(folder)
    tokenizer = byte_level_tokenizer(size.max_prompt_tokens, world_words())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=len(tokenizer),
                d_model=size.text_dim,
                d_kv=size.text_dim // size.text_heads,
                d_ff=2 * size.text_dim,
                num_layers=size.text_layers,
                num_heads=size.text_heads,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=size.max_prompt_tokens,
                dropout_rate=0.0,
                feed_forward_proj="gated-gelu",
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.pad_token_id,
            )
        )
        transformer = WanTransformer3DModel(
            patch_size=size.patch_size,
            num_attention_heads=size.num_heads,
            attention_head_dim=size.head_dim,
            in_channels=3,
            out_channels=3,
            text_dim=size.text_dim,
            freq_dim=size.freq_dim,
            ffn_dim=size.ffn_dim,
            num_layers=size.num_layers,
            rope_max_seq_len=max(64, size.num_frames, size.resolution),
        )
    transformer.save_pretrained(folder / "transformer")
    text_encoder.save_pretrained(folder / "text_encoder")
    tokenizer.save_pretrained(folder / "tokenizer")
    return folder
