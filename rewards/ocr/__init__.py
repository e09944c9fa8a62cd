"""Entry module of the ``ocr`` reward: options and registration only, no OCR engine at import time.

Text rendering as in Flow-GRPO's OCR reward: the prompt names the text to draw in double quotes
(``a sign that says "open late"``); the score is ``1 - d / len(target)`` where ``d`` is the Levenshtein
distance between the target and the recognised text (spaces removed, lower-cased), 0 when the target
occurs in the recognised text, capped at ``len(target)``. Engine: Tesseract through pytesseract
(Debian package ``tesseract-ocr``), fully offline.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import PluginConfig


class Config(PluginConfig):
    lang: str = Field("eng", description="Tesseract language pack(s), e.g. 'eng' or 'eng+deu'.")
    psm: int = Field(
        11, ge=0, le=13, description="Tesseract page segmentation mode (11 = sparse text, any layout)."
    )
    text_key: str = Field(
        "text",
        description="Metadata key holding the target text; when absent, the prompt's first quoted text.",
    )
    workers: int = Field(
        4, ge=1, description="Images recognised in parallel (tesseract runs as a subprocess)."
    )


def build(config: Config, context: Any) -> Any:
    from .impl import OcrReward

    return OcrReward(config)


@hookimpl
def register_rewards(register):  # noqa: ANN001
    register(
        "ocr", build, Config, summary="1 - normalised edit distance of OCR'd text to the quoted prompt text."
    )
