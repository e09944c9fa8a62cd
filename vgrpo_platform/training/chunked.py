"""An adapter view whose ``predict`` runs on slices of the batch: bounded memory without gradients.

A surrogate's ``prepare`` evaluates the old (and reference) policy on every rollout row at once,
outside autograd; on a large model that batch can be far above ``train.micro_batch_size``. The
trainer hands ``prepare`` this view, so no forward pass ever sees more rows than a training
micro-batch, whatever the surrogate. Everything but ``predict`` is the wrapped adapter's own.
"""

from __future__ import annotations

from typing import Any

import torch

from vgrpo_platform.protocols import Conditioning


class ChunkedPredictions:
    """``adapter`` with ``predict`` split into slices of at most ``chunk_size`` rows."""

    def __init__(self, adapter: Any, chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self._adapter = adapter
        self._chunk_size = chunk_size

    def __getattr__(self, name: str) -> Any:  # denoiser, schedule, encode_prompts, ...
        return getattr(self._adapter, name)

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        rows, size = z_t.shape[0], self._chunk_size
        if rows <= size:
            return self._adapter.predict(z_t, t, cond)
        outputs = []
        for start in range(0, rows, size):
            part = slice(start, start + size)
            t_part = t[part] if t.ndim else t  # a shared scalar time stays whole
            outputs.append(self._adapter.predict(z_t[part], t_part, {k: v[part] for k, v in cond.items()}))
        return torch.cat(outputs)
