"""The tones world: grammar round trip, a deterministic synthesiser, and the compositional split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from vgrpo_rewards.tones import world as w
from vgrpo_rewards.tones.prompt_files import FILES, main, write_prompt_files


def test_enumeration_counts_and_uniqueness():
    n = len(w.ATOMS)
    prompts = w.all_prompts()
    assert len(prompts) == n * len(w.NUMBERS) + n * (n - 1) * len(w.SEQUENCE_COUNTS) == len(set(prompts))


def test_parse_inverts_to_prompt_on_every_prompt():
    for spec in w.all_specs():
        text = spec.to_prompt()
        assert w.parse_prompt(text) == spec and w.parse_prompt(text).to_prompt() == text


def test_parse_examples_and_errors():
    spec = w.parse_prompt("  A High beep then  two short CLICKS. ")
    assert spec.events() == [w.Atom("beep", "high"), w.Atom("click"), w.Atom("click")]
    assert w.parse_prompt("a rising tone").events() == [w.Atom("sweep", "rising")]
    for bad in ("a red circle", "two high beep", "a high beep then a high beep", "three clicks then a click"):
        with pytest.raises(ValueError):
            w.parse_prompt(bad)


def test_synthesiser_is_deterministic_per_seed_and_bounded():
    for prompt in ("three short clicks", "a high beep then a falling tone", "two rising tones"):
        a, b = w.synthesise(prompt, 7), w.synthesise(prompt, 7)
        assert a.dtype == np.float32 and a.shape == (w.N_SAMPLES,)
        assert np.array_equal(a, b)
        assert not np.array_equal(a, w.synthesise(prompt, 8))  # the seed draws timings, pitches, noise
        assert np.abs(a).max() <= 1.0 and np.abs(a).max() > 0.3
        # silence at both margins and sound in between
        margin = int(w.MARGIN_S * w.SAMPLE_RATE) - 1
        assert not a[:margin].any() and not a[-margin:].any()


def test_timeline_keeps_gaps_and_margins():
    rng = np.random.default_rng(0)
    for spec in w.all_specs():
        events = spec.events()
        times = w.timeline(events, rng)
        assert times[0][0] >= w.MARGIN_S - 1e-9 and sum(times[-1]) <= w.DURATION_S - w.MARGIN_S + 1e-9
        for (s0, l0), (s1, _) in zip(times, times[1:], strict=False):
            assert s1 - (s0 + l0) >= w.MIN_GAP_S - 1e-9


def test_a_beep_sounds_at_its_pitch():
    clip = w.synthesise("a high beep", 0)
    spectrum = np.abs(np.fft.rfft(clip))
    peak = np.fft.rfftfreq(len(clip), 1 / w.SAMPLE_RATE)[spectrum.argmax()]
    assert abs(peak - w.PITCH_HZ["high"]) <= w.FREQ_JITTER * w.PITCH_HZ["high"] + 2


def test_split_is_a_disjoint_cover_by_the_rule():
    train, held = w.split_prompts()
    assert set(train).isdisjoint(held) and sorted(train + held) == sorted(w.all_prompts())
    atoms = w.heldout_atoms()
    assert {a.kind for a in atoms} == {"beep", "sweep"}
    for prompt in held:  # a held-out prompt is a sequence holding a held-out atom ...
        spec = w.parse_prompt(prompt)
        assert len(spec.groups) == 2 and {g.atom for g in spec.groups} & atoms
    train_sequences = [w.parse_prompt(p) for p in train if " then " in p]
    heard_in_sequences = {g.atom for s in train_sequences for g in s.groups}
    assert not heard_in_sequences & atoms  # ... never played in a sequence in train,
    assert {a for s in map(w.parse_prompt, train) for a in s.events()} == set(w.ATOMS)  # but heard alone
    assert {a.kind for a in heard_in_sequences} == set(w.KINDS)  # every kind still occurs in a sequence
    assert w.split_prompts(seed=0) == w.split_prompts(seed=0)


def test_committed_prompt_files_are_the_split(tmp_path: Path):
    root = Path(__file__).resolve().parents[1] / "recipes" / "prompts"
    for name, prompts in zip(FILES, w.split_prompts(), strict=True):
        assert (root / name).read_text().splitlines() == prompts
    assert main([str(tmp_path)]) == 0
    assert [p.name for p in write_prompt_files(tmp_path)] == list(FILES)
    assert main([]) == 2
