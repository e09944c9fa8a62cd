"""Conditioned prompts: a prompt's text with what its JSONL line says besides (metadata, condition images).

A ``.jsonl`` prompt line is ``{"prompt": str, ...}``. Every other field becomes the prompt's
``metadata``, handed to rewards as ``metadata[i]`` for each of its samples (GenEval's ``tag``,
``include``, ...). The field ``"image"`` (a path relative to the JSONL file's folder, or a list of
them for multi-image editing) is the prompt's condition image: an editing or image-to-video adapter
encodes it with the text, and rewards receive it as ``metadata[i]["condition_image"]`` (``[3, H, W]``
in ``[0, 1]``; ``"condition_images"`` lists every one; ``"image"`` becomes the absolute path).

Why a ``str`` subclass: a ``Prompt`` *is* its text, so every path that carries prompts (the prompt
sampler and its resumable state, group layouts, reward workers in other processes, logs) keeps
working unchanged, and the condition rides along to where it is used: ``encode_conditioned`` (the
core's one call of an adapter's encoder) and ``reward_metadata`` (what rewards receive).

Adapter contract: an adapter that takes a condition image sets ``takes_condition_image = True`` and
adds ``encode_conditions(prompts, images) -> Conditioning`` (``images[i]``: prompt ``i``'s list of
``[3, H, W]`` tensors in ``[0, 1]``); its ``encode_prompts`` may refuse. Every other adapter is
untouched, and refuses a prompt set with images through the core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vgrpo_platform.errors import RecipeError

if TYPE_CHECKING:  # plugins' entry modules import this file: torch stays out of import time
    import torch

    from vgrpo_platform.protocols import Conditioning

EDITING_HINT = "use an editing adapter such as flux_kontext"
IMAGE_FIELD = "image"


class Prompt(str):
    """A prompt's text, carrying its JSONL line's ``metadata`` and its condition image paths.

    Equal to (and hashed as) its text; pickles with its fields (reward workers in other processes).
    """

    metadata: dict[str, Any]
    images: tuple[Path, ...]

    def __new__(
        cls, text: str, metadata: Mapping[str, Any] | None = None, images: Sequence[Path] = ()
    ) -> Prompt:
        self = super().__new__(cls, text)
        self.metadata = dict(metadata or {})
        self.images = tuple(Path(p) for p in images)
        return self

    def __repr__(self) -> str:
        return str.__repr__(self) if not self.images else f"{str.__repr__(self)} (+{len(self.images)} image)"


def prompt_from_line(obj: Mapping[str, Any], folder: Path, where: str) -> Prompt:
    """The ``Prompt`` of one parsed JSONL line (``where`` = ``file:line`` for errors); image paths are
    resolved against ``folder`` and must exist."""
    metadata = {k: v for k, v in obj.items() if k != "prompt"}
    raw = metadata.get(IMAGE_FIELD)
    if raw is None:
        return Prompt(obj["prompt"], metadata)
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise RecipeError(
            f'{where}: "image" must be a path or a non-empty list of paths, e.g. "image": "cat.png"'
        )
    paths = [Path(n) if Path(n).is_absolute() else folder / n for n in names]
    for path in paths:
        if not path.is_file():
            raise RecipeError(
                f"{where}: condition image '{path}' not found (paths are relative to the prompt file's "
                "folder); fix the path or add the image"
            )
    return Prompt(obj["prompt"], metadata, paths)


def with_images(texts: Sequence[str], images: Sequence[Path]) -> list[str]:
    """``vgrpo sample --prompt ... --image ...``: each text with its image (one per text, or one for all),
    as ``Prompt`` s; the texts alone without images."""
    if not images:
        return list(texts)
    if not texts or len(images) not in (1, len(texts)):
        raise RecipeError(
            f"--image: {len(images)} image(s) for {len(texts)} --prompt(s); give one --image per --prompt, "
            "or one for all"
        )
    for path in images:
        if not Path(path).is_file():
            raise RecipeError(f"--image '{path}' not found; give the path of a PNG or JPEG file")
    paths = list(images) * len(texts) if len(images) == 1 else list(images)
    return [Prompt(t, {IMAGE_FIELD: str(p)}, [Path(p)]) for t, p in zip(texts, paths, strict=True)]


def images_of(prompt: str) -> tuple[Path, ...]:
    """The condition image paths of ``prompt`` (none for a plain string)."""
    return prompt.images if isinstance(prompt, Prompt) else ()


def has_condition(prompts: Sequence[str]) -> bool:
    """Whether any prompt carries a condition image."""
    return any(images_of(p) for p in prompts)


def load_image(path: Path) -> torch.Tensor:
    """``[3, H, W]`` float in ``[0, 1]`` (RGB) from an image file; a one-line error when unreadable."""
    import numpy as np
    import torch
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            array = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as exc:
        raise RecipeError(
            f"condition image '{path}' cannot be read ({exc}); give a PNG or JPEG file"
        ) from None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0


def condition_images(prompt: str) -> list[torch.Tensor]:
    """Prompt's condition images, each ``[3, H, W]`` in ``[0, 1]``, loaded now (none for plain text)."""
    return [load_image(p) for p in images_of(prompt)]


def reward_metadata(prompts: Sequence[str]) -> list[dict[str, Any]]:
    """``metadata[i]`` for rewards: row ``i``'s JSONL fields, with ``condition_image`` (the first image,
    a tensor) and ``condition_images`` (all of them) where it has any, and ``image`` as absolute paths. A
    prompt's images are loaded once for all its rows."""
    loaded: dict[int, list[torch.Tensor]] = {}
    out = []
    for p in prompts:
        meta = dict(p.metadata) if isinstance(p, Prompt) else {}
        if paths := images_of(p):
            images = loaded.setdefault(id(p), condition_images(p))
            meta["condition_image"], meta["condition_images"] = images[0], images
            resolved = [str(path.resolve()) for path in paths]  # opens from any folder (a reward server)
            meta[IMAGE_FIELD] = resolved[0] if isinstance(meta.get(IMAGE_FIELD), str) else resolved
        out.append(meta)
    return out


def takes_condition_image(adapter: Any) -> bool:
    """Whether ``adapter`` (built, or its ``Config`` class) declared ``takes_condition_image = True``."""
    return getattr(adapter, "takes_condition_image", False) is True


def check_conditions(adapter_name: str, takes_image: bool, prompts: Sequence[str], source: str) -> None:
    """One-line refusal of a prompt set the adapter cannot take: images for a text-only adapter, or a
    prompt without image for an editing one (``source`` names the prompts, plural: "the train prompts")."""
    with_image = [p for p in prompts if images_of(p)]
    if with_image and not takes_image:
        raise RecipeError(
            f"adapter {adapter_name} takes no condition image but {source} carry one (first: "
            f'{str(with_image[0])!r}); {EDITING_HINT}, or drop the "image" fields'
        )
    if takes_image and len(with_image) < len(prompts):
        bare = next(p for p in prompts if not images_of(p))
        raise RecipeError(
            f"adapter {adapter_name} edits a condition image but {source} include {str(bare)!r} without "
            'one; give every prompt an image ("image" in a .jsonl prompt file, or vgrpo sample --image)'
        )


def encode_conditioned(adapter: Any, prompts: Sequence[str]) -> Conditioning:
    """The core's call of an adapter's encoder: ``encode_conditions(prompts, images)`` for an adapter
    that takes condition images, ``encode_prompts(prompts)`` for any other (which refuses images)."""
    takes = takes_condition_image(adapter)
    check_conditions(type(adapter).__name__, takes, prompts, "the prompts")
    if takes:
        return adapter.encode_conditions(list(prompts), [condition_images(p) for p in prompts])
    return adapter.encode_prompts(list(prompts))
