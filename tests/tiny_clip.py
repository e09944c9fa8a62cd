"""Builders of tiny, randomly initialised reward models of the real classes, saved the way the real
weights are shipped (so the rewards load them through their real loading code), and inputs with known
content (rendered text), for the tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'\"-"


def save_clip(folder: Path, *, image_size: int = 32, projection_dim: int = 16, seed: int = 0) -> Path:
    """A ``CLIPModel`` + ``CLIPProcessor`` (character-level BPE vocabulary) saved in ``folder``."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(CHARS)}
    vocab |= {c + "</w>": len(CHARS) + i for i, c in enumerate(CHARS)}
    bos, eos = len(vocab), len(vocab) + 1
    vocab |= {"<|startoftext|>": bos, "<|endoftext|>": eos}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=eos,
        ),
        vision_config=dict(
            image_size=image_size,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=projection_dim,
    )
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(folder)
    return folder


def save_aesthetic_head(path: Path, in_dim: int, seed: int = 0) -> Path:
    """A random head with the LAION predictor's layout (``layers.{0,2,4,6,7}``), saved as a state dict."""
    from vgrpo_rewards.aesthetic.impl import MLPHead

    torch.manual_seed(seed)
    head = MLPHead(in_dim)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(head.state_dict(), path)
    else:
        torch.save(head.state_dict(), path)
    return path


TINY_OPEN_CLIP = "vgrpo-tiny-ViT"


def save_open_clip_hps(folder: Path, seed: int = 0) -> Path:
    """A tiny open_clip architecture registered as ``TINY_OPEN_CLIP`` and an HPS-style checkpoint
    (``{"state_dict": ...}``) of it at ``folder / "HPS_v2.1_compressed.pt"``."""
    import open_clip

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (folder / f"{TINY_OPEN_CLIP}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder / f"{TINY_OPEN_CLIP}.json")
    torch.manual_seed(seed)
    model = open_clip.create_model(TINY_OPEN_CLIP)
    torch.save({"state_dict": model.state_dict()}, folder / "HPS_v2.1_compressed.pt")
    return folder


def imagereward_checkpoint(
    *,
    width: int = 32,
    depth: int = 1,
    patch: int = 8,
    image_size: int = 32,
    text_hidden: int = 32,
    text_layers: int = 1,
    vocab: int = 40,
    max_pos: int = 40,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A random state dict with the *original* ``ImageReward.pt`` key layout: BLIP's timm-style ViT
    (``blip.visual_encoder``), its BERT text encoder with cross-attention (``blip.text_encoder``, med.py
    names), the contrastive projections, and the MLP head (``mlp.layers``)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    def ln(prefix: str, dim: int) -> dict[str, torch.Tensor]:
        return {f"{prefix}.weight": 1 + r(dim), f"{prefix}.bias": r(dim)}

    def lin(prefix: str, out_dim: int, in_dim: int) -> dict[str, torch.Tensor]:
        return {f"{prefix}.weight": r(out_dim, in_dim), f"{prefix}.bias": r(out_dim)}

    v, n = "blip.visual_encoder", (image_size // patch) ** 2
    sd = {f"{v}.cls_token": r(1, 1, width), f"{v}.pos_embed": r(1, n + 1, width)}
    sd |= {f"{v}.patch_embed.proj.weight": r(width, 3, patch, patch), f"{v}.patch_embed.proj.bias": r(width)}
    for i in range(depth):
        b = f"{v}.blocks.{i}"
        sd |= (
            ln(f"{b}.norm1", width)
            | lin(f"{b}.attn.qkv", 3 * width, width)
            | lin(f"{b}.attn.proj", width, width)
        )
        sd |= (
            ln(f"{b}.norm2", width)
            | lin(f"{b}.mlp.fc1", 4 * width, width)
            | lin(f"{b}.mlp.fc2", width, 4 * width)
        )
    sd |= ln(f"{v}.norm", width)
    t, h = "blip.text_encoder", text_hidden
    sd |= {
        f"{t}.embeddings.word_embeddings.weight": r(vocab, h),
        f"{t}.embeddings.position_embeddings.weight": r(max_pos, h),
        f"{t}.embeddings.position_ids": torch.arange(max_pos).unsqueeze(0),
    }
    sd |= ln(f"{t}.embeddings.LayerNorm", h)
    for i in range(text_layers):
        b = f"{t}.encoder.layer.{i}"
        for att, kv_in in (("attention", h), ("crossattention", width)):
            sd |= lin(f"{b}.{att}.self.query", h, h) | lin(f"{b}.{att}.self.key", h, kv_in)
            sd |= lin(f"{b}.{att}.self.value", h, kv_in) | lin(f"{b}.{att}.output.dense", h, h)
            sd |= ln(f"{b}.{att}.output.LayerNorm", h)
        sd |= lin(f"{b}.intermediate.dense", 4 * h, h) | lin(f"{b}.output.dense", h, 4 * h)
        sd |= ln(f"{b}.output.LayerNorm", h)
    sd |= lin("blip.vision_proj", 256, width) | lin("blip.text_proj", 256, h)
    for idx, (o, i) in zip(
        (0, 2, 4, 6, 7), ((1024, h), (128, 1024), (64, 128), (16, 64), (1, 16)), strict=True
    ):
        sd |= lin(f"mlp.layers.{idx}", o, i)
    return sd


def save_imagereward(folder: Path, **sizes: int) -> Path:
    """``ImageReward.pt``, ``med_config.json`` (a BERT config) and a BERT tokenizer in ``folder``."""
    from transformers import BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", "red", "cat", "dog"]
    sd = imagereward_checkpoint(vocab=len(words) + 2, **sizes)  # + [DEC], [ENC] as BLIP adds them
    torch.save(sd, folder / "ImageReward.pt")
    h = sd["blip.text_encoder.embeddings.word_embeddings.weight"].shape[1]
    med = {
        "architectures": ["BertModel"],
        "hidden_size": int(h),
        "num_hidden_layers": sizes.get("text_layers", 1),
        "num_attention_heads": 2,
        "intermediate_size": 4 * int(h),
        "hidden_act": "gelu",
        "max_position_embeddings": int(
            sd["blip.text_encoder.embeddings.position_embeddings.weight"].shape[0]
        ),
        "layer_norm_eps": 1e-12,
        "vocab_size": len(words) + 2,
        "pad_token_id": 0,
        "add_cross_attention": True,
        "encoder_width": 768,
    }
    (folder / "med_config.json").write_text(json.dumps(med))
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder / "tokenizer")
    return folder


def save_clap(folder: Path) -> Path:
    """A random ``ClapModel`` + ``ClapProcessor`` (byte-level Roberta tokenizer, a small 16 kHz feature
    extractor) saved in ``folder``."""
    from transformers import (
        ClapAudioConfig,
        ClapConfig,
        ClapFeatureExtractor,
        ClapModel,
        ClapProcessor,
        ClapTextConfig,
        RobertaTokenizer,
    )

    folder.mkdir(parents=True, exist_ok=True)
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = [chr(b) for b in printable] + [
        chr(256 + i) for i in range(256 - len(printable))
    ]  # GPT-2 byte map
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", *chars, "<mask>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = RobertaTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    extractor = ClapFeatureExtractor(
        feature_size=16,
        sampling_rate=16000,
        hop_length=160,
        max_length_s=1,
        fft_window_size=256,
        truncation="rand_trunc",
    )
    torch.manual_seed(0)
    model = ClapModel(
        ClapConfig(
            text_config=ClapTextConfig(
                vocab_size=len(vocab),
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=37,
                max_position_embeddings=64,
            ),
            audio_config=ClapAudioConfig(
                spec_size=64,
                num_mel_bins=16,
                patch_embeds_hidden_size=8,
                depths=[1, 1],
                num_attention_heads=[2, 2],
                window_size=4,
                hidden_size=16,
                patch_stride=(4, 4),
                enable_fusion=False,
            ),
            projection_dim=8,
        )
    )
    model.save_pretrained(folder)
    ClapProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def render_text(text: str) -> np.ndarray:
    """``[96, 256, 3]`` uint8: ``text`` in black on white, large enough for the OCR engines to read."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (256, 96), "white")
    ImageDraw.Draw(image).text((12, 30), text, fill="black", font=ImageFont.load_default(size=28))
    return np.asarray(image)
