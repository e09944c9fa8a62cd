"""``vgrpo anchor-data``: a folder of captioned images -> the latents file ``[train.data_anchor]`` reads.

Why offline: the anchor draws a few data rows at every optimiser step for the whole run, so the images
are encoded once, by the recipe's own model at its resolution (``adapter.encode_images``: the VAE for
latent models, the pixels for pixel-space ones), and the run reads a small safetensors file instead of
running the VAE over the data again. The folder is the Hugging Face ``imagefolder`` layout: images beside a
``metadata.jsonl`` whose lines name a ``file_name`` and its caption as ``text`` (or ``prompt``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vgrpo_platform.errors import RecipeError

METADATA = "metadata.jsonl"
CAPTION_KEYS = ("text", "prompt")


def read_image_folder(folder: str | Path) -> tuple[list[Path], list[str]]:
    """The images and captions ``folder/metadata.jsonl`` lists, in its order (every file checked first)."""
    folder = Path(folder)
    index = folder / METADATA
    if not index.is_file():
        raise RecipeError(
            f"--images {folder} has no {METADATA}; write one line per image: "
            '{"file_name": "0001.png", "text": "its caption"}'
        )
    files, captions = [], []
    for number, line in enumerate(index.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{index} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecipeError(f"{where} is not JSON ({exc.msg}); write one JSON object per line") from None
        caption = next((row[k] for k in CAPTION_KEYS if isinstance(row, dict) and k in row), None)
        name = row.get("file_name") if isinstance(row, dict) else None
        if not isinstance(name, str) or not isinstance(caption, str):
            raise RecipeError(f'{where} needs "file_name" and "text" (or "prompt"), both strings')
        path = (folder / name).resolve()
        if not path.is_relative_to(folder.resolve()) or not path.is_file():
            raise RecipeError(f"{where}: {name!r} is not a file inside {folder}; fix file_name")
        files.append(path)
        captions.append(caption)
    if not files:
        raise RecipeError(f"{index} lists no image; add one line per image")
    return files, captions


def load_image(path: Path) -> torch.Tensor:
    """``[3, H, W]`` float32 in ``[0, 1]`` (RGB; an alpha channel or a palette is converted)."""
    from PIL import Image

    try:
        with Image.open(path) as opened:
            array = np.asarray(opened.convert("RGB"))
    except Exception as exc:  # not an image, truncated, unknown format
        raise RecipeError(f"{path} does not open as an image ({exc}); remove it or fix the file") from None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255


def encode_folder(adapter: Any, folder: str | Path, *, batch_size: int = 8) -> tuple[torch.Tensor, list[str]]:
    """``(latents [N, *L], captions)``: every image of ``folder`` through ``adapter.encode_images``."""
    encode = getattr(adapter, "encode_images", None)
    if encode is None:
        raise RecipeError(
            f"adapter {type(adapter).__name__} cannot encode images (it has no encode_images); give "
            "train.data_anchor.source as a .safetensors file of its latents instead"
        )
    files, captions = read_image_folder(folder)
    parts = []
    for lo in range(0, len(files), batch_size):
        parts.append(encode([load_image(p) for p in files[lo : lo + batch_size]]).float().cpu())
    latents = torch.cat(parts)
    if tuple(latents.shape[1:]) != tuple(adapter.latent_shape()):
        raise RecipeError(
            f"{type(adapter).__name__}.encode_images gave latents {tuple(latents.shape[1:])}, not the "
            f"adapter's {tuple(adapter.latent_shape())}; fix the adapter's encode_images"
        )
    return latents, captions


def write_from_recipe(resolved: Any, images: str | Path, out: str | Path, *, batch_size: int = 8) -> str:
    """Build the recipe's adapter (base model), encode ``images`` and write ``out``; the line to print."""
    from vgrpo_platform.protocols import BuildContext
    from vgrpo_platform.training.iteration.data_anchor import write_anchor_data
    from vgrpo_platform.training.session import resolve_device

    run = resolved.recipe.run
    context = BuildContext(device=resolve_device(run.device), seed=run.seed, recipe_dir=resolved.recipe_dir)
    adapter = resolved.adapter.build(context)
    with torch.no_grad():
        latents, captions = encode_folder(adapter, images, batch_size=batch_size)
    path = write_anchor_data(out, latents, captions)
    return f"wrote {len(captions)} encoded images {tuple(latents.shape[1:])} to {path}"
