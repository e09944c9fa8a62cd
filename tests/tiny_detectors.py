"""Tiny, randomly initialised detectors of the real transformers classes (Mask2Former, OWLv2), saved with
``save_pretrained`` the way hub checkpoints are, so ``geneval`` loads them through its real loading code;
and hand-drawn GenEval scenes whose right answers are known by construction."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from vgrpo_rewards.geneval.classes import OBJECTS
from vgrpo_rewards.geneval.rules import Detection

# COCO's own spellings, as a COCO checkpoint's id2label has them (geneval maps them to GenEval's names)
COCO_LABELS = [
    {"computer mouse": "mouse", "tv remote": "remote", "computer keyboard": "keyboard"}.get(n, n)
    for n in OBJECTS
]


def save_mask2former(folder: Path, seed: int = 0) -> Path:
    from transformers import (
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        Mask2FormerImageProcessor,
        SwinConfig,
    )

    backbone = SwinConfig(
        embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=4, image_size=64,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )  # fmt: skip
    config = Mask2FormerConfig(
        backbone_config=backbone, hidden_dim=32, mask_feature_size=32, feature_size=32, encoder_layers=1,
        decoder_layers=2, num_queries=12, num_attention_heads=2, dim_feedforward=32,
        encoder_feedforward_dim=32,
        common_stride=4, num_labels=80, id2label=dict(enumerate(COCO_LABELS)),
        label2id={n: i for i, n in enumerate(COCO_LABELS)},
    )  # fmt: skip
    torch.manual_seed(seed)
    Mask2FormerForUniversalSegmentation(config).save_pretrained(folder)
    Mask2FormerImageProcessor(
        size={"shortest_edge": 64, "longest_edge": 96}, size_divisor=32
    ).save_pretrained(folder)
    return folder


def save_owlv2(folder: Path, seed: int = 0) -> Path:
    """An ``Owlv2ForObjectDetection`` + ``Owlv2Processor`` (the tiny CLIP's character-level tokenizer)."""
    from tiny_clip import save_clip
    from transformers import (
        CLIPTokenizer,
        Owlv2Config,
        Owlv2ForObjectDetection,
        Owlv2ImageProcessor,
        Owlv2Processor,
    )

    save_clip(folder / "clip")
    tokenizer = CLIPTokenizer.from_pretrained(folder / "clip")
    Owlv2Processor(
        image_processor=Owlv2ImageProcessor(size={"height": 64, "width": 64}), tokenizer=tokenizer
    ).save_pretrained(folder)
    config = Owlv2Config(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                           image_size=64, patch_size=16),
        projection_dim=32,
    )  # fmt: skip
    torch.manual_seed(seed)
    Owlv2ForObjectDetection(config).save_pretrained(folder)
    return folder


@dataclass(frozen=True)
class Thing:
    """One drawn object: GenEval class, fill colour, pixel box, the confidence the oracle reports."""

    cls: str
    rgb: tuple[int, int, int]
    box: tuple[int, int, int, int]
    score: float = 0.95
    shape: str = "ellipse"


def draw(things: Sequence[Thing], size: int = 96) -> tuple[np.ndarray, list[Detection]]:
    """A grey canvas with the things drawn, and the detections a perfect detector would report (masks
    are the drawn pixels)."""
    canvas = Image.new("RGB", (size, size), (153, 153, 153))
    pen = ImageDraw.Draw(canvas)
    dets = []
    for t in things:
        layer = Image.new("L", (size, size), 0)
        x0, y0, x1, y1 = t.box
        getattr(ImageDraw.Draw(layer), t.shape)((x0, y0, x1 - 1, y1 - 1), fill=255)
        getattr(pen, t.shape)((x0, y0, x1 - 1, y1 - 1), fill=t.rgb)
        dets.append(
            Detection(t.cls, t.score, (float(x0), float(y0), float(x1), float(y1)), np.asarray(layer) > 0)
        )
    return np.array(canvas), dets


def key(image: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()


class OracleDetector:
    """A test double behind ``geneval``'s detector interface: it knows what was drawn in each image (by
    the image's bytes) and reports it, above ``floor`` as a real detector does."""

    def __init__(self) -> None:
        self.scenes: dict[str, list[Detection]] = {}
        self.asked: list[list[str]] = []

    def add(self, image: np.ndarray, dets: list[Detection]) -> None:
        self.scenes[key(image)] = dets

    def detect(self, images: np.ndarray, classes: Sequence[str], floor: float) -> list[list[Detection]]:
        self.asked.append(list(classes))
        return [[d for d in self.scenes.get(key(im), []) if d.score >= floor] for im in images]
