"""A run's ``final/`` folder: the trained weights in their model family's format, the note that says
what they are (``vgrpo_export.json``) and the model card (``README.md``).

One function for the end of a run and for ``vgrpo export`` (older runs, another checkpoint), so both
write the same folder. The weights are whatever the denoiser holds when it is called: the run passes
the served ones (the moving average under ``train.ema_decay``, what every evaluation used), and so
does ``vgrpo export`` (``Checkpoint.served_weights``). An adapter without ``export_trained`` gets the
core's (``finetune.export_trainable``), so every run leaves loadable weights.
"""

from __future__ import annotations

from pathlib import Path

from vgrpo_platform.config.schema import Recipe
from vgrpo_platform.finetune import export_trainable, lora_config, uses_lora
from vgrpo_platform.lora_files import read_export_info, write_export_info
from vgrpo_platform.protocols import Adapter
from vgrpo_platform.training.observe.model_card import write_model_card


def export_policy(adapter: Adapter, out: Path, run_dir: Path, recipe: Recipe) -> Path:
    """Write the adapter's current weights, their note (with the LoRA's rank and alpha) and the model
    card into ``out``; returns ``out``."""
    out = Path(out)
    export = getattr(adapter, "export_trained", None)
    if export is not None:
        export(out)
        info = read_export_info(out) or {}
    else:
        info = export_trainable(adapter.denoiser, out)
    config = lora_config(adapter.denoiser) if uses_lora(adapter.denoiser) else None
    if config is not None:
        info.update(lora_rank=config.r, lora_alpha=config.lora_alpha)
    write_export_info(out, info)
    write_model_card(out, run_dir, recipe, modality=adapter.modality)
    return out
