"""benchmarks.profile_cpu's accounting: a region's self-time leaves out the regions nested in it,
regions outside an iteration are not counted, and the regions plus "everything else" add up."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def profile():
    from benchmarks import profile_cpu

    return profile_cpu


def test_nested_regions_count_self_time_only(profile, monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 3.5, 4.5, 10.0, 11.0])  # perf_counter at each enter / exit, in order
    monkeypatch.setattr(profile.time, "perf_counter", lambda: next(clock))
    regions = profile.Regions()
    regions.active = True
    forward = regions.wrap("model forward", lambda: None)

    def solve() -> None:  # a sampler that calls the model twice
        forward()
        forward()

    sampler = regions.wrap("sampler", solve)
    sampler()  # enter 0.0; forward 1.0 -> 3.0; forward 3.5 -> 4.5; exit 10.0
    assert regions.self_time == {"model forward": 3.0, "sampler": 7.0}
    regions.active = False
    assert sampler() is None and regions.self_time == {"model forward": 3.0, "sampler": 7.0}  # not counted


def test_the_loop_is_instrumented_without_changing_what_it_returns(profile):
    regions = profile.Regions()
    calls = []
    wrapped = regions.wrap("reward", lambda *a, **k: calls.append((a, k)) or "scores")
    regions.active = True
    assert wrapped(1, step=2) == "scores" and calls == [((1,), {"step": 2})]
    assert set(regions.self_time) == {"reward"} and regions.self_time["reward"] >= 0
