"""One picture per sample for the sample grids: an image as itself, a video as a filmstrip, audio as
its spectrogram, so every modality gets grids, before/after pictures and report pages.

A filmstrip holds a few evenly spaced frames (the first and the last included) side by side, each
scaled to the grid's frame height, so the motion reads left to right. A sound's picture is its
log-magnitude spectrogram (time left to right, low frequencies at the bottom) in a fixed dark-to-bright
colour map, twice as wide as high.
"""

from __future__ import annotations

import torch
from PIL import Image

from vgrpo_platform.protocols import Samples

STRIP_GAP = 2  # pixels of background between a filmstrip's frames
BACKGROUND = (255, 255, 255)
DYNAMIC_RANGE_DB = 60.0  # a spectrogram shows its loudest 60 dB; quieter is black
# the colour map: dark blue-black -> purple -> orange -> pale yellow (quiet to loud), evenly spaced stops
COLOURS = torch.tensor(
    [[0, 0, 4], [60, 15, 110], [150, 40, 120], [230, 90, 60], [252, 200, 60], [252, 253, 191]]
).float()


def to_pictures(images: torch.Tensor, side: int) -> list[Image.Image]:
    """``[B, 3, H, W]`` in [0, 1] as pictures whose longer side is ``side`` (nearest neighbour when
    enlarged, so small samples stay sharp)."""
    x = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()  # [B, 3, H, W]
    out = []
    for frame in x:
        img = Image.fromarray(frame.transpose(1, 2, 0))
        scale = side / max(img.width, img.height)
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        out.append(img.resize(size, Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.BILINEAR))
    return out


def strip_indices(frames: int, count: int) -> list[int]:
    """``count`` evenly spaced frame indices of ``frames``, first and last included (all when fewer)."""
    if frames <= count:
        return list(range(frames))
    if count <= 1:
        return [frames // 2]
    return [round(k * (frames - 1) / (count - 1)) for k in range(count)]


def filmstrip(video: torch.Tensor, height: int, count: int) -> Image.Image:
    """A video ``[F, 3, H, W]`` as ``count`` of its frames side by side, each ``height`` pixels high."""
    picked = video[strip_indices(video.shape[0], count)]
    h, w = picked.shape[-2:]
    frames = to_pictures(picked, max(1, round(height * max(h, w) / h)))  # the longer side, for this height
    width = sum(f.width for f in frames) + STRIP_GAP * (len(frames) - 1)
    strip = Image.new("RGB", (width, max(f.height for f in frames)), BACKGROUND)
    x = 0
    for frame in frames:
        strip.paste(frame, (x, 0))
        x += frame.width + STRIP_GAP
    return strip


def spectrogram(waveform: torch.Tensor, columns: int = 128, n_fft: int = 256) -> torch.Tensor:
    """The log-magnitude spectrogram of ``waveform`` ``[channels, samples]`` (channels averaged) in
    [0, 1], ``[bins, frames]`` with the lowest frequency in the last row: 0 is the loudest minus
    ``DYNAMIC_RANGE_DB`` or quieter, 1 the loudest."""
    mono = waveform.detach().float().reshape(-1, waveform.shape[-1]).mean(0).cpu()
    n_fft = max(4, min(n_fft, mono.numel()))
    hop = max(1, mono.numel() // columns)
    window = torch.hann_window(n_fft)
    spec = torch.stft(mono, n_fft, hop_length=hop, window=window, center=False, return_complex=True)
    db = 20 * torch.log10(spec.abs() + 1e-6)
    top = db.max()
    scaled = ((db - (top - DYNAMIC_RANGE_DB)) / DYNAMIC_RANGE_DB).clamp(0, 1)
    return scaled.flip(0)


def colour(values: torch.Tensor) -> torch.Tensor:
    """``[H, W]`` in [0, 1] -> ``[3, H, W]`` in [0, 1] through ``COLOURS`` (linear between stops)."""
    position = values.clamp(0, 1) * (len(COLOURS) - 1)
    low = position.floor().long().clamp(max=len(COLOURS) - 2)
    frac = (position - low).unsqueeze(-1)
    rgb = COLOURS[low] * (1 - frac) + COLOURS[low + 1] * frac  # [H, W, 3]
    return (rgb / 255).permute(2, 0, 1)


def sound_picture(waveform: torch.Tensor, height: int) -> Image.Image:
    """A sound ``[channels, samples]`` as its coloured spectrogram, ``height`` high and twice as wide."""
    rgb = colour(spectrogram(waveform))
    pixels = (rgb * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(pixels).resize((2 * height, height), Image.Resampling.BILINEAR)


def sample_pictures(samples: Samples, side: int, strip_frames: int) -> list[Image.Image] | None:
    """One picture per sample: an image's longer side ``side``; a video's filmstrip of ``strip_frames``
    frames and an audio spectrogram ``side`` pixels high. None for other modalities."""
    data = samples.data
    if samples.modality == "image":
        return to_pictures(data, side)
    if samples.modality == "video":
        return [filmstrip(clip, side, strip_frames) for clip in data]
    if samples.modality == "audio":
        return [sound_picture(clip, side) for clip in data]
    return None
