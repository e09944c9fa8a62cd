"""Entry module of the ``ocr`` reward: options and registration only, no OCR engine at import time.

Text rendering as in Flow-GRPO's OCR reward: the prompt names the text to draw in double quotes
(``a sign that says "open late"``); the score is ``1 - d / len(target)`` where ``d`` is the Levenshtein
distance between the target and the recognised text (spaces removed, lower-cased), 0 when the target
occurs in the recognised text, capped at ``len(target)``. The rule is the same whatever the engine.
Engines, both fully offline: RapidOCR (``rapidocr-onnxruntime``, PP-OCR's ONNX models shipped inside the
wheel, the PaddleOCR family Flow-GRPO uses; the default, a dependency of vgrpo) or Tesseract through
pytesseract (needs the system package ``tesseract-ocr``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig


class Config(PluginConfig):
    engine: Literal["rapidocr", "tesseract"] = Field(
        "rapidocr",
        description="OCR engine: 'rapidocr' (PP-OCR models in the rapidocr-onnxruntime wheel) or "
        "'tesseract' (needs the tesseract-ocr system package).",
    )
    lang: str = Field("eng", description="Tesseract language pack(s), e.g. 'eng+deu' (tesseract only).")
    psm: int = Field(
        11,
        ge=0,
        le=13,
        description="Tesseract page segmentation mode (11 = sparse text, any layout; tesseract only).",
    )
    text_key: str = Field(
        "text",
        description="Metadata key holding the target text; when absent, the prompt's first quoted text.",
    )
    workers: int = Field(
        4,
        ge=1,
        description="Images recognised in parallel (tesseract: subprocesses; rapidocr: one ONNX Runtime "
        "engine each, sharing the CPU cores).",
    )


def build(config: Config, context: Any) -> Any:
    from .impl import OcrReward

    return OcrReward(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "ocr",
            build,
            Config,
            summary="1 - normalised edit distance of OCR'd text to the quoted prompt text.",
        ),
    ]
