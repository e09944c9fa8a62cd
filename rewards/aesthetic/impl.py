"""LAION aesthetic predictor v2: ``MLPHead(normalize(CLIP.get_image_features(x)))`` as in
github.com/christophschuhmann/improved-aesthetic-predictor (``simple_inference.py``) and DDPO."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples

from .._clip_bases import ClipEmbeddingReward
from .._clip_common import load_or_explain, pick_device, resolve_file

if TYPE_CHECKING:
    from . import Config

HEAD_URL = "https://github.com/christophschuhmann/improved-aesthetic-predictor/raw/main/sac+logos+ava1-l14-linearMSE.pth"
FIX_CLIP = (
    "download it with `huggingface-cli download openai/clip-vit-large-patch14 --local-dir DIR` "
    "and set the reward's options.model to that folder"
)
FIX_HEAD = f"download the head from {HEAD_URL} and set the reward's options.head to the file"


class MLPHead(nn.Module):
    """The improved-aesthetic-predictor head (also ImageReward's): linear layers with dropouts and no
    activations, ``in_dim -> 1024 -> 128 -> 64 -> 16 -> 1``; state-dict keys ``layers.{0,2,4,6,7}``."""

    def __init__(self, in_dim: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # [B, in_dim] -> [B, 1]


def load_state_dict_file(path: str) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` file, or a torch pickle read with ``weights_only=True`` (no code execution)."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


def load_head(path: str, expected_in: int) -> MLPHead:
    state = load_or_explain(lambda: load_state_dict_file(path), "Aesthetic head", path, FIX_HEAD)
    if "layers.0.weight" not in state:
        raise RewardError(f"{path!r} is not an aesthetic MLP head (no 'layers.0.weight'); {FIX_HEAD}")
    in_dim = int(state["layers.0.weight"].shape[1])
    if in_dim != expected_in:
        raise RewardError(
            f"aesthetic head {path!r} expects {in_dim}-d embeddings but the CLIP model gives {expected_in}; "
            "use the CLIP the head was trained on (ViT-L/14 for sac+logos+ava1-l14-linearMSE.pth)"
        )
    head = MLPHead(in_dim)
    head.load_state_dict(state)
    return head


class AestheticReward(ClipEmbeddingReward):
    reward_name = "aesthetic"
    weights_name = "Aesthetic CLIP"
    weights_fix = FIX_CLIP

    def __init__(self, config: Config, context: Any) -> None:
        super().__init__(config, context)
        path = resolve_file(config.head, config.head_filename, "Aesthetic head", FIX_HEAD, context)
        self.head = load_head(path, int(self.clip.model.config.projection_dim))
        self.head.to(pick_device(context)).eval().requires_grad_(False)  # float32: it is tiny

    @torch.no_grad()
    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        img = self.embed_images(samples, prompts)  # [B, D] unit norm
        self.head.to(img.device)
        return self.head(img).squeeze(-1)  # [B]
