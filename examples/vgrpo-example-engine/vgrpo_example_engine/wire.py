"""Tensors on the wire: float32 little-endian bytes in base64 with their shape, inside JSON."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch


def pack(tensor: torch.Tensor) -> dict[str, Any]:
    array = tensor.detach().to("cpu", torch.float32).contiguous().numpy()
    return {"shape": list(array.shape), "data": base64.b64encode(array.astype("<f4").tobytes()).decode()}


def unpack(payload: dict[str, Any]) -> torch.Tensor:
    array = np.frombuffer(base64.b64decode(payload["data"]), dtype="<f4").reshape(payload["shape"])
    return torch.from_numpy(array.copy())
