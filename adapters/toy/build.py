"""Write a tiny, randomly initialised text-to-image flow model in the diffusers folder layout.

The toy model is made of real library classes at toy size, so the adapter exercises the same
``from_pretrained`` loading path as a real checkpoint:

- ``transformer/``: ``diffusers.SD3Transformer2DModel`` working directly in pixel space (3 channels,
  patch 2 by default). SD3's MMDiT patchifies ``[B, C, H, W]`` itself and needs no position ids, so the
  adapter has no packing code (FLUX needs both); on 2 CPU cores both run a batch of 8 in ~6 ms.
- ``text_encoder/``: ``transformers.CLIPTextModelWithProjection`` (hidden states for joint attention,
  projected EOS state for the pooled vector, as in SD3).
- ``tokenizer/``: a ``CLIPTokenizer`` whose vocabulary is the 256 byte-level symbols (alone and
  word-final) with no merges: every string tokenizes offline, one token per character.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import SD3Transformer2DModel
from tokenizers import pre_tokenizers
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

BUILD_FILE = "toy_build.json"
"""Written last into a built folder: the build arguments, and a marker that the folder is complete."""

BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def byte_level_tokenizer(max_prompt_tokens: int = 32, words: Sequence[str] = ()) -> CLIPTokenizer:
    """A character-level CLIP tokenizer built in memory (no download, no vocab file needed).

    ``words`` (lower-case ASCII) become single tokens through ordinary BPE merges, so a closed
    vocabulary (the shapes world's) costs one token per word; any other text still falls back to one
    token per character. Longer words take the lower merge ranks: a prefix merge of a short word
    ("re" of "red") must not pre-empt a longer word's chain ("green").
    """
    vocab = {BOS: 0, EOS: 1}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 symbols CLIP maps bytes to
    for symbol in alphabet:
        vocab[symbol] = len(vocab)
    for symbol in alphabet:
        vocab[symbol + "</w>"] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in sorted(set(words), key=lambda w: (-len(w), w)):
        symbols = [*word[:-1], word[-1] + "</w>"]  # CLIP marks a word's last symbol
        merged = symbols[0]
        for symbol in symbols[1:]:
            if (merged, symbol) not in merges:
                merges.append((merged, symbol))
            merged += symbol
            vocab.setdefault(merged, len(vocab))
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=EOS,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=max_prompt_tokens,
    )


def tiny_clip_text_encoder(
    tokenizer: CLIPTokenizer, text_dim: int, text_layers: int, text_heads: int, max_prompt_tokens: int
) -> CLIPTextModelWithProjection:
    """A randomly initialised CLIP text encoder for ``tokenizer`` (the global RNG draws its weights);
    the ``tones`` model uses it too."""
    return CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=text_dim,
            intermediate_size=2 * text_dim,
            projection_dim=text_dim,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            max_position_embeddings=max_prompt_tokens,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,  # != 2: CLIP pools at the first EOS
            pad_token_id=tokenizer.pad_token_id,
        )
    )


def build_toy_model(
    folder: str | Path,
    seed: int = 0,
    resolution: int = 16,
    num_layers: int = 1,
    num_heads: int = 2,
    head_dim: int = 16,
    text_dim: int = 32,
    max_prompt_tokens: int = 32,
    patch_size: int = 2,
    text_layers: int = 1,
    text_heads: int = 2,
    words: Sequence[str] = (),
) -> Path:
    """Write ``transformer/``, ``text_encoder/``, ``tokenizer/`` under ``folder``; returns the folder.

    Deterministic: the same arguments give the same weights (CPU init under ``torch.manual_seed``).
    ``patch_size``, ``text_layers``, ``text_heads`` and ``words`` (whole-word tokens, see
    ``byte_level_tokenizer``) are recorded in the build marker only when they differ from their
    defaults, so folders built before they existed still count as built.
    """
    if resolution % patch_size:
        raise ValueError(f"resolution must be a multiple of the patch size {patch_size}, got {resolution}")
    folder = Path(folder)
    args: dict[str, Any] = dict(
        seed=seed,
        resolution=resolution,
        num_layers=num_layers,
        num_heads=num_heads,
        head_dim=head_dim,
        text_dim=text_dim,
        max_prompt_tokens=max_prompt_tokens,
    )
    extra = dict(
        patch_size=patch_size, text_layers=text_layers, text_heads=text_heads, words=sorted(set(words))
    )
    defaults = dict(patch_size=2, text_layers=1, text_heads=2, words=[])
    args.update({k: v for k, v in extra.items() if v != defaults[k]})
    tokenizer = byte_level_tokenizer(max_prompt_tokens, words)
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        text_encoder = tiny_clip_text_encoder(tokenizer, text_dim, text_layers, text_heads, max_prompt_tokens)
        transformer = SD3Transformer2DModel(
            sample_size=resolution,
            patch_size=patch_size,
            in_channels=3,
            out_channels=3,
            num_layers=num_layers,
            attention_head_dim=head_dim,
            num_attention_heads=num_heads,
            joint_attention_dim=text_dim,
            caption_projection_dim=num_heads * head_dim,  # the MMDiT width
            pooled_projection_dim=text_dim,
            pos_embed_max_size=resolution // patch_size,
        )
    transformer.save_pretrained(folder / "transformer")
    text_encoder.save_pretrained(folder / "text_encoder")
    tokenizer.save_pretrained(folder / "tokenizer")
    (folder / BUILD_FILE).write_text(json.dumps(args, sort_keys=True))
    return folder


def is_built(folder: str | Path, **args: Any) -> bool:
    """Whether ``folder`` holds a complete build made with exactly these ``build_toy_model`` args."""
    marker = Path(folder) / BUILD_FILE
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()) == args
    except json.JSONDecodeError:
        return False
