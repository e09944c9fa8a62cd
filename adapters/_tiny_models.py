"""What the embedded tiny models (``toy``, ``shapes``, ``moving_shapes``, ``tones``) share: one folder layout
(``transformer/``, ``text_encoder/``, ``tokenizer/``), its path resolved against the recipe, loading it with
the classes' own ``from_pretrained``, and the padded tokenisation their text encoders read.

One copy of each, so a fix to the folder rule or the tokenisation reaches every world at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgrpo_adapters._weights import ModelWeightsError, weight_loading_kwargs

from vgrpo_platform.protocols import BuildContext

PARTS = ("transformer", "text_encoder", "tokenizer")


def resolve_model_path(model_path: str | None, context: BuildContext | None) -> Path | None:
    """``model_path`` as a folder: ``~`` expanded, a relative path read against the recipe's folder (so
    a recipe and its model travel together); ``None`` stays ``None`` for the caller's default."""
    if model_path is None:
        return None
    folder = Path(model_path).expanduser()
    if not folder.is_absolute() and context is not None and context.recipe_dir is not None:
        folder = Path(context.recipe_dir) / folder
    return folder


def load_model_folder(
    path: Path,
    transformer_class: Any,
    text_encoder_class: Any,
    *,
    dtype: Any,
    allow_pickle: bool,
    fix: str,
) -> tuple[Any, Any, Any]:
    """``(transformer, text_encoder, tokenizer)`` of a tiny model's folder, each by its class's
    ``from_pretrained`` in ``dtype``, safetensors only unless ``allow_pickle``. A folder missing a part
    is refused before anything loads, in one line ending with ``fix`` (how to get a whole folder). The
    tokenizer is the byte-level ``CLIPTokenizer`` these models share."""
    from transformers import CLIPTokenizer

    missing = [part + "/" for part in PARTS if not (path / part).is_dir()]
    if missing:
        raise ModelWeightsError(f"model folder {path} lacks {', '.join(missing)}; {fix}")
    safe = weight_loading_kwargs(path, allow_pickle=allow_pickle, key="adapter.options.allow_pickle_weights")
    transformer = transformer_class.from_pretrained(path / "transformer", torch_dtype=dtype, **safe)
    text_encoder = text_encoder_class.from_pretrained(path / "text_encoder", dtype=dtype, **safe)
    return transformer, text_encoder, CLIPTokenizer.from_pretrained(path / "tokenizer")


def padded_tokens(tokenizer: Any, prompts: Sequence[str], max_length: int, device: Any) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)`` ``[B, max_length]`` on ``device``: every prompt padded (or cut) to
    the same length, so a batch is one tensor and a prompt's encoding does not depend on its batch."""
    tokens = tokenizer(
        list(prompts), padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
    )
    return tokens.input_ids.to(device), tokens.attention_mask.to(device)
