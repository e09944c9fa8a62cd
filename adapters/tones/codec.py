"""The tones model's latent space: a log-magnitude spectrogram, decoded with Griffin-Lim (torchaudio).

Why a spectrogram and not the waveform framed into ``[C, T]``: framing is exactly invertible, but a
tone's samples depend on its phase, which the prompt leaves free, so a tiny model would have to learn
every phase of every sine; a magnitude spectrogram drops the phase, and a beep becomes one bright row,
a sweep a diagonal, a click a short column: shapes a tiny transformer learns like the shapes world's
pictures. The cost is a lossy decode: Griffin-Lim estimates a phase (deterministically here:
``rand_init=False``), which keeps pitch, timing and loudness, what the ``tones`` reward hears, and
smears a little (tested: every synthesised prompt's encoded and decoded clip is still judged correct).

Latents are ``[BINS, FRAMES]`` = ``[65, 126]``: 16 ms Hann windows every 8 ms of the world's 1 s at
8 kHz; each bin's magnitude in dB, ``[DB_FLOOR, DB_CEIL]`` mapped to ``[-1, 1]`` (the floor decodes
to silence).
"""

from __future__ import annotations

import torch

from vgrpo_platform.errors import PluginError

try:
    import torchaudio
except ImportError as exc:  # the `audio` extra, as for the audio rewards
    raise PluginError(
        f"the tones adapter needs torchaudio, which failed to import ({exc}); install the torchaudio of "
        "your torch's version: pip install 'vgrpo[audio]' with the README's torch constraint"
    ) from None

SAMPLE_RATE = 8000
N_SAMPLES = 8000  # one second, the tones world's clip
N_FFT, HOP = 128, 64
BINS, FRAMES = N_FFT // 2 + 1, N_SAMPLES // HOP + 1
DB_FLOOR, DB_CEIL = -40.0, 30.0  # a full-scale sine peaks near 30 dB at this window; -40 dB is inaudible
GRIFFIN_LIM_ITERS = 32


class SpectrogramCodec(torch.nn.Module):
    """Waveforms ``[B, N_SAMPLES]`` <-> latents ``[B, BINS, FRAMES]`` in ``[-1, 1]``."""

    def __init__(self) -> None:
        super().__init__()
        self.spectrogram = torchaudio.transforms.Spectrogram(n_fft=N_FFT, hop_length=HOP, power=1.0)
        self.griffin_lim = torchaudio.transforms.GriffinLim(
            n_fft=N_FFT,
            hop_length=HOP,
            power=1.0,
            n_iter=GRIFFIN_LIM_ITERS,
            length=N_SAMPLES,
            rand_init=False,  # a deterministic decode: the same latents give the same clip
        )

    def encode(self, waves: torch.Tensor) -> torch.Tensor:
        """``[B, N_SAMPLES]`` in ``[-1, 1]`` -> ``[B, BINS, FRAMES]`` in ``[-1, 1]``."""
        db = 20 * torch.log10(self.spectrogram(waves.float()).clamp(min=1e-6))
        return ((db - DB_FLOOR) / (DB_CEIL - DB_FLOOR) * 2 - 1).clamp(-1, 1)

    def magnitude(self, latents: torch.Tensor) -> torch.Tensor:
        """The linear magnitude a latent stands for; the floor (-1) is exactly 0."""
        db = (latents.float().clamp(-1, 1) + 1) / 2 * (DB_CEIL - DB_FLOOR) + DB_FLOOR
        return (10 ** (db / 20) - 10 ** (DB_FLOOR / 20)).clamp(min=0)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[B, BINS, FRAMES]`` -> waveforms ``[B, N_SAMPLES]`` in ``[-1, 1]`` (Griffin-Lim)."""
        return self.griffin_lim(self.magnitude(latents)).clamp(-1, 1)
