"""Hear the events of a clip and score them against its prompt: the ``tones`` reward's judge.

Built on torchaudio: one power spectrogram per clip (``torchaudio.transforms.Spectrogram``, 16 ms
Hann windows every 4 ms) gives both tracks the judge reads:

- the *energy envelope* (frame energy in dB): frames within ``rel_db`` of the clip's loudest frame
  and above ``floor_db`` are active; runs of active frames closer than ``merge_s`` are one event, runs
  shorter than ``min_event_s`` are dropped (onsets are the runs' starts);
- the *peak track* (each frame's strongest frequency bin): an event shorter than ``click_max_s`` is a
  click; a longer one is a tone only if it is tonal (its peak holds at least ``tonal_share`` of a
  frame's power, median over its frames; noise spreads it thin) and not longer than ``max_tone_s``,
  else it is a sound of no atom, which matches nothing. A tone whose peak moves by at least
  ``sweep_octaves`` from its first quarter to its last is a sweep of that direction, else a beep,
  classed by its median peak frequency (boundaries at the geometric means of the world's pitches).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torchaudio

from .world import PITCH_HZ, SAMPLE_RATE, Atom, ClipSpec

CRITERIA = ("count", "kind", "pitch", "direction", "order")
N_FFT, HOP = 128, 32  # 16 ms windows, 4 ms hop at 8 kHz: 62.5 Hz bins


@dataclass(frozen=True)
class DetectorParams:
    rel_db: float = 25.0  # active frames are within this many dB of the clip's loudest frame ...
    floor_db: float = -20.0  # ... and above this absolute frame energy (dB of the power spectrogram's sum)
    merge_s: float = 0.03  # active runs closer than this are one event
    min_event_s: float = 0.008  # shorter runs are noise
    click_max_s: float = 0.06  # shorter events are clicks (beeps and sweeps last 0.12 s or more)
    sweep_octaves: float = 0.8  # a pitch change from the first to the last quarter that makes a sweep
    # median share of a frame's power in its peak bin +-1 that makes a tone. Every prompt's synthesised
    # clip is judged right at 0.9 too (a test checks that margin); 0.2 (before 2026-12-07) let RL pass
    # off noise-smeared events as tones, so the verdicts rose more than the sounds did.
    tonal_share: float = 0.85
    max_tone_s: float = 0.4  # longer events are no atom (the world's tones last 0.24 s at most)
    max_events: int = 6  # the loudest events matched to the prompt's


@dataclass(frozen=True)
class Event:
    start_s: float
    length_s: float
    atom: Atom | None  # None: a sound of no atom (noise, a drone), which matches nothing
    energy: float  # the event's summed frame energy: which events are the loudest


_SPECTROGRAM = torchaudio.transforms.Spectrogram(n_fft=N_FFT, hop_length=HOP, power=2.0)
PITCH_EDGES = [math.sqrt(a * b) for a, b in itertools.pairwise(PITCH_HZ.values())]


def pitch_class(freq: float) -> str:
    """The world's pitch nearest ``freq`` on a log scale."""
    return list(PITCH_HZ)[sum(freq > edge for edge in PITCH_EDGES)]


def _runs(active: list[bool], merge: int, min_len: int) -> list[tuple[int, int]]:
    """``[start, end)`` frame ranges of active runs, gaps shorter than ``merge`` bridged."""
    runs: list[list[int]] = []
    for i, on in enumerate(active):
        if not on:
            continue
        if runs and i - runs[-1][1] < merge:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [(a, b) for a, b in runs if b - a >= min_len]


def classify(power: torch.Tensor, length_s: float, params: DetectorParams) -> Atom | None:
    """The atom of one event from its power spectrogram ``[bins, frames]``; None when it is none."""
    if length_s < params.click_max_s:
        return Atom("click")
    peak = power[1:].argmax(0) + 1  # [frames] strongest bin, DC excluded
    near = torch.stack(
        [power[(peak + k).clamp(0, power.shape[0] - 1), range(power.shape[1])] for k in (-1, 0, 1)]
    )
    share = near.sum(0) / power.sum(0).clamp(min=1e-12)  # [frames] power within a bin of the peak
    if length_s > params.max_tone_s or float(share.median()) < params.tonal_share:
        return None
    octaves = torch.log2(peak.float() * SAMPLE_RATE / N_FFT)
    q = max(1, octaves.numel() // 4)
    change = float(octaves[-q:].median() - octaves[:q].median())
    if abs(change) >= params.sweep_octaves:
        return Atom("sweep", "rising" if change > 0 else "falling")
    return Atom("beep", pitch_class(float(2 ** octaves.median())))


def detect(wave: torch.Tensor, params: DetectorParams = DetectorParams()) -> list[Event]:
    """The events of a mono clip ``[samples]`` at the world's rate, in time order."""
    power = _SPECTROGRAM(wave.detach().float().cpu())  # [bins, frames]
    energy_db = 10 * torch.log10(power.sum(0) + 1e-10)  # [frames]
    threshold = max(float(energy_db.max()) - params.rel_db, params.floor_db)
    frame_s = HOP / SAMPLE_RATE
    runs = _runs(
        (energy_db > threshold).tolist(),
        merge=max(1, round(params.merge_s / frame_s)),
        min_len=max(1, round(params.min_event_s / frame_s)),
    )
    events = []
    for a, b in runs:
        length = (b - a) * frame_s
        loud = energy_db[a:b] > threshold  # the frames of the event itself, not the bridged gaps
        frames = power[:, a:b][:, loud]
        events.append(Event(a * frame_s, length, classify(frames, length, params), float(frames.sum())))
    return events


def score_events(events: list[Event], spec: ClipSpec, max_events: int = 6) -> dict[str, float]:
    """Per-criterion scores of the detected events against the prompt's clip.

    The prompt's events are matched one-to-one to the ``max_events`` loudest detections, maximising
    right kinds and details (pitch, direction), then the order. With ``n`` events asked for, ``m``
    detected and ``k = min(n, m)`` matched:

    - ``count``: ``min(n, m) / max(n, m)`` (the prompt describes the whole clip: extras count);
    - ``kind``: fraction of the ``k`` matched events of the right kind (0 when nothing is matched);
    - ``pitch`` / ``direction``: fraction of the matched beeps / sweeps of the prompt heard as a beep
      of the right pitch / a sweep of the right direction; 1 when the prompt has none (not applicable);
    - ``order``: for a sequence, 1 when every event is matched and the matched events play in the
      prompt's order, else 0; 1 for a single group (not applicable);
    - ``correct``: 1 when all five are 1.
    """
    wanted = spec.events()
    loudest = sorted(sorted(events, key=lambda e: -e.energy)[:max_events], key=lambda e: e.start_s)
    n, m = len(wanted), len(loudest)
    padded: list[int | None] = list(range(m)) + [None] * max(0, n - m)
    best: tuple[tuple[int, int], tuple[int | None, ...]] | None = None
    for perm in itertools.permutations(padded, n):
        hits = sum(_hits(loudest[j].atom, a) for a, j in zip(wanted, perm, strict=True) if j is not None)
        key = (hits, _in_order(perm))
        if best is None or key > best[0]:
            best = (key, perm)
    assert best is not None
    perm = best[1]
    matched = [(a, loudest[j].atom) for a, j in zip(wanted, perm, strict=True) if j is not None]

    def detail(kind: str) -> float:
        pairs = [(a, d) for a, d in matched if a.kind == kind]
        if not any(a.kind == kind for a in wanted):
            return 1.0
        return sum(a == d for a, d in pairs) / len(pairs) if pairs else 0.0

    scores = {
        "count": min(n, m) / max(n, m) if max(n, m) else 1.0,
        "kind": sum(d is not None and a.kind == d.kind for a, d in matched) / len(matched)
        if matched
        else 0.0,
        "pitch": detail("beep"),
        "direction": detail("sweep"),
        "order": float(_in_order(perm)) if len(spec.groups) == 2 else 1.0,
    }
    scores["correct"] = float(all(scores[c] == 1.0 for c in CRITERIA))
    return scores


def _hits(heard: Atom | None, wanted: Atom) -> int:
    """Right kind, plus right detail: 0 to 2."""
    return 0 if heard is None else (heard.kind == wanted.kind) + (heard == wanted)


def _in_order(perm: tuple[int | None, ...]) -> bool:
    """Every event matched, and the matched detections' indices increasing in the prompt's order."""
    return None not in perm and all(a < b for a, b in itertools.pairwise(perm))  # type: ignore[operator]


def applicable(spec: ClipSpec) -> dict[str, bool]:
    """Which criteria a prompt tests: ``pitch`` needs a beep, ``direction`` a sweep, ``order`` a sequence."""
    kinds = {a.kind for a in spec.events()}
    return {
        "count": True,
        "kind": True,
        "pitch": "beep" in kinds,
        "direction": "sweep" in kinds,
        "order": len(spec.groups) == 2,
    }


def score_clip(
    wave: torch.Tensor, spec: ClipSpec, params: DetectorParams = DetectorParams()
) -> dict[str, float]:
    """``score_events(detect(wave))``: a mono clip ``[samples]`` against ``spec``."""
    return score_events(detect(wave, params), spec, params.max_events)
