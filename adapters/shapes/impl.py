"""The ``shapes`` adapter: the ``toy`` adapter's code path, loaded from the shipped pretrained folder.

Nothing model-specific lives here on purpose: the shipped model is an ordinary diffusers /
transformers checkpoint, served by ``ToyAdapter.load`` (``from_pretrained``) like any other folder.
"""

from __future__ import annotations

from pathlib import Path

from vgrpo_adapters._tiny_models import resolve_model_path
from vgrpo_adapters.toy.impl import ToyAdapter

from vgrpo_platform.protocols import BuildContext

from . import WEIGHTS_DIR, Config


def model_folder(config: Config, context: BuildContext | None = None) -> Path:
    """``config.model_path`` (relative to the recipe's folder when relative), else the shipped weights."""
    return resolve_model_path(config.model_path, context) or WEIGHTS_DIR


def load_shapes_adapter(config: Config, context: BuildContext) -> ToyAdapter:
    """The factory's work: ``ToyAdapter.load`` on the resolved folder, at the configured resolution."""
    return ToyAdapter.load(
        model_folder(config, context),
        resolution=config.resolution,
        shift=config.shift,
        device=context.device,
        dtype=context.dtype,
        allow_pickle_weights=config.allow_pickle_weights,
    )
