"""The wire format of ``vgrpo serve-reward``, shared by server and client (docs/rewards.md, "Protocol").

Protocol 2 (what the ``remote`` reward sends): one frame, ``u64 n | n bytes of JSON | a safetensors file``.
The JSON header carries what JSON is good at (prompts, metadata, the modality); the samples travel as
the safetensors file's one float32 tensor, so the bytes on the wire are the tensor's own: the client sends
the (CPU, float32) samples' memory as it is, and the server reads the body straight into the tensor it
scores; neither side holds the body a second time, as text or joined. Protocol 1 (raw float32 bytes in
base64 inside one JSON body, a third larger and held whole) is still served for older clients.

Why raw float32 rather than PNG: it decodes bit-exactly, so a remote reward scores exactly the tensor the
in-process reward would. Scores travel back as JSON numbers: a float32 widened to a double and printed by
``json`` reads back to the same float32.
"""

from __future__ import annotations

import base64
import io
import json
import math
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from vgrpo_platform.protocols import Samples

PROTOCOL = 2
"""The version a client sends: a frame of a JSON header and a safetensors body (``FRAME_TYPE``)."""
PROTOCOLS = (1, 2)
"""The versions a server accepts: 1 as one JSON body (``JSON_TYPE``), 2 as a frame."""
JSON_TYPE = "application/json"
FRAME_TYPE = "application/vnd.vgrpo.frame"
TENSOR = "samples"
"""The name of the samples tensor in a frame's safetensors file."""
MAX_HEADER = 64 << 20
"""Most bytes of a frame's JSON header, and of its safetensors header: a longer one is a broken frame."""
MODALITIES = ("image", "video", "audio")
_U64 = struct.Struct("<Q")


class ByteStream(Protocol):
    """What a frame is read from: a request body's stream (Werkzeug's), a socket file, ``io.BytesIO``;
    its ``readinto``, where it has one, fills the tensor without an intermediate copy."""

    def read(self, size: int = -1, /) -> bytes: ...


class WireError(ValueError):
    """A request or reply that does not follow the protocol (the message says which field)."""


@dataclass(frozen=True)
class Frame:
    """A protocol-2 body as the pieces sent one after another; the last is a view of the samples' memory."""

    chunks: tuple[bytes | memoryview, ...]

    @property
    def length(self) -> int:
        """The body's size in bytes (its ``Content-Length``)."""
        return sum(memoryview(chunk).nbytes for chunk in self.chunks)


@dataclass(frozen=True)
class ScoreRequest:
    """One ``POST /score`` as the server reads it, whichever protocol carried it."""

    protocol: int
    samples: Samples
    prompts: list[Any]
    metadata: list[Any]


LOCAL_METADATA = frozenset({"condition_image", "condition_images"})  # tensors the core adds; never sent


# ------------------------------------------------------------------------------------- protocol 2
def encode_frame(samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]) -> Frame:
    """The protocol-2 body of ``POST /score``; metadata must be JSON (a tensor there is a ``TypeError``),
    except the condition images the core adds (``condition_image(s)``), which stay behind: the line's
    ``"image"`` path travels instead."""
    header = {
        "protocol": PROTOCOL,
        "samples": {"modality": samples.modality, "sample_rate": samples.sample_rate, "fps": samples.fps},
        "prompts": list(prompts),
        "metadata": [{k: v for k, v in m.items() if k not in LOCAL_METADATA} for m in metadata],
    }
    text = json.dumps(header).encode()
    data = samples.data.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
    layout = {TENSOR: {"dtype": "F32", "shape": list(data.shape), "data_offsets": [0, data.nbytes]}}
    described = json.dumps(layout, separators=(",", ":")).encode()
    described += b" " * (-len(described) % 8)  # safetensors pads its header to 8 bytes with spaces
    head = _U64.pack(len(text)) + text + _U64.pack(len(described)) + described
    return Frame((head, data.data.cast("B")))  # the tensor's own memory: no copy of the samples


def read_frame(stream: ByteStream, length: int | None = None) -> ScoreRequest:
    """The request in a protocol-2 body read from ``stream``: the tensor is read straight into its buffer.

    ``length``, the body's ``Content-Length`` where known, must be the frame's size: it is checked before
    the tensor's memory is taken, so a header that claims more than was sent costs nothing.
    """
    text = _read_exact(stream, _length(stream, "the frame header"), "the frame header")
    header = _json_object(text, "header")
    if header.get("protocol") != 2:
        raise WireError(
            f"the frame's header asks for protocol {header.get('protocol')!r}; a frame is protocol 2"
        )
    info = header.get("samples")
    if not isinstance(info, Mapping) or info.get("modality") not in MODALITIES:
        raise WireError("the frame's 'samples' must be an object with modality image, video or audio")
    layout = _read_exact(stream, _length(stream, "the safetensors header"), "the safetensors header")
    shape = _tensor_shape(_json_object(layout, "safetensors header"))
    size = 2 * _U64.size + len(text) + len(layout) + 4 * math.prod(shape)
    if length is not None and length != size:
        raise WireError(f"the body has {length} bytes, but its frame describes {size}")
    data = torch.empty(shape, dtype=torch.float32)
    _read_into(stream, data.numpy().data.cast("B"))
    if sys.byteorder != "little":  # safetensors is little-endian
        data = torch.from_numpy(data.numpy().byteswap())
    if stream.read(1):
        raise WireError(f"the body goes on after the '{TENSOR}' tensor; a frame holds one tensor")
    samples = Samples(info["modality"], data, info.get("sample_rate"), info.get("fps"))
    return _request(2, samples, header)


def _tensor_shape(described: Mapping[str, Any]) -> list[int]:
    """The shape of the frame's one tensor, checked against its dtype and byte range."""
    extra = sorted(set(described) - {TENSOR, "__metadata__"})
    entry = described.get(TENSOR)
    if extra or not isinstance(entry, Mapping):
        raise WireError(
            f"the safetensors body must hold one tensor named '{TENSOR}', found {sorted(described)}"
        )
    shape = entry.get("shape")
    if not (isinstance(shape, list) and shape and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise WireError(f"'{TENSOR}' has shape {shape!r}; it must be a list of sizes")
    if entry.get("dtype") != "F32":
        raise WireError(f"'{TENSOR}' has dtype {entry.get('dtype')!r}; send float32 (F32)")
    if entry.get("data_offsets") != [0, 4 * math.prod(shape)]:
        raise WireError(
            f"'{TENSOR}' has data_offsets {entry.get('data_offsets')!r}; shape {shape} in float32 needs "
            f"[0, {4 * math.prod(shape)}]"
        )
    return shape


def _length(stream: ByteStream, what: str) -> int:
    (size,) = _U64.unpack(_read_exact(stream, _U64.size, f"the length of {what}"))
    if size > MAX_HEADER:
        raise WireError(f"{what} claims {size} bytes, more than {MAX_HEADER}: not a vgrpo frame")
    return int(size)


def _read_exact(stream: ByteStream, size: int, what: str) -> bytes:
    buffer = bytearray(size)
    _read_into(stream, memoryview(buffer), what)
    return bytes(buffer)


def _read_into(stream: ByteStream, view: memoryview, what: str = f"the '{TENSOR}' tensor") -> None:
    """Fill ``view`` from ``stream``, which may hand out fewer bytes per call, as sockets do."""
    readinto = getattr(stream, "readinto", None)
    done = 0
    while done < view.nbytes:
        if readinto is not None:
            got = readinto(view[done:]) or 0
        else:
            piece = stream.read(min(view.nbytes - done, 1 << 24))
            got = len(piece)
            view[done : done + got] = piece
        if not got:
            raise WireError(f"the body ended after {done} of the {view.nbytes} bytes of {what}")
        done += got


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise WireError(f"the frame's {what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise WireError(f"the frame's {what} must be a JSON object")
    return value


def _request(protocol: int, samples: Samples, body: Mapping[str, Any]) -> ScoreRequest:
    prompts, metadata = body.get("prompts"), body.get("metadata", [{}] * len(samples))
    if not (isinstance(prompts, list) and len(prompts) == len(samples)):
        raise WireError(f"'prompts' must be a list of {len(samples)} strings")
    if not (isinstance(metadata, list) and len(metadata) == len(samples)):
        raise WireError(f"'metadata' must be a list of {len(samples)} objects")
    return ScoreRequest(protocol, samples, prompts, metadata)


# ------------------------------------------------------------------------------------- protocol 1
def encode_samples(samples: Samples) -> dict[str, Any]:
    """Protocol 1: ``Samples`` as base64 of raw float32 bytes (C order, little-endian), shape, modality."""
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
    if modality not in MODALITIES:
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
    """Protocol 1's JSON body of ``POST /score`` (servers still accept it; ``encode_frame`` is protocol 2)."""
    body = {
        "protocol": 1,
        "samples": encode_samples(samples),
        "prompts": list(prompts),
        "metadata": [{k: v for k, v in m.items() if k not in LOCAL_METADATA} for m in metadata],
    }
    return json.dumps(body).encode()


def decode_request(body: bytes) -> ScoreRequest:
    """The request in a protocol-1 JSON body (the inverse of ``encode_request``)."""
    try:
        request = json.loads(body)
    except ValueError as exc:
        raise WireError(f"the body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise WireError("the body must be a JSON object")
    if request.get("protocol") == 2:
        raise WireError(f"protocol 2 travels as a frame (Content-Type {FRAME_TYPE}), not as JSON")
    if request.get("protocol") != 1:
        raise WireError(
            f"protocol {request.get('protocol')!r} requested, this server speaks 1 (JSON) and 2 (a frame)"
        )
    return _request(1, decode_samples(request.get("samples")), request)


# ------------------------------------------------------------------------------------- scores (both)
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
