"""Video rewards: frame-wise image rewards and pixel-level temporal scores on ``[B, F, 3, H, W]`` clips."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from vgrpo_platform.protocols import Samples

from .._target import toward_target


def _clips(samples: Samples) -> torch.Tensor:
    """``samples.data`` as float32 ``[B, F, 3, H, W]``, or a clear error."""
    data = samples.data
    if samples.modality != "video" or data.ndim != 5 or data.shape[2] != 3:
        raise ValueError(
            f"video rewards need video samples [B, F, 3, H, W], got {samples.modality} {tuple(data.shape)}"
        )
    return data.float()


def frame_indices(total: int, count: int) -> list[int]:
    """``count`` evenly spaced frame indices in ``[0, total)``, first and last included; all when 0."""
    if count <= 0 or count >= total:
        return list(range(total))
    if count == 1:
        return [total // 2]
    return [round(i * (total - 1) / (count - 1)) for i in range(count)]


def _pooled(clips: torch.Tensor, pool: int) -> torch.Tensor:
    """Frames average-pooled to at most ``pool x pool``, flattened: ``[B, F, 3 * p * p]``."""
    b, f, c, h, w = clips.shape
    frames = F.adaptive_avg_pool2d(clips.reshape(b * f, c, h, w), (min(pool, h), min(pool, w)))
    return frames.reshape(b, f, -1)


class FramewiseReward:
    """An image reward on ``frames`` frames of every clip; the clip's score is their mean (or min)."""

    modalities = frozenset({"video"})

    def __init__(self, inner: Any, frames: int = 4, aggregate: str = "mean") -> None:
        if "image" not in getattr(inner, "modalities", {"image"}):
            raise ValueError(f"framewise needs an image reward, got one for {sorted(inner.modalities)}")
        self.inner = inner
        self.frames = frames
        self.aggregate = aggregate

    @classmethod
    def from_config(cls, config: Any, context: Any) -> FramewiseReward:
        """Build the named image reward from ``context.extra['registry']`` or the installed plugins."""
        registry = (getattr(context, "extra", None) or {}).get("registry")
        if registry is None:
            from vgrpo_platform.host.collect import default_registry

            registry = default_registry()
        inner = registry.build("reward", config.reward, dict(config.options), context)
        return cls(inner, frames=config.frames, aggregate=config.aggregate)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        clips = _clips(samples)  # [B, F, 3, H, W]
        b, f = clips.shape[:2]
        index = frame_indices(f, self.frames)
        k = len(index)
        images = clips[:, index].reshape(b * k, *clips.shape[2:])  # [B * k, 3, H, W], clip-major
        out = self.inner.score(
            Samples("image", images),
            [p for p in prompts for _ in range(k)],
            [m for m in metadata for _ in range(k)] if metadata else [{}] * (b * k),
        )
        scores = out["score"] if isinstance(out, Mapping) else out
        per_frame = scores.float().reshape(b, k)  # [B, k]
        return per_frame.mean(1) if self.aggregate == "mean" else per_frame.amin(1)


class TemporalConsistencyReward:
    """Mean cosine similarity of consecutive pooled frames, in ``[0, 1]`` (pixels are non-negative)."""

    modalities = frozenset({"video"})

    def __init__(self, pool: int = 32, eps: float = 1e-8) -> None:
        self.pool = pool
        self.eps = eps

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        frames = _pooled(_clips(samples), self.pool)  # [B, F, D]
        if frames.shape[1] < 2:
            return torch.ones(frames.shape[0], device=frames.device)
        a, b = frames[:, :-1], frames[:, 1:]  # [B, F - 1, D]
        # black frames next to black frames are identical: eps in both terms gives them similarity 1
        cos = ((a * b).sum(-1) + self.eps) / (a.norm(dim=-1) * b.norm(dim=-1) + self.eps)  # [B, F - 1]
        return cos.clamp(max=1.0).mean(1)


class MotionReward:
    """Mean absolute change between consecutive pooled frames (``[0, 1]``), or ``-|motion - target|``."""

    modalities = frozenset({"video"})

    def __init__(self, pool: int = 32, target: float | None = None) -> None:
        self.pool = pool
        self.target = target

    def motion(self, samples: Samples) -> torch.Tensor:
        """``[B]`` mean over frame pairs and pooled pixels of ``|x_{t+1} - x_t|``."""
        frames = _pooled(_clips(samples), self.pool)  # [B, F, D]
        if frames.shape[1] < 2:
            return torch.zeros(frames.shape[0], device=frames.device)
        return (frames[:, 1:] - frames[:, :-1]).abs().mean(dim=(1, 2))

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        return toward_target(self.motion(samples), self.target)


class ReferenceSimilarityReward:
    """Frame-by-frame cosine similarity of pooled pixels to a reference clip, in ``[0, 1]``.

    The reference is decoded once (decord); frame i of an F-frame clip meets the reference frame at the
    same relative time, so clips of any length compare with one reference.
    """

    modalities = frozenset({"video"})

    def __init__(self, reference: torch.Tensor, pool: int = 32, eps: float = 1e-8) -> None:
        if reference.ndim != 4 or reference.shape[1] != 3:
            raise ValueError(f"a reference clip must be [F, 3, H, W], got {tuple(reference.shape)}")
        self.reference = reference.float()  # [F_ref, 3, H, W] in [0, 1]
        self.pool = pool
        self.eps = eps

    @classmethod
    def from_config(cls, config: Any, context: Any) -> ReferenceSimilarityReward:
        from pathlib import Path

        from vgrpo_platform.errors import RewardError
        from vgrpo_platform.media import read_video

        path = Path(config.path).expanduser()
        recipe_dir = getattr(context, "recipe_dir", None)
        if not path.is_absolute() and recipe_dir is not None:
            path = Path(recipe_dir) / path
        if not path.is_file():
            raise RewardError(
                f"reference clip {path} not found; set the reward's options.path to an existing video file"
            )
        try:
            reference = read_video(path)
        except Exception as exc:  # decord raises its own error types on corrupt files
            raise RewardError(
                f"reference clip {path} could not be decoded ({exc}); re-encode it as mp4"
            ) from exc
        return cls(reference, pool=config.pool)

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        clips = _clips(samples)  # [B, F, 3, H, W]
        f = clips.shape[1]
        index = torch.linspace(0, self.reference.shape[0] - 1, f).round().long()  # evenly, either length
        pool = min(self.pool, *clips.shape[-2:], *self.reference.shape[-2:])  # one grid for both
        reference = _pooled(self.reference[index].unsqueeze(0).to(clips.device), pool)  # [1, F, D]
        frames = _pooled(clips, pool)  # [B, F, D]
        cos = ((frames * reference).sum(-1) + self.eps) / (
            frames.norm(dim=-1) * reference.norm(dim=-1) + self.eps
        )  # [B, F]
        return cos.clamp(max=1.0).mean(1)
