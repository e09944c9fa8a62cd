"""The JSON wire format of ``vgrpo serve-reward`` (protocol version 1), shared by server and client.

Why raw little-endian float32 bytes in base64 rather than PNG: they decode bit-exactly, so a remote
reward scores exactly the tensor the in-process reward would. Scores travel as JSON numbers: a
float32 widened to a double and printed by ``json`` reads back to the same float32. See
docs/rewards.md, "Serving a reward over HTTP".
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vgrpo_platform.protocols import Samples

PROTOCOL = 1


class WireError(ValueError):
    """A request or reply that does not follow the protocol (the message says which field)."""


def encode_samples(samples: Samples) -> dict[str, Any]:
    """``Samples`` as raw float32 bytes (C order, little-endian) with shape and modality."""
    data = samples.data.detach().to("cpu", torch.float32).contiguous().numpy()
    return {
        "modality": samples.modality,
        "encoding": "raw",
        "dtype": "float32",
        "shape": list(data.shape),
        "data": base64.b64encode(data.astype("<f4", copy=False).tobytes()).decode("ascii"),
        "sample_rate": samples.sample_rate,
        "fps": samples.fps,
    }


def decode_samples(obj: Any) -> Samples:
    """The inverse of ``encode_samples``; also ``encoding = "png"``: a list of base64 PNG images."""
    if not isinstance(obj, Mapping):
        raise WireError("'samples' must be an object")
    modality, encoding = obj.get("modality"), obj.get("encoding", "raw")
    if modality not in ("image", "video", "audio"):
        raise WireError(f"'samples.modality' must be image, video or audio, got {modality!r}")
    if encoding == "png":
        if modality != "image" or not isinstance(obj.get("data"), list):
            raise WireError("'samples.encoding' png needs modality image and 'data' a list of base64 PNGs")
        data = torch.from_numpy(np.stack([_png(item) for item in obj["data"]])).permute(0, 3, 1, 2)
        return Samples("image", data.float() / 255)
    if encoding != "raw" or obj.get("dtype") != "float32":
        raise WireError("'samples' must have encoding 'raw' with dtype 'float32', or encoding 'png'")
    shape = obj.get("shape")
    if not (isinstance(shape, list) and shape and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise WireError(f"'samples.shape' must be a list of sizes, got {shape!r}")
    try:
        raw = base64.b64decode(obj.get("data", ""), validate=True)
    except (ValueError, TypeError) as exc:
        raise WireError(f"'samples.data' is not base64: {exc}") from None
    if len(raw) != 4 * int(np.prod(shape)):
        raise WireError(
            f"'samples.data' holds {len(raw)} bytes, shape {shape} needs {4 * int(np.prod(shape))}"
        )
    array = np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    return Samples(modality, torch.from_numpy(array), obj.get("sample_rate"), obj.get("fps"))


def _png(item: Any) -> np.ndarray:
    from PIL import Image

    try:
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(item))).convert("RGB"))
    except Exception as exc:  # any undecodable image
        raise WireError(f"'samples.data' holds an item that is not a base64 PNG: {exc}") from None


def encode_request(samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]) -> bytes:
    """The body of ``POST /score``; metadata must be JSON (a tensor there is a ``TypeError``)."""
    body = {
        "protocol": PROTOCOL,
        "samples": encode_samples(samples),
        "prompts": list(prompts),
        "metadata": [dict(m) for m in metadata],
    }
    return json.dumps(body).encode()


def encode_scores(out: torch.Tensor | Mapping[str, torch.Tensor]) -> dict[str, list[float]]:
    """A reward's output as ``{"score": [...], "<criterion>": [...]}`` of float32 values."""
    terms = out if isinstance(out, Mapping) else {"score": out}
    return {
        k: torch.as_tensor(v).detach().to("cpu", torch.float32).reshape(-1).tolist() for k, v in terms.items()
    }


def decode_scores(reply: Any, batch: int) -> dict[str, torch.Tensor]:
    """The ``scores`` of a reply as ``[batch]`` float32 tensors; a missing or short entry is an error."""
    scores = reply.get("scores") if isinstance(reply, Mapping) else None
    if not isinstance(scores, Mapping) or "score" not in scores:
        raise WireError("the reply has no 'scores' object with a 'score' entry")
    out = {}
    for key, values in scores.items():
        if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
            raise WireError(f"'scores.{key}' is not a list of numbers")
        if len(values) != batch:
            raise WireError(f"'scores.{key}' has {len(values)} values for {batch} samples")
        out[str(key)] = torch.tensor(values, dtype=torch.float32)
    return out
