"""Shared plumbing of the model-based image rewards: weight resolution with a one-line fix-it error,
dtype choice, batching, and CLIP-style preprocessing as torch ops on the samples' device.

Why torch ops rather than the processor: the samples are already float tensors on the accelerator;
a PIL round trip per image would move every batch to the CPU and back. ``clip_preprocess`` does what
``CLIPImageProcessor`` / open_clip's ``preprocess_val`` do (shortest side to ``size`` with bicubic
antialiasing, centre crop, normalise); ``tests/test_image_rewards.py`` checks it against the processor.
Heavy imports (torch, transformers) happen here, so only ``impl.py`` modules import this file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

T = TypeVar("T")

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ImageTransform:
    """Resize the shortest side to ``size``, centre-crop ``crop`` x ``crop``, normalise per channel."""

    size: int = 224
    crop: int = 224
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD

    @classmethod
    def from_hf_processor(cls, image_processor: Any) -> ImageTransform:
        """Read the geometry and statistics a transformers ``CLIPImageProcessor`` would apply."""
        size = _field(image_processor.size, "shortest_edge", "height")
        crop = _field(getattr(image_processor, "crop_size", None) or size, "height")
        return cls(size, crop, tuple(image_processor.image_mean), tuple(image_processor.image_std))


def _field(value: Any, *names: str) -> int:
    """An int, or the first set entry of a size dict (transformers 4) / ``SizeDict`` (transformers 5)."""
    if isinstance(value, int):
        return value
    for name in names:
        got = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
        if got is not None:
            return int(got)
    raise ValueError(f"no {' or '.join(names)} in the image processor's size {value!r}")


def clip_preprocess(images: torch.Tensor, transform: ImageTransform, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 3, H, W]`` in ``[0, 1]`` -> ``[B, 3, crop, crop]`` normalised, on ``images``' device."""
    x = images.float()
    h, w = x.shape[-2:]
    short, long = (h, w) if h <= w else (w, h)
    new_long = int(transform.size * long / short)  # the processor's rounding (truncation)
    new_hw = (transform.size, new_long) if h <= w else (new_long, transform.size)
    if (h, w) != new_hw:
        # antialias=True makes torch's bicubic filter the same Keys (a=-0.5) kernel PIL uses for downscaling
        x = F.interpolate(x, size=new_hw, mode="bicubic", align_corners=False, antialias=True)
    x = x.clamp(0.0, 1.0)  # PIL resizes uint8 images, so overshoot is clipped
    top, left = (new_hw[0] - transform.crop) // 2, (new_hw[1] - transform.crop) // 2
    x = x[..., top : top + transform.crop, left : left + transform.crop]  # [B, 3, crop, crop]
    mean = torch.tensor(transform.mean, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(transform.std, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).to(dtype)


def check_images(samples: Samples, prompts: Sequence[str], reward: str) -> torch.Tensor:
    """The image tensor ``[B, 3, H, W]``, after checking modality, layout and the prompt count."""
    data = samples.data
    if samples.modality != "image" or data.ndim != 4 or data.shape[1] != 3:
        raise RewardError(
            f"{reward} scores images [B, 3, H, W]; got {samples.modality!r} {tuple(data.shape)}"
        )
    if len(prompts) != data.shape[0]:
        raise RewardError(f"{reward}: {len(prompts)} prompts for {data.shape[0]} images")
    return data


def batches(n: int, batch_size: int) -> Iterator[slice]:
    """Consecutive slices of ``range(n)`` of at most ``batch_size`` items (bounds peak memory)."""
    for start in range(0, n, batch_size):
        yield slice(start, min(start + batch_size, n))


def pick_dtype(name: str | None, context: Any) -> torch.dtype:
    """The option's dtype, else the run's weight dtype (``BuildContext.dtype``), else float32."""
    if name is not None:
        return DTYPES[name]
    ctx = getattr(context, "dtype", None)
    return ctx if isinstance(ctx, torch.dtype) else torch.float32


def pick_device(context: Any) -> torch.device:
    return torch.device(getattr(context, "device", None) or "cpu")


def resolve_source(source: str, context: Any) -> str:
    """A path relative to the recipe's folder if one exists there, else ``source`` unchanged (a hub id)."""
    recipe_dir = getattr(context, "recipe_dir", None)
    expanded = os.path.expanduser(source)
    if recipe_dir is not None and not os.path.isabs(expanded) and (Path(recipe_dir) / expanded).exists():
        return str(Path(recipe_dir) / expanded)
    return expanded


def _why(exc: BaseException) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    return (
        "offline"
        if offline
        else f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    )


def load_or_explain(load: Callable[[], T], what: str, source: str, fix: str) -> T:
    """Run ``load``; a missing file or unreachable hub becomes one ``RewardError`` line naming ``fix``."""
    try:
        return load()
    except (OSError, ValueError) as exc:  # missing files and hub misses; format errors keep their traceback
        raise RewardError(f"{what} weights not found at {source!r} ({_why(exc)}); {fix}") from exc


def resolve_file(source: str, filename: str, what: str, fix: str, context: Any) -> str:
    """A weights *file*: ``source`` itself, ``source/filename`` for a folder, or ``filename`` from the hub
    repo ``source`` (the local cache when offline)."""
    path = resolve_source(source, context)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, filename)):
            return os.path.join(path, filename)
        raise RewardError(f"{what} weights not found at {os.path.join(path, filename)!r}; {fix}")
    if os.path.isabs(path) or source.startswith((".", "~")) or source.count("/") != 1:  # not a hub repo id
        raise RewardError(f"{what} weights not found at {path!r}; {fix}")

    def download() -> str:
        from huggingface_hub import hf_hub_download

        return hf_hub_download(repo_id=source, filename=filename)

    return load_or_explain(download, what, f"{source}/{filename}", fix)


def features(out: Any) -> torch.Tensor:
    """``get_image_features`` / ``get_text_features`` output as a tensor: transformers 4 returns the
    projected embedding, transformers 5 a model output whose ``pooler_output`` holds it."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@dataclass
class ClipBundle:
    """A transformers CLIP model with its tokenizer and image transform, ready to embed."""

    model: Any  # transformers.CLIPModel, eval mode
    tokenizer: Any
    transform: ImageTransform
    dtype: torch.dtype
    batch_size: int

    @torch.no_grad()
    def embed(
        self, images: torch.Tensor, prompts: Sequence[str] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Unit-norm image ``[B, D]`` and text ``[B, D]`` (None without prompts) embeddings, float32."""
        device = images.device
        if next(self.model.parameters()).device != device:
            self.model.to(device)
        img_out, txt_out = [], []
        for sl in batches(images.shape[0], self.batch_size):
            pixels = clip_preprocess(images[sl], self.transform, self.dtype)  # [b, 3, crop, crop]
            img_out.append(features(self.model.get_image_features(pixel_values=pixels)).float())
            if prompts is not None:
                tok = self.tokenizer(
                    list(prompts[sl]), padding=True, truncation=True, max_length=77, return_tensors="pt"
                ).to(device)
                txt = self.model.get_text_features(
                    input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]
                )
                txt_out.append(features(txt).float())
        img = F.normalize(torch.cat(img_out), dim=-1)  # [B, D]
        txt = F.normalize(torch.cat(txt_out), dim=-1) if prompts is not None else None  # [B, D]
        return img, txt

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str], device: torch.device) -> torch.Tensor:
        """Unit-norm text embeddings ``[N, D]``, float32, of ``texts`` alone."""
        if next(self.model.parameters()).device != device:
            self.model.to(device)
        out = []
        for sl in batches(len(texts), self.batch_size):
            tok = self.tokenizer(
                list(texts[sl]), padding=True, truncation=True, max_length=77, return_tensors="pt"
            ).to(device)
            txt = self.model.get_text_features(
                input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]
            )
            out.append(features(txt).float())
        return F.normalize(torch.cat(out), dim=-1)


def load_clip(
    model: str, processor: str | None, dtype: str | None, batch_size: int, context: Any, what: str, fix: str
) -> ClipBundle:
    """``CLIPModel.from_pretrained(model)`` and the tokenizer / image geometry of ``processor`` (default:
    the model's own folder or repo), moved to the run's device in the chosen dtype."""
    from transformers import AutoProcessor, CLIPModel

    source = resolve_source(model, context)
    proc_source = resolve_source(processor, context) if processor else source
    torch_dtype = pick_dtype(dtype, context)
    clip = load_or_explain(lambda: CLIPModel.from_pretrained(source, dtype=torch_dtype), what, source, fix)
    clip.to(device=pick_device(context), dtype=torch_dtype).eval().requires_grad_(False)
    proc = load_or_explain(
        lambda: AutoProcessor.from_pretrained(proc_source), f"{what} processor", proc_source, fix
    )
    return ClipBundle(
        clip, proc.tokenizer, ImageTransform.from_hf_processor(proc.image_processor), torch_dtype, batch_size
    )
