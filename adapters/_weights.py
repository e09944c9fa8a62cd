"""Which weight files an adapter may load: safetensors, and pickles only where the recipe trusts them.

A pickle (``.bin``, ``.pt``, ``.ckpt``) can run code when it is unpickled; torch's ``weights_only`` loader
stops the known tricks but is a blocklist of a format made to execute. A model folder someone hands over
is therefore read as safetensors only: a folder holding pickle weights is refused, before anything is
loaded, in one line naming the file and the fix, unless ``allow_pickle_weights = true``. Pydantic and
pathlib only: entry modules import the option without torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from vgrpo_platform.errors import VgrpoError
from vgrpo_platform.registry import PluginConfig

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})


class ModelWeightsError(VgrpoError):
    """The model's weights could not be found or read, or are pickles the recipe does not trust."""


class PickleWeightsOption(PluginConfig):
    """The option every adapter that loads a model folder accepts."""

    allow_pickle_weights: bool = Field(
        False,
        description="UNSAFE: also load pickle weight files (.bin, .pt, .ckpt), which can run code when "
        "loaded; only for a model you trust. false = safetensors only: a folder holding pickle weights is "
        "refused in one line naming the file (convert it to safetensors).",
    )


def weight_loading_kwargs(model: str | Path, *, allow_pickle: bool, key: str) -> dict[str, Any]:
    """``from_pretrained``'s keywords for ``model`` (a folder or a Hub id): safetensors only unless
    ``allow_pickle``. A local folder whose pickle weights have no safetensors beside them is refused
    now, naming the file; ``key`` is the recipe key that lifts the rule."""
    if allow_pickle:
        return {}
    folder = Path(model).expanduser()
    if folder.is_dir():
        for file in sorted(folder.rglob("*")):
            pickled = file.suffix.lower() in PICKLE_SUFFIXES and file.is_file()
            if pickled and not _has_safetensors(file.parent):
                raise ModelWeightsError(
                    f"'{file}' holds pickle weights, which can run code when loaded; convert them to "
                    "safetensors (load once where you trust the file, then save_pretrained with "
                    f"safe_serialization=True), or set {key} = true if you trust it (unsafe)"
                )
    return {"use_safetensors": True}


def _has_safetensors(folder: Path) -> bool:
    return any(folder.glob("*.safetensors"))
