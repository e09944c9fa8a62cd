"""Video and audio files: mp4 via diffusers' ``export_to_video``, read with decord; WAV with soundfile.

Tensors follow ``Samples``: a video is ``[F, 3, H, W]`` float in ``[0, 1]``, audio ``[channels, samples]``
float in ``[-1, 1]``. decord ships x86_64 wheels only, so it is imported when a video is read, with an
actionable error where it is missing; soundfile is used for WAV because ``torchaudio.load/save`` need
torchcodec (and FFmpeg libraries) since torchaudio 2.9.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def write_video(frames: torch.Tensor, path: str | Path, fps: float = 16.0) -> Path:
    """Write ``frames`` ``[F, 3, H, W]`` in ``[0, 1]`` as an H.264 mp4 (imageio-ffmpeg through diffusers).

    ``macro_block_size=2`` keeps the frame size (yuv420p only needs even sides) instead of padding to 16.
    """
    from diffusers.utils import export_to_video

    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"a video must be [F, 3, H, W], got {tuple(frames.shape)}")
    array = frames.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()  # [F, H, W, 3]
    path = Path(path)
    export_to_video(list(array), str(path), fps=max(1, round(fps)), macro_block_size=2)
    return path


def read_video(path: str | Path, num_frames: int | None = None) -> torch.Tensor:
    """Frames ``[F, 3, H, W]`` float in ``[0, 1]`` decoded with decord; ``num_frames`` evenly spaced ones."""
    try:
        from decord import VideoReader, cpu
    except ImportError as exc:  # decord has x86_64 wheels only
        raise ImportError("reading videos needs decord (`pip install decord`, x86_64 only)") from exc
    reader = VideoReader(str(path), ctx=cpu(0))
    total = len(reader)
    if num_frames is None or num_frames >= total:
        index = list(range(total))
    else:
        index = np.linspace(0, total - 1, num_frames).round().astype(int).tolist()
    array = reader.get_batch(index).asnumpy()  # [F, H, W, 3] uint8
    return torch.from_numpy(array).permute(0, 3, 1, 2).float() / 255.0


def write_audio(waveform: torch.Tensor, path: str | Path, sample_rate: int) -> Path:
    """Write ``waveform`` ``[channels, samples]`` in ``[-1, 1]`` as 16-bit PCM WAV."""
    import soundfile

    if waveform.ndim != 2:
        raise ValueError(f"audio must be [channels, samples], got {tuple(waveform.shape)}")
    array = waveform.detach().float().clamp(-1, 1).cpu().numpy().T  # [samples, channels]
    path = Path(path)
    soundfile.write(str(path), array, int(sample_rate), subtype="PCM_16")
    return path


def read_audio(path: str | Path) -> tuple[torch.Tensor, int]:
    """``(waveform [channels, samples] float32 in [-1, 1], sample_rate)`` of an audio file."""
    import soundfile

    array, sample_rate = soundfile.read(str(path), dtype="float32", always_2d=True)  # [samples, channels]
    return torch.from_numpy(np.ascontiguousarray(array.T)), int(sample_rate)
