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
RANKS = {"image": 4, "video": 5, "audio": 3}
"""The samples tensor's dimensions per modality: ``[B, 3, H, W]``, ``[B, F, 3, H, W]``, ``[B, C, N]``."""
MAX_ELEMENTS = 1 << 36
"""Most float32 values in one request (256 GiB, protocol 2's body limit): a larger shape is a mistake."""
MAX_PIXELS = 1 << 25
"""The default pixel budget of one request's encoded images (32 Mi pixels, e.g. 128 images of 512 x 512,
about 0.5 GB decoded): checked from the images' headers before any is decoded."""
IMAGE_FORMATS = {"png": "PNG"}
"""The one image format each ``encoding`` names: a PNG request holds PNG files, nothing else Pillow reads."""
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
    whole_group: bool = False  # one prompt's whole group (a group reward's unit; optional key)


LOCAL_METADATA = frozenset({"condition_image", "condition_images"})  # tensors the core adds; never sent


# ------------------------------------------------------------------------------------- protocol 2
def encode_frame(
    samples: Samples,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    *,
    whole_group: bool = False,
) -> Frame:
    """The protocol-2 body of ``POST /score``; metadata must be JSON (a tensor there is a ``TypeError``),
    except the condition images the core adds (``condition_image(s)``), which stay behind: the line's
    ``"image"`` path travels instead. ``whole_group``: the rows are one prompt's whole group (``"group":
    true``), what a server of a group reward needs; older servers ignore the key."""
    header: dict[str, Any] = {
        "protocol": PROTOCOL,
        "samples": {"modality": samples.modality, "sample_rate": samples.sample_rate, "fps": samples.fps},
        "prompts": list(prompts),
        "metadata": [{k: v for k, v in m.items() if k not in LOCAL_METADATA} for m in metadata],
    }
    if whole_group:
        header["group"] = True
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
    shape = _tensor_shape(_json_object(layout, "safetensors header"), info["modality"])
    size = 2 * _U64.size + len(text) + len(layout) + 4 * math.prod(shape)
    if length is not None and length != size:
        raise WireError(f"the body has {length} bytes, but its frame describes {size}")
    data = torch.empty(shape, dtype=torch.float32)
    _read_into(stream, data.numpy().data.cast("B"))
    if sys.byteorder != "little":  # safetensors is little-endian
        data = torch.from_numpy(data.numpy().byteswap())
    if stream.read(1):
        raise WireError(f"the body goes on after the '{TENSOR}' tensor; a frame holds one tensor")
    rate, fps = _rates(info, "samples")
    return _request(2, Samples(info["modality"], data, rate, fps), header)


def _tensor_shape(described: Mapping[str, Any], modality: str) -> list[int]:
    """The shape of the frame's one tensor, checked against its dtype and byte range."""
    extra = sorted(set(described) - {TENSOR, "__metadata__"})
    entry = described.get(TENSOR)
    if extra or not isinstance(entry, Mapping):
        raise WireError(
            f"the safetensors body must hold one tensor named '{TENSOR}', found {sorted(described)}"
        )
    shape = check_shape(entry.get("shape"), modality, f"'{TENSOR}' shape")
    if entry.get("dtype") != "F32":
        raise WireError(f"'{TENSOR}' has dtype {entry.get('dtype')!r}; send float32 (F32)")
    if entry.get("data_offsets") != [0, 4 * math.prod(shape)]:
        raise WireError(
            f"'{TENSOR}' has data_offsets {entry.get('data_offsets')!r}; shape {shape} in float32 needs "
            f"[0, {4 * math.prod(shape)}]"
        )
    return shape


def check_shape(shape: Any, modality: str, field: str) -> list[int]:
    """``shape`` if it is a samples shape of ``modality``: positive integers (not booleans), its rank, three
    colour channels for images and video, at most ``MAX_ELEMENTS`` values (an exact product, no wrap)."""
    rank = RANKS[modality]
    if not (isinstance(shape, list) and all(type(n) is int and n > 0 for n in shape)):
        raise WireError(f"{field} is {_short(shape)}; it must be a list of positive integers")
    if len(shape) != rank:
        layout = {"image": "[B, 3, H, W]", "video": "[B, F, 3, H, W]", "audio": "[B, channels, samples]"}
        raise WireError(f"{field} is {shape}; {modality} samples have {rank} dimensions, {layout[modality]}")
    if modality in ("image", "video") and shape[-3] != 3:
        raise WireError(f"{field} is {shape}; {modality} samples have 3 colour channels (RGB)")
    if math.prod(shape) > MAX_ELEMENTS:
        raise WireError(
            f"{field} is {shape}, more than {MAX_ELEMENTS} values; send fewer samples per request"
        )
    return shape


def _short(value: Any) -> str:
    """``repr(value)`` cut to 80 characters, for an error line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _rates(info: Mapping[str, Any], field: str) -> tuple[int | None, float | None]:
    """``sample_rate`` (a positive integer) and ``fps`` (a positive number), each possibly null."""
    rate, fps = info.get("sample_rate"), info.get("fps")
    if rate is not None and not (type(rate) is int and rate > 0):
        raise WireError(f"'{field}.sample_rate' is {_short(rate)}; it must be a positive integer or null")
    if fps is not None and not (type(fps) in (int, float) and math.isfinite(fps) and fps > 0):
        raise WireError(f"'{field}.fps' is {_short(fps)}; it must be a positive number or null")
    return rate, fps


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
    value = _loads(raw, f"the frame's {what}")
    if not isinstance(value, dict):
        raise WireError(f"the frame's {what} must be a JSON object")
    return value


def _loads(raw: bytes, what: str) -> Any:
    """``json.loads(raw)``; text that is not JSON, or nested too deeply to parse, is a ``WireError``."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise WireError(
            f"{what} is JSON nested too deeply to read; send plain prompts and metadata"
        ) from None
    except ValueError as exc:
        raise WireError(f"{what} is not JSON: {exc}") from None


def _request(protocol: int, samples: Samples, body: Mapping[str, Any]) -> ScoreRequest:
    prompts, metadata = body.get("prompts"), body.get("metadata", [{}] * len(samples))
    if not (isinstance(prompts, list) and len(prompts) == len(samples)):
        raise WireError(f"'prompts' must be a list of {len(samples)} strings")
    if not all(isinstance(p, str) for p in prompts):
        raise WireError(f"'prompts' must be a list of {len(samples)} strings, not {_short(prompts)}")
    if not (isinstance(metadata, list) and len(metadata) == len(samples)):
        raise WireError(f"'metadata' must be a list of {len(samples)} objects")
    if not all(isinstance(m, dict) for m in metadata):
        raise WireError(f"'metadata' must be a list of {len(samples)} objects, not {_short(metadata)}")
    group = body.get("group", False)
    if not isinstance(group, bool):
        raise WireError(f"'group' must be true or false, not {_short(group)}")
    return ScoreRequest(protocol, samples, prompts, metadata, whole_group=group)


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


def decode_samples(obj: Any, max_pixels: int = MAX_PIXELS) -> Samples:
    """The inverse of ``encode_samples``; also ``encoding = "png"``: a list of base64 PNG images, at most
    ``max_pixels`` pixels in all (read from their headers before any is decoded)."""
    if not isinstance(obj, Mapping):
        raise WireError("'samples' must be an object")
    modality, encoding = obj.get("modality"), obj.get("encoding", "raw")
    if modality not in MODALITIES:
        raise WireError(f"'samples.modality' must be image, video or audio, got {_short(modality)}")
    if encoding in IMAGE_FORMATS:
        if modality != "image" or not isinstance(obj.get("data"), list) or not obj["data"]:
            raise WireError(
                f"'samples.encoding' {encoding} needs modality image and 'samples.data' a non-empty list of "
                f"base64 {IMAGE_FORMATS[encoding]} files"
            )
        return Samples("image", decode_images(obj["data"], encoding, max_pixels))
    if encoding != "raw" or obj.get("dtype") != "float32":
        raise WireError("'samples' must have encoding 'raw' with dtype 'float32', or encoding 'png'")
    shape = check_shape(obj.get("shape"), modality, "'samples.shape'")
    if not isinstance(obj.get("data"), str):
        raise WireError("'samples.data' must be a base64 string")
    try:
        raw = base64.b64decode(obj["data"], validate=True)
    except (ValueError, TypeError) as exc:
        raise WireError(f"'samples.data' is not base64: {exc}") from None
    if len(raw) != 4 * math.prod(shape):
        raise WireError(f"'samples.data' holds {len(raw)} bytes, shape {shape} needs {4 * math.prod(shape)}")
    array = np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    rate, fps = _rates(obj, "samples")
    return Samples(modality, torch.from_numpy(array), rate, fps)


def decode_images(items: Sequence[Any], encoding: str, max_pixels: int) -> torch.Tensor:
    """``[B, 3, H, W]`` in ``[0, 1]`` from base64 image files of ``encoding``'s one format.

    Each file's header is read first (Pillow opens lazily): a file of another format, a size that differs
    from the first's, or more than ``max_pixels`` pixels in all is refused before anything is decoded,
    so a small request cannot make the server allocate gigabytes (a decompression bomb).
    """
    from PIL import Image

    fmt, total = IMAGE_FORMATS[encoding], 0
    images: list[Image.Image] = []
    for i, item in enumerate(items):
        field = f"'samples.data[{i}]'"
        try:
            image = Image.open(io.BytesIO(base64.b64decode(item)), formats=[fmt])
        except Image.DecompressionBombError:
            raise WireError(
                f"{field} is larger than {Image.MAX_IMAGE_PIXELS} pixels; send smaller images"
            ) from None
        except Exception:  # another format, or not an image at all
            raise WireError(
                f"{field} is not a base64 {fmt} file (encoding '{encoding}' takes {fmt} only)"
            ) from None
        if images and image.size != images[0].size:
            raise WireError(
                f"{field} is {image.size[0]}x{image.size[1]}, 'samples.data[0]' is "
                f"{images[0].size[0]}x{images[0].size[1]}; send images of one size"
            )
        total += image.size[0] * image.size[1]
        if total > max_pixels:
            raise WireError(
                f"'samples.data' holds more than {max_pixels} pixels, the server's budget per "
                "request (vgrpo serve-reward --max-pixels); send fewer or smaller images"
            )
        images.append(image)
    width, height = images[0].size
    out = np.empty((len(images), height, width, 3), dtype=np.uint8)
    for i, opened in enumerate(images):
        try:
            out[i] = np.asarray(opened.convert("RGB"))
        except Exception as exc:  # a truncated or corrupt file
            raise WireError(f"'samples.data[{i}]' is a {fmt} file that does not decode: {exc}") from None
    return torch.from_numpy(out).permute(0, 3, 1, 2).float().div_(255)


def encode_request(samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]) -> bytes:
    """Protocol 1's JSON body of ``POST /score`` (servers still accept it; ``encode_frame`` is protocol 2)."""
    body = {
        "protocol": 1,
        "samples": encode_samples(samples),
        "prompts": list(prompts),
        "metadata": [{k: v for k, v in m.items() if k not in LOCAL_METADATA} for m in metadata],
    }
    return json.dumps(body).encode()


def decode_request(body: bytes, max_pixels: int = MAX_PIXELS) -> ScoreRequest:
    """The request in a protocol-1 JSON body (the inverse of ``encode_request``)."""
    request = _loads(body, "the body")
    if not isinstance(request, dict):
        raise WireError("the body must be a JSON object")
    if request.get("protocol") == 2:
        raise WireError(f"protocol 2 travels as a frame (Content-Type {FRAME_TYPE}), not as JSON")
    if request.get("protocol") != 1:
        raise WireError(
            f"protocol {request.get('protocol')!r} requested, this server speaks 1 (JSON) and 2 (a frame)"
        )
    return _request(1, decode_samples(request.get("samples"), max_pixels), request)


# ------------------------------------------------------------------------------------- scores (both)
def encode_scores(out: torch.Tensor | Mapping[str, torch.Tensor]) -> dict[str, list[float | None]]:
    """A reward's output as ``{"score": [...], "<criterion>": [...]}`` of float32 values; a value that is
    not finite is ``null`` (JSON has no NaN), which ``decode_scores`` reads back as NaN."""
    terms = out if isinstance(out, Mapping) else {"score": out}
    return {
        str(k): [
            x if math.isfinite(x) else None
            for x in torch.as_tensor(v).detach().to("cpu", torch.float32).reshape(-1).tolist()
        ]
        for k, v in terms.items()
    }


def decode_scores(reply: Any, batch: int) -> dict[str, torch.Tensor]:
    """The ``scores`` of a reply as ``[batch]`` float32 tensors (``null``: NaN, which scoring then refuses
    as in process); a missing or short entry is an error."""
    scores = reply.get("scores") if isinstance(reply, Mapping) else None
    if not isinstance(scores, Mapping) or "score" not in scores:
        raise WireError("the reply has no 'scores' object with a 'score' entry")
    out = {}
    for key, values in scores.items():
        if not isinstance(values, list) or not all(v is None or isinstance(v, int | float) for v in values):
            raise WireError(f"'scores.{key}' is not a list of numbers")
        if len(values) != batch:
            raise WireError(f"'scores.{key}' has {len(values)} values for {batch} samples")
        out[str(key)] = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)
    return out
