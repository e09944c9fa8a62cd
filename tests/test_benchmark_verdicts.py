"""benchmarks.verdicts: the paper's claims judged from per-seed figures, the Welch interval checked
against SciPy's own two-sample t-test, and each branch of the rule (confirmed, refuted, undecided,
a target some seeds never reached) on figures built by hand."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from scipy import stats


@pytest.fixture(scope="module")
def verdicts():
    from benchmarks import verdicts

    return verdicts


def _summary(methods: dict[str, list[dict]], ablations: dict[str, list[dict]] | None = None) -> dict:
    block = lambda groups: {k: {"seeds": v} for k, v in (groups or {}).items()}  # noqa: E731
    return {"methods": block(methods), "ablations": block(ablations)}


def _seeds(figure: str, values: list[float | None], **extra: float) -> list[dict]:
    return [{"seed": i, figure: v, **extra} for i, v in enumerate(values)]


def test_the_welch_interval_is_scipys_unequal_variance_t_interval(verdicts):
    a, b = [0.61, 0.64, 0.60], [0.55, 0.59, 0.50, 0.57]
    diff, lo, hi = verdicts.welch_interval(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(sum(a) / 3 - sum(b) / 4)
    assert (lo, hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert verdicts.welch_interval([1.0, 1.0], [0.5, 0.5]) == (0.5, 0.5, 0.5)  # no spread: a point


def test_a_difference_claim_is_confirmed_refuted_or_undecided_by_where_its_interval_lies(verdicts):
    claim = verdicts.Claim("x ends higher", ("methods", "vgrpo"), ("methods", "b"), "reward_end", "higher")
    ours = _seeds("reward_end", [0.62, 0.63, 0.64])
    cases = {
        "confirmed": [0.55, 0.56, 0.57],
        "refuted": [0.70, 0.71, 0.72],
        "undecided": [0.58, 0.63, 0.68],
    }
    for expected, theirs in cases.items():
        got = verdicts.judge(claim, _summary({"vgrpo": ours, "b": _seeds("reward_end", theirs)}))
        assert got["verdict"] == expected, got
    lower = verdicts.Claim("cv lower", ("methods", "vgrpo"), ("methods", "b"), "diag/cv", "lower")
    got = verdicts.judge(
        lower, _summary({"vgrpo": _seeds("diag/cv", [0.1, 0.11]), "b": _seeds("diag/cv", [0.3, 0.31])})
    )
    assert got["verdict"] == "confirmed"  # lower is better: a - b < 0 everywhere
    one = verdicts.judge(claim, _summary({"vgrpo": ours[:1], "b": _seeds("reward_end", [0.5, 0.5])}))
    assert one["verdict"] == "undecided" and "2+ seeds" in one["detail"]


def test_a_ratio_claim_reads_the_interval_of_the_ratio_against_the_claimed_factor(verdicts):
    claim = verdicts.Claim(
        "2x fewer steps",
        ("methods", "vgrpo"),
        ("methods", "b"),
        "steps_to_target",
        "ratio",
        2.0,
        budget="steps",
    )
    ours = _seeds("steps_to_target", [30, 33, 36], steps=150)

    def judged(theirs: list[float | None]) -> dict:
        return verdicts.judge(
            claim, _summary({"vgrpo": ours, "b": _seeds("steps_to_target", theirs, steps=150)})
        )

    assert judged([90, 99, 110])["verdict"] == "confirmed"  # ~3x: the whole interval at or above 2
    assert judged([40, 44, 47])["verdict"] == "refuted"  # ~1.3x: 2x lies above the interval
    assert judged([20, 22, 24])["verdict"] == "refuted"  # slower
    assert judged([40, 90, 60])["verdict"] == "undecided"  # the interval spans 1 and 2
    assert judged([60, 75, 90])["verdict"] == "cheaper, factor below 2"  # [1.46, 3.45]: above 1, not 2
    # the ratio's interval equals the Welch interval of the logs, exponentiated
    got = judged([90, 99, 110])
    d = stats.ttest_ind(
        [math.log(x) for x in (90, 99, 110)], [math.log(x) for x in (30, 33, 36)], equal_var=False
    ).confidence_interval(0.95)
    assert f"[{math.exp(d.low):.2f}, {math.exp(d.high):.2f}]" in got["detail"]
    # a baseline seed that never reached the target counts its whole budget: a lower bound, open above;
    # only the lower end can confirm
    censored = judged([100, None, 110])
    assert (
        censored["verdict"] == "confirmed"  # [2.29, inf]
        and "inf]" in censored["detail"]
        and "2/3 seeds" in censored["detail"]
    )
    assert judged([90, None, 110])["verdict"] == "cheaper, factor below 2"  # [1.97, inf]: 2 not shown
    never = verdicts.judge(
        claim,
        _summary(
            {
                "vgrpo": _seeds("steps_to_target", [None, None], steps=150),
                "b": _seeds("steps_to_target", [50, 60]),
            }
        ),
    )
    assert never["verdict"] == "refuted"  # ours never reached it, theirs always did
    partly = verdicts.judge(
        claim,
        _summary(
            {"vgrpo": _seeds("steps_to_target", [None, 30]), "b": _seeds("steps_to_target", [None, 60])}
        ),
    )
    assert partly["verdict"] == "undecided"


def test_a_marginal_claim_is_confirmed_only_when_its_interval_stays_within_the_margin(verdicts):
    claim = verdicts.Claim(
        "8 ~ 4", ("ablations", "N_MC 8"), ("ablations", "4"), "reward_end", "marginal", margin=0.02
    )
    four = _seeds("reward_end", [0.600, 0.602, 0.604])
    for expected, eight in {
        "confirmed": [0.605, 0.607, 0.609],
        "refuted": [0.650, 0.652, 0.654],
        "undecided": [0.58, 0.62, 0.66],
    }.items():
        got = verdicts.judge(claim, _summary({}, {"N_MC 8": _seeds("reward_end", eight), "4": four}))
        assert got["verdict"] == expected, got


def test_only_claims_whose_two_sides_ran_are_judged(verdicts):
    summary = _summary(
        {"vgrpo": _seeds("reward_end", [0.6, 0.7]), "flow_grpo": _seeds("reward_end", [0.5, 0.55])}
    )
    judged = verdicts.verdicts(summary)
    assert [v["claim"] for v in judged] == ["ends at a higher held-out reward than flow_grpo"]
    texts = [c.text for c in verdicts.CLAIMS]
    assert (
        len(texts) == len(set(texts))
        and any("MixGRPO" in t for t in texts)
        and any("N_MC 8" in t for t in texts)
    )


def test_a_baseline_that_never_reaches_the_target_confirms_no_factor_above_the_intervals_lower_end(verdicts):
    # the benchmark's MixGRPO case: ours reach the target, the baseline never does (its whole budget
    # counts, the upper end is infinite); the ratio is above 1 but its lower end is below 2
    claim = verdicts.Claim(
        "2x faster", ("methods", "vgrpo"), ("methods", "b"), "wall_to_target", "ratio", 2.0, budget="wall"
    )
    summary = _summary(
        {
            "vgrpo": _seeds("wall_to_target", [100.0, 104.0, 102.0], wall=150.0),
            "b": _seeds("wall_to_target", [None, None, None], wall=140.0),
        }
    )
    got = verdicts.judge(claim, summary)
    lo = float(got["detail"].split("[", 1)[1].split(",", 1)[0])
    assert 1 < lo < 2 and "inf]" in got["detail"]
    assert got["verdict"] == "cheaper, factor below 2"  # not "confirmed": 2 is above the lower end
    small = dataclasses.replace(claim, text="1.3x faster", factor=1.3)  # [1.31, inf]
    assert verdicts.judge(small, summary)["verdict"] == "confirmed"  # a factor at or below the lower end


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (2.0, 5.0, "confirmed"),  # the lower end reaches the factor
        (2.5, math.inf, "confirmed"),
        (1.14, math.inf, "cheaper, factor below 2"),  # cheaper, but 2 is not shown
        (1.2, 3.0, "cheaper, factor below 2"),
        (1.2, 1.9, "refuted"),  # cheaper by less than 2: the claim is refuted
        (0.5, 1.5, "refuted"),
        (0.9, 3.0, "undecided"),  # spans 1 and 2
        (1.0, math.inf, "undecided"),  # not even "cheaper": the lower end is not above 1
    ],
)
def test_each_ratio_verdict_follows_from_where_the_interval_lies(verdicts, lo, hi, expected):
    assert verdicts.ratio_verdict(lo, hi, 2.0) == expected


def test_the_docs_results_block_is_the_committed_summary_rendered_and_claims_no_more_than_it(verdicts):
    from benchmarks import aggregate, render
    from benchmarks.protocol import ROOT

    source = "benchmarks/results/shapes/summary.json"
    summary = json.loads((ROOT / source).read_text())
    block = render.markdown(summary, source, "../benchmarks/results/shapes/curves.png")
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    assert f"{render.DOC_BEGIN}\n{block}{render.DOC_END}" in doc  # regenerate with --write-doc
    # the recipe the cells ran (the frozen shapes world), not the quickstart it was copied from
    assert summary["recipe"] == "benchmarks/worlds/shapes.toml"
    # the summary's "reached" is the current rule's: each seed's curve, read again, reaches where it says
    target = summary["target"]["value"]
    for block in ("methods", "ablations"):
        for entry in summary[block].values():
            for seed in entry["seeds"]:
                held = aggregate.first_held(seed["curve"], "detail", target)
                assert seed["iterations_to_target"] == (held["iteration"] if held else None), seed["seed"]
    factors = {c.text: c.factor for c in verdicts.CLAIMS if c.kind == "ratio"}
    for judged in verdicts.verdicts(summary):
        if judged["claim"] in factors and judged["verdict"] == "confirmed":
            lo = float(judged["detail"].split("[", 1)[1].split(",", 1)[0])
            assert lo >= factors[judged["claim"]], judged  # confirmed only where the lower end reaches k
