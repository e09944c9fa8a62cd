"""Entry module of the ``geneval`` reward: options and registration only, no torch at import time.

GenEval (Ghosh et al. 2023, "GenEval: An Object-Focused Framework for Evaluating Text-to-Image
Alignment") checks each image against its prompt's object list: presence, count, colour, relative position
and colour attribution, with a detector and a CLIP colour classifier. The object list travels as the
prompt's metadata (a JSONL prompt set; ``python -m vgrpo_rewards.geneval.make_prompts`` writes GenEval's).
The rules are in ``rules.py``, the detectors in ``detectors.py``, the colour classifiers in ``colors.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component

from .._options import ModelRewardConfig

DEFAULT_MODELS = {
    "mask2former": "facebook/mask2former-swin-small-coco-instance",
    "owlv2": "google/owlv2-base-patch16-ensemble",
    "owlvit": "google/owlvit-base-patch32",
}
# (threshold, counting_threshold, max_overlap) when the options leave them null: GenEval's own for
# Mask2Former; for the open-vocabulary detectors an uncalibrated starting point (their sigmoid scores run
# lower, and they repeat boxes, hence non-maximum suppression at IoU 0.5)
DETECTOR_DEFAULTS = {"mask2former": (0.3, 0.9, 1.0), "owlv2": (0.1, 0.1, 0.5), "owlvit": (0.1, 0.1, 0.5)}


class Config(ModelRewardConfig):
    """Options of ``[rewards.options]`` for ``name = "geneval"``."""

    modalities: ClassVar[frozenset[str]] = frozenset({"image"})

    detector: Literal["mask2former", "owlv2", "owlvit"] = Field(
        "mask2former",
        description="'mask2former': GenEval's detector (COCO instance segmentation); 'owlv2' / 'owlvit': "
        "open-vocabulary detectors queried with the prompt's class names.",
    )
    model: str | None = Field(
        None,
        description="Hub id or local folder of the detector; null = facebook/mask2former-swin-small-coco-"
        "instance, google/owlv2-base-patch16-ensemble or google/owlvit-base-patch32.",
    )
    objective: Literal["strict", "graded"] = Field(
        "strict",
        description="'strict': GenEval's 1/0 per image; 'graded': Flow-GRPO's partial credit in [0, 1] "
        "(count, colour and position terms averaged).",
    )
    color: Literal["clip", "pixels"] = Field(
        "clip",
        description="Colour classifier: 'clip' (GenEval's CLIP zero-shot rule) or 'pixels' (the nearest "
        "of ten sRGB anchors to the object's median pixel: no weights, exact only on flat colours).",
    )
    clip_model: str = Field(
        "openai/clip-vit-large-patch14", description="Hub id or folder of the CLIPModel for color = 'clip'."
    )
    clip_processor: str | None = Field(None, description="Its processor; null = the CLIP model's own.")
    threshold: float | None = Field(
        None, ge=0, lt=1, description="Detection confidence kept; null = 0.3 (Mask2Former), 0.1 (OWL)."
    )
    counting_threshold: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="The confidence kept for prompts tagged 'counting'; null = 0.9 (Mask2Former), 0.1 (OWL).",
    )
    max_objects: int = Field(16, ge=1, description="Most detections kept per class (GenEval: 16).")
    max_overlap: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Non-maximum suppression IoU (1 = off); null = 1.0 (Mask2Former, as GenEval), 0.5 (OWL).",
    )
    position_margin: float = Field(
        0.1, ge=0, lt=0.5, description="Share of the two boxes' sizes an offset must exceed (GenEval: 0.1)."
    )

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        """Null thresholds, overlap limit and model become the chosen detector's defaults."""
        if not isinstance(data, dict):
            return data
        detector = data.get("detector", "mask2former")
        if detector not in DETECTOR_DEFAULTS:
            return data  # the field's own check names the choices
        filled = dict(data)
        for key, value in zip(
            ("threshold", "counting_threshold", "max_overlap"), DETECTOR_DEFAULTS[detector], strict=True
        ):
            if filled.get(key) is None:
                filled[key] = value
        if filled.get("model") is None:
            filled["model"] = DEFAULT_MODELS[detector]
        return filled


def build(config: Config, context: Any) -> Any:
    """Factory: the detector, CLIP and torch load only when a run builds the reward."""
    from .impl import GenEvalReward

    return GenEvalReward(config, context)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "geneval",
            build,
            Config,
            summary="GenEval: objects, counts, colours, positions from the prompt's metadata (a detector).",
        ),
    ]
