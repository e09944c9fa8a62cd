"""The ``diversity`` group reward: embed, cluster within the prompt's group, score by cluster size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from scipy.cluster.hierarchy import fcluster, linkage

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

if TYPE_CHECKING:
    from . import Config


def embed(samples: Samples, side: int) -> torch.Tensor:
    """``[G, D]`` coarse embeddings: every image or frame average-pooled to ``side x side``. Fixed and
    parameter-free, so the score needs no weights (pooled audio would average its waves away: no audio)."""
    x = samples.data.detach().float()
    if samples.modality == "image" and x.ndim == 4:  # [G, 3, H, W]
        return F.adaptive_avg_pool2d(x, side).flatten(1)
    if samples.modality == "video" and x.ndim == 5:  # [G, F, 3, H, W]
        g = x.shape[0]
        return F.adaptive_avg_pool2d(x.flatten(0, 1), side).reshape(g, -1)
    raise RewardError(
        f"diversity got {samples.modality} samples of shape {tuple(x.shape)}; it scores image "
        "[B, 3, H, W] and video [B, F, 3, H, W]"
    )


def cluster_labels(
    embeddings: torch.Tensor, *, threshold: float, clusters: int | None, method: str
) -> torch.Tensor:
    """``[G]`` cluster ids: agglomerative clustering on root-mean-square distances, cut at
    ``threshold`` or into at most ``clusters`` clusters."""
    g = len(embeddings)
    if g == 1:
        return torch.zeros(1, dtype=torch.long)
    e = embeddings.detach().double().cpu()  # scipy works on host arrays
    d = torch.cdist(e, e).div(e.shape[1] ** 0.5)  # RMS difference, the embedding's units
    rows, cols = torch.triu_indices(g, g, offset=1)
    condensed = d[rows, cols].clamp_min(0).numpy()  # scipy's condensed distance vector
    tree = linkage(condensed, method=method)
    if clusters is not None:
        labels = fcluster(tree, t=clusters, criterion="maxclust")
    else:
        labels = fcluster(tree, t=threshold, criterion="distance")
    return torch.as_tensor(labels, dtype=torch.long)


def cluster_bonus(labels: torch.Tensor, bonus: str) -> torch.Tensor:
    """``[G]`` each sample's score from the size ``n`` of its cluster: ``1 / n`` (inverse) or
    ``1 - n / G`` (share)."""
    sizes = torch.bincount(labels)[labels].float()  # [G] size of each sample's cluster
    if bonus == "inverse":
        return 1.0 / sizes
    return 1.0 - sizes / len(labels)


CLIP_FIX = "set the diversity reward's options.clip_model to a local folder of a transformers CLIP model"


class DiversityReward:
    """One prompt's group per call (``groups = True``): ``score`` ``[G]`` and ``clusters`` ``[G]``
    (how many clusters the group has, the same on each of its rows)."""

    groups = True

    def __init__(self, config: Config, context: Any = None) -> None:
        self.config = config
        self.clip = None
        self.modalities = frozenset({"image", "video"})
        if config.clip_model is not None:
            from .._clip_common import load_clip, resolve_source

            folder = resolve_source(config.clip_model, context)
            if not Path(folder).is_dir():
                raise RewardError(f"diversity: clip_model {folder!r} is not a local folder; {CLIP_FIX}")
            self.clip = load_clip(folder, None, None, 16, context, "diversity CLIP", CLIP_FIX)
            self.modalities = frozenset({"image"})

    def embed(self, samples: Samples, prompts: Sequence[str]) -> torch.Tensor:
        """``[G, D]``: pooled pixels, or unit CLIP image embeddings times ``sqrt(D)`` (so the RMS
        difference ``cluster_labels`` measures is the chord length between them)."""
        if self.clip is None:
            return embed(samples, self.config.side)
        from .._clip_common import check_images

        unit, _ = self.clip.embed(check_images(samples, prompts, "diversity"), None)
        return unit * unit.shape[1] ** 0.5

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        c = self.config
        labels = cluster_labels(
            self.embed(samples, prompts), threshold=c.threshold, clusters=c.clusters, method=c.linkage
        )
        count = torch.full((len(labels),), float(len(labels.unique())))
        device = samples.data.device
        return {"score": cluster_bonus(labels, c.bonus).to(device), "clusters": count.to(device)}
