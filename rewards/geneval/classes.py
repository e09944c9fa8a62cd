"""GenEval's vocabulary: its 80 object names (COCO's classes, three renamed so a prompt reads naturally),
its ten colours, its four relations, and the English helpers its prompt templates use.

No torch here: the prompt generator and the option checks import it.
"""

from __future__ import annotations

OBJECTS: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag",
    "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite", "baseball bat",
    "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle", "wine glass", "cup", "fork",
    "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange", "broccoli", "carrot", "hot dog",
    "pizza", "donut", "cake", "chair", "couch", "potted plant", "bed", "dining table", "toilet", "tv",
    "laptop", "computer mouse", "tv remote", "computer keyboard", "cell phone", "microwave", "oven",
    "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)  # fmt: skip
"""GenEval's object names in COCO's category order (its ``object_names.txt``)."""

COLORS: tuple[str, ...] = (
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
)
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
NUMBERS: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
)

# What detectors trained on COCO call the three objects GenEval renames (and a few other spellings of
# COCO's names that checkpoints ship in their id2label), mapped to GenEval's name.
ALIASES: dict[str, str] = {
    "mouse": "computer mouse",
    "remote": "tv remote",
    "keyboard": "computer keyboard",
    "tvmonitor": "tv",
    "tv monitor": "tv",
    "motorbike": "motorcycle",
    "aeroplane": "airplane",
    "sofa": "couch",
    "pottedplant": "potted plant",
    "diningtable": "dining table",
    "hair dryer": "hair drier",
    "doughnut": "donut",
    "cellphone": "cell phone",
    "mobile phone": "cell phone",
}


def canonical(label: str) -> str:
    """A detector's label as GenEval's object name (``"mouse"`` -> ``"computer mouse"``); other labels
    come back lower-cased with ``_``/``-`` as spaces, so an unknown class stays recognisable."""
    name = " ".join(label.replace("_", " ").replace("-", " ").lower().split())
    return ALIASES.get(name, name)


def with_article(name: str) -> str:
    """``"an apple"``, ``"a dog"``: GenEval's rule, a vowel letter takes ``an``."""
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def plural(name: str) -> str:
    """GenEval's plural rule, kept as it is so the prompts match its set: ``-es`` after a final ``s``
    (``"buses"``, ``"skises"``), else ``-s`` (``"knifes"``)."""
    return f"{name}es" if name.endswith("s") else f"{name}s"
