"""Playable files beside a sample grid: a grid shows a sound only as its spectrogram and a video only
as a filmstrip, so an evaluation also keeps a few of them to listen to and watch.

Beside ``samples/eval_NNNNNN.png`` the folder ``samples/eval_NNNNNN/`` gets ``<prompt>_<k>.wav``: the
first ``SOUNDS_PER_PROMPT`` samples of each of the first ``PROMPTS_WITH_CLIPS`` prompts (16-bit WAV,
cut to ``MAX_SECONDS``), and for video ``<prompt>_0.mp4``, the first sample of each of those prompts
(H.264 through the ffmpeg that ships in the imageio-ffmpeg wheel: no system package), with its
soundtrack as ``<prompt>_0.wav`` where the model makes one. The count is bounded, so a long run's
folder stays small; ``vgrpo report`` embeds the sounds next to their grid.
"""

from __future__ import annotations

from pathlib import Path

from vgrpo_platform import media
from vgrpo_platform.protocols import Samples

SOUNDS_PER_PROMPT = 2
PROMPTS_WITH_CLIPS = 16
MAX_SECONDS = 10.0


def clip_folder(grid: Path) -> Path:
    """Where the clips of ``grid`` go: its path without the suffix (``eval_000050.png`` -> ``eval_000050/``,
    which ``vgrpo report`` reads)."""
    return grid.with_suffix("")


def save_clips(samples: Samples, folder: Path, *, group_size: int) -> list[Path]:
    """Write the bounded set of sounds (and videos) described above; ``[]`` for images."""
    if samples.modality not in ("audio", "video"):
        return []
    sounds = samples.for_modalities({"audio"})
    written: list[Path] = []
    n_prompts = min(-(-len(samples) // group_size), PROMPTS_WITH_CLIPS)
    per_prompt = SOUNDS_PER_PROMPT if samples.modality == "audio" else 1
    for p in range(n_prompts):
        for k in range(min(per_prompt, group_size)):
            i = p * group_size + k
            if i >= len(samples):
                break
            folder.mkdir(parents=True, exist_ok=True)
            if samples.modality == "video":
                fps = samples.fps or 16.0
                written.append(media.write_video(samples.data[i], folder / f"{p}_{k}.mp4", fps))
            if sounds is not None and sounds.sample_rate:
                cut = sounds.data[i][..., : int(MAX_SECONDS * sounds.sample_rate)]
                written.append(media.write_audio(cut, folder / f"{p}_{k}.wav", sounds.sample_rate))
    return written
