"""The procedural "tones" world: prompt grammar, clip specs, the synthesiser and the train / held-out split.

A clip is one second of 8 kHz mono audio holding one to three short events, and nothing else, in
the order the prompt names them; silence between and around them. The prompt describes the *whole*
clip, so the programmatic reward (``detect.py``) is exact on synthesised clips and strict on
generated ones.

Events (*atoms*)::

    beep    "a low beep" | "a mid beep" | "a high beep"   (a steady sine near 300, 700 or 1600 Hz)
    click   "a short click"                                (a 15 ms decaying noise burst)
    sweep   "a rising tone" | "a falling tone"             (a 2.6-octave exponential chirp)

Grammar (every prompt is one of two templates, at most three events in all)::

    group     "a high beep" | "two low beeps" | "three short clicks"
    sequence  "<group> then <group>" e.g. "a high beep then a low beep", "two short clicks then a rising tone"
              (two different atoms; counts 1 + 1, 2 + 1 or 1 + 2)

Train / held-out split (``split_prompts``): a fixed seed picks one beep pitch and one sweep
direction, the held-out atoms H. Train shows every H atom only *alone* (group prompts); every
sequence that contains an H atom is held out. So each held-out prompt puts an atom the model has
heard into a sequence (a neighbour and an order) in which pretraining never played it, while every
event kind, and the order of two events, still occur in train's sequences.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from vgrpo_rewards._split import halves_by_kind

SAMPLE_RATE = 8000
DURATION_S = 1.0
N_SAMPLES = int(SAMPLE_RATE * DURATION_S)

PITCH_HZ: dict[str, float] = {"low": 300.0, "mid": 700.0, "high": 1600.0}  # ~1.2 octaves apart
SWEEP_HZ = (400.0, 2400.0)  # a rising tone's start and end; a falling one runs them backwards
DIRECTIONS = ("rising", "falling")
KINDS = ("beep", "click", "sweep")
NUMBERS: dict[int, str] = {1: "a", 2: "two", 3: "three"}
MAX_EVENTS = 3

FREQ_JITTER = 0.06  # each event's frequencies are scaled by a factor in [1 - j, 1 + j]
BEEP_S = (0.12, 0.18)  # event lengths in seconds, drawn uniformly
SWEEP_S = (0.18, 0.24)
CLICK_S = 0.015
CLICK_DECAY_S = 0.004
AMPLITUDE = (0.35, 0.7)  # peak amplitude of a beep or a sweep
CLICK_AMPLITUDE = (0.7, 0.9)  # a click's noise is scaled up: its energy is in a few milliseconds
MIN_GAP_S = 0.07  # silence between two events, at least
MARGIN_S = 0.04  # silence before the first and after the last event, at least
FADE_S = 0.005  # raised-cosine fade in and out of beeps and sweeps (no clicks at their edges)


@dataclass(frozen=True)
class Atom:
    """One kind of event: a beep of a ``pitch``, a click, or a sweep of a ``direction``."""

    kind: str
    detail: str | None = None  # the pitch of a beep, the direction of a sweep, None for a click

    def __post_init__(self) -> None:
        valid = {"beep": tuple(PITCH_HZ), "click": (None,), "sweep": DIRECTIONS}
        if self.kind not in valid or self.detail not in valid[self.kind]:
            raise ValueError(f"unknown event {self.kind} {self.detail}; kinds {KINDS}")

    def noun(self, count: int) -> str:
        """The words after the number: "high beep", "short clicks", "rising tone"."""
        plural = "s" if count > 1 else ""
        if self.kind == "beep":
            return f"{self.detail} beep{plural}"
        if self.kind == "click":
            return f"short click{plural}"
        return f"{self.detail} tone{plural}"


ATOMS: tuple[Atom, ...] = (
    *(Atom("beep", p) for p in PITCH_HZ),
    Atom("click"),
    *(Atom("sweep", d) for d in DIRECTIONS),
)


@dataclass(frozen=True)
class Group:
    """``count`` events of the same atom in a row."""

    atom: Atom
    count: int = 1

    def phrase(self) -> str:
        return f"{NUMBERS[self.count]} {self.atom.noun(self.count)}"


@dataclass(frozen=True)
class ClipSpec:
    """What a prompt asks for: one group, or two groups of different atoms played one after the other."""

    groups: tuple[Group, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.groups) <= 2:
            raise ValueError(f"a clip has one or two groups of events, got {len(self.groups)}")
        if any(g.count not in NUMBERS for g in self.groups):
            raise ValueError(f"a group has 1 to {max(NUMBERS)} events")
        if len(self.events()) > MAX_EVENTS:
            raise ValueError(f"at most {MAX_EVENTS} events per clip, got {len(self.events())}")
        if len(self.groups) == 2 and self.groups[0].atom == self.groups[1].atom:
            raise ValueError("the two groups of a sequence must differ; use a count instead")

    def events(self) -> list[Atom]:
        """Every event of the clip in playing order, groups expanded by their count."""
        return [g.atom for g in self.groups for _ in range(g.count)]

    def to_prompt(self) -> str:
        return " then ".join(g.phrase() for g in self.groups)


# ---------------------------------------------------------------------------------------- parsing
_NUM_WORDS = {v: k for k, v in NUMBERS.items()} | {"an": 1, "one": 1}
_GROUP = r"(a|an|one|two|three)\s+(?:(low|mid|high)\s+beep|short\s+click|(rising|falling)\s+tone)(s?)"
_PROMPT_RE = re.compile(rf"^{_GROUP}(?:\s+then\s+{_GROUP})?$")


def _group(num: str, pitch: str | None, direction: str | None, plural: str, text: str) -> Group:
    count = _NUM_WORDS[num]
    if (count > 1) != bool(plural):
        raise ValueError(f"number and noun disagree in {text!r}")
    atom = Atom("beep", pitch) if pitch else Atom("sweep", direction) if direction else Atom("click")
    return Group(atom, count)


@lru_cache(maxsize=4096)
def parse_prompt(text: str) -> ClipSpec:
    """The clip a prompt asks for; the exact inverse of ``ClipSpec.to_prompt`` (case, surrounding
    spaces, a trailing full stop and repeated spaces are tolerated). Raises ``ValueError``."""
    norm = " ".join(text.strip().lower().rstrip(".").split())
    m = _PROMPT_RE.match(norm)
    if m is None:
        raise ValueError(f"not a tones-world prompt: {text!r} (e.g. 'a high beep then two short clicks')")
    g = m.groups()
    first = _group(*g[0:4], text)
    if g[4] is None:
        return ClipSpec((first,))
    return ClipSpec((first, _group(*g[4:8], text)))


# ----------------------------------------------------------------------------------- enumeration
SEQUENCE_COUNTS = ((1, 1), (2, 1), (1, 2))


def all_specs() -> list[ClipSpec]:
    """Every clip of the two templates, in a fixed order: each atom in groups of 1 to 3, then every
    ordered pair of different atoms with counts 1 + 1, 2 + 1 and 1 + 2."""
    specs = [ClipSpec((Group(a, n),)) for n in NUMBERS for a in ATOMS]
    specs += [
        ClipSpec((Group(a, i), Group(b, j)))
        for i, j in SEQUENCE_COUNTS
        for a, b in itertools.permutations(ATOMS, 2)
    ]
    return specs


def all_prompts() -> list[str]:
    return [s.to_prompt() for s in all_specs()]


def heldout_atoms(seed: int = 0) -> frozenset[Atom]:
    """The atoms H that train never plays in a sequence: one beep pitch and one sweep direction, drawn
    with ``seed`` (a click is the only atom of its kind: holding it out would hide a whole kind)."""
    rng = np.random.default_rng(seed)
    pitch = str(rng.choice(list(PITCH_HZ)))
    direction = str(rng.choice(list(DIRECTIONS)))
    return frozenset({Atom("beep", pitch), Atom("sweep", direction)})


def is_heldout(spec: ClipSpec, held: frozenset[Atom]) -> bool:
    """The split rule: a sequence that contains a held-out atom."""
    return len(spec.groups) == 2 and any(g.atom in held for g in spec.groups)


def split_prompts(seed: int = 0) -> tuple[list[str], list[str]]:
    """``(train, heldout)``: a deterministic partition of ``all_prompts()`` by ``is_heldout``."""
    held = heldout_atoms(seed)
    train, heldout = [], []
    for spec in all_specs():
        (heldout if is_heldout(spec, held) else train).append(spec.to_prompt())
    return train, heldout


def train_prompts(seed: int = 0) -> list[str]:
    return split_prompts(seed)[0]


def heldout_prompts(seed: int = 0) -> list[str]:
    return split_prompts(seed)[1]


# ----------------------------------------------------------------------------------- synthesis
def heldout_validation_split(seed: int = 0, split_seed: int = 0) -> tuple[list[str], list[str]]:
    """``(validation, reported)``: the held-out prompts in two disjoint halves (``halves_by_kind``), a
    kind being which held-out atom each group plays (or none), so both halves hold every held-out atom,
    first and second in its sequence."""
    held = heldout_atoms(seed)

    def kind(spec: ClipSpec) -> tuple[str, ...]:
        return tuple(f"{g.atom.kind} {g.atom.detail}" if g.atom in held else "-" for g in spec.groups)

    return halves_by_kind(
        ((kind(spec), spec.to_prompt()) for spec in all_specs() if is_heldout(spec, held)), split_seed
    )


def event_length(atom: Atom, rng: np.random.Generator) -> float:
    """Seconds one event of ``atom`` lasts."""
    if atom.kind == "click":
        return CLICK_S
    lo, hi = BEEP_S if atom.kind == "beep" else SWEEP_S
    return float(rng.uniform(lo, hi))


def timeline(events: list[Atom], rng: np.random.Generator) -> list[tuple[float, float]]:
    """``(start, length)`` in seconds of each event, in order: random lengths, and the free time split
    at random between the margins and the gaps (each at least ``MARGIN_S`` / ``MIN_GAP_S``)."""
    lengths = [event_length(a, rng) for a in events]
    fixed = 2 * MARGIN_S + MIN_GAP_S * (len(events) - 1) + sum(lengths)
    free = DURATION_S - fixed
    if free < 0:
        raise ValueError(f"{len(events)} events do not fit in {DURATION_S} s")
    shares = rng.dirichlet(np.ones(len(events) + 1)) * free  # before, between..., after
    out, t = [], MARGIN_S
    for k, length in enumerate(lengths):
        t += float(shares[k]) + (MIN_GAP_S if k else 0.0)
        out.append((t, length))
        t += length
    return out


def _fade(n: int) -> np.ndarray:
    """Raised-cosine fade in and out over ``FADE_S`` at both ends of ``n`` samples."""
    k = min(int(FADE_S * SAMPLE_RATE), n // 2)
    env = np.ones(n)
    ramp = 0.5 - 0.5 * np.cos(np.pi * np.arange(k) / k)
    env[:k], env[n - k :] = ramp, ramp[::-1]
    return env


def synth_event(atom: Atom, length: float, rng: np.random.Generator) -> np.ndarray:
    """One event's samples (float64): a faded sine, a faded exponential chirp or a decaying noise burst."""
    n = max(1, int(round(length * SAMPLE_RATE)))
    t = np.arange(n) / SAMPLE_RATE
    if atom.kind == "click":
        amp = rng.uniform(*CLICK_AMPLITUDE)
        return amp * rng.standard_normal(n).clip(-3, 3) / 3 * np.exp(-t / CLICK_DECAY_S)
    amp = rng.uniform(*AMPLITUDE)
    phase = rng.uniform(0, 2 * np.pi)
    jitter = rng.uniform(1 - FREQ_JITTER, 1 + FREQ_JITTER)
    if atom.kind == "beep":
        f = PITCH_HZ[str(atom.detail)] * jitter
        return amp * _fade(n) * np.sin(2 * np.pi * f * t + phase)
    f0, f1 = SWEEP_HZ if atom.detail == "rising" else SWEEP_HZ[::-1]
    f0, f1 = f0 * jitter, f1 * jitter
    k = np.log(f1 / f0) / length  # f(t) = f0 exp(k t)
    return amp * _fade(n) * np.sin(2 * np.pi * f0 * np.expm1(k * t) / k + phase)


def synthesise(spec: ClipSpec | str, rng: np.random.Generator | int | None = None) -> np.ndarray:
    """A clip of the spec: ``[N_SAMPLES]`` float32 in ``[-1, 1]``; the same ``rng`` seed gives the same
    clip (timings, lengths, frequencies, amplitudes, phases and click noise all come from it)."""
    spec = parse_prompt(spec) if isinstance(spec, str) else spec
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    events = spec.events()
    clip = np.zeros(N_SAMPLES)
    for atom, (start, length) in zip(events, timeline(events, rng), strict=True):
        wave = synth_event(atom, length, rng)
        i = int(round(start * SAMPLE_RATE))
        clip[i : i + len(wave)] += wave[: N_SAMPLES - i]
    return clip.clip(-1, 1).astype(np.float32)
