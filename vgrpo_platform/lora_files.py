"""LoRA files in diffusers' layout, and the names every export shares.

What an export writes and ``train.init_lora`` reads: ``pytorch_lora_weights.safetensors`` whose header
holds the ``LoraConfig`` (rank, alpha, targets) under diffusers' ``lora_adapter_metadata`` key, so no
loader guesses the scale; ``vgrpo_export.json`` beside the weights says what they are and how to load
them. Adapters write their own family's layout (``transformer.``-prefixed keys through a pipeline's
``save_lora_weights``); ``write_lora`` is the core's for a denoiser without one (keys as peft names them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vgrpo_platform.errors import CheckpointError

if TYPE_CHECKING:  # torch only where tensors are read or written: `vgrpo push` never loads it
    import torch

FINAL = "final"
"""The run's export folder, ``RUN/final``."""
EXPORT_INFO = "vgrpo_export.json"
"""Written beside the exported weights: what they are and how to load them."""

LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' name for a LoRA's weights
LORA_METADATA = "lora_adapter_metadata"  # diffusers' safetensors header key for the LoraConfig


def lora_file(source: str) -> Path:
    """``source`` as a LoRA file: a ``.safetensors`` file, a folder holding ``LORA_FILE``, or a Hub repo
    id whose ``LORA_FILE`` is downloaded (huggingface_hub's cache). The recipe's check has already
    refused a missing path that cannot be a repo id."""
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / LORA_FILE
        if not path.is_file():
            raise CheckpointError(
                f"train.init_lora: {path.parent} holds no {LORA_FILE}; point it at a run's final/ folder "
                "or at the .safetensors file itself"
            )
    if path.is_file():
        return path
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(source, LORA_FILE))
    except Exception as exc:  # offline, unknown repo, no such file: each has its own type
        raise CheckpointError(
            f"train.init_lora: '{source}' is no local file or folder, and {LORA_FILE} could not be fetched "
            f"from the Hub ({type(exc).__name__}); check the path or repo id"
        ) from None


def read_lora(source: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A diffusers-format LoRA's tensors, keyed by module (``transformer.`` prefix removed), and its
    ``LoraConfig`` as a dict. No rank and alpha in the header is an error: a guessed alpha scales
    every update wrongly without a sign."""
    from safetensors import safe_open

    path = lora_file(source)
    try:
        with safe_open(str(path), "pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
            header = f.metadata() or {}
    except Exception as exc:  # a truncated or foreign file: safetensors raises its own types
        raise CheckpointError(
            f"train.init_lora: {path} is unreadable ({type(exc).__name__}: {exc}); point it at a run's "
            "final/ folder or at an intact .safetensors LoRA"
        ) from None
    if LORA_METADATA not in header:
        raise CheckpointError(
            f"train.init_lora: {path} stores no rank and alpha (no '{LORA_METADATA}' in its header), so "
            "its scale would be a guess; save it with diffusers' save_lora_weights(..., "
            "transformer_lora_adapter_metadata=...) or export it with vgrpo"
        )
    try:
        config = json.loads(header[LORA_METADATA])
    except ValueError:
        config = None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"train.init_lora: {path}'s '{LORA_METADATA}' header is not a JSON object of LoRA options; "
            "export the LoRA again with vgrpo, or save it with diffusers' save_lora_weights"
        )
    prefix = "transformer."  # diffusers' pipeline-level layout, as vgrpo exports it
    if state and all(k.startswith(prefix) for k in state):
        state = {k.removeprefix(prefix): v for k, v in state.items()}
        config = {k.removeprefix(prefix): v for k, v in config.items()}
    return state, config


def write_lora(out: Path, state: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """``out/LORA_FILE``: ``state``, with ``config`` (a ``LoraConfig`` as a dict) in the header."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    header = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    path = out / LORA_FILE
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt", LORA_METADATA: json.dumps(header, default=str)})
    return path


def write_export_info(out: Path, info: dict[str, Any]) -> None:
    (out / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")


def read_export_info(out: Path) -> dict[str, Any] | None:
    """An export folder's ``vgrpo_export.json``, or None where there is none."""
    path = Path(out) / EXPORT_INFO
    return json.loads(path.read_text()) if path.is_file() else None
