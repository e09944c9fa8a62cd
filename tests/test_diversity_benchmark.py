"""The diversity comparison (benchmarks/diversity.py): its rule on constructed cells, and the doc block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import diversity as dv
from benchmarks import quickstart_seeds as qs

ROOT = Path(__file__).resolve().parents[1]
BASE = {"iteration": 0, "samples_per_prompt": 8, "correct": [4, 4, 2, 8], "diversity": [0.2, 0.2, 0.2, 0.2]}


def _cell(variant: str, seed: int, correct: list[float], per_prompt: list[int], diversity: float) -> None:
    out = qs.cell_dir(variant, seed)
    out.mkdir(parents=True)
    rows = [{"kind": "eval", "iteration": 50 * i, qs.METRIC: v} for i, v in enumerate(correct)]
    (out / qs.records.RECORDS).write_text(json.dumps(qs.records.compact(rows)))
    record = {"iteration": 50 * (len(correct) - 1), "samples_per_prompt": 8, "correct": per_prompt}
    record["diversity"] = [diversity] * len(per_prompt)
    (out / qs.PER_PROMPT).write_text(json.dumps(record))


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(qs, "RESULTS", tmp_path)
    monkeypatch.setattr(qs, "BASE_PER_PROMPT", tmp_path / "base_per_prompt.json")
    (tmp_path / "base_per_prompt.json").write_text(json.dumps(BASE))
    return tmp_path


def test_a_prompt_fell_when_it_has_fewer_correct_samples_than_before():
    assert dv.prompts_fell(BASE, {"correct": [3, 5, 2, 7]}) == 2  # 4 -> 3 and 8 -> 7; equal is not a fall
    with pytest.raises(ValueError, match="different prompt sets"):
        dv.prompts_fell(BASE, {"correct": [1]})


def test_the_finalist_keeps_diversity_first_and_gains_second(results):
    assert dv.finalist("diversity", BASE) is None  # screen not run
    # 0.1 gains more but loses diversity (0.17 < 0.9 x 0.2); 0.3 keeps it: 0.3 is the finalist
    _cell("screen_diversity_0.1", 1, [0.40, 0.55, 0.62], [5, 5, 3, 8], 0.17)
    _cell("screen_diversity_0.3", 1, [0.40, 0.50, 0.55], [5, 3, 3, 8], 0.19)
    assert dv.finalist("diversity", BASE) == "diversity_0.3"
    # neither keeps it: the one with more diversity, whatever its gain
    _cell("screen_anchor_0.1", 1, [0.40, 0.50, 0.65], [5, 5, 3, 8], 0.15)
    _cell("screen_anchor_0.5", 1, [0.40, 0.45, 0.45], [5, 5, 3, 8], 0.16)
    assert dv.finalist("anchor", BASE) == "anchor_0.5"


def test_the_goal_needs_gain_stability_and_diversity_over_the_final_seeds(results):
    for seed in range(4):
        _cell("anchor_0.1", seed, [0.40, 0.60, 0.60, 0.59], [4, 4, 2, 8], 0.19)  # +19, 1 below its best
    assert dv.meets_goal(dv.seed_results(qs.VARIANTS["anchor_0.1"], BASE), BASE) is None  # seed 4 missing
    _cell("anchor_0.1", 4, [0.40, 0.65, 0.61, 0.60], [4, 4, 1, 8], 0.19)  # +20 but 5 below its best
    results_ = dv.seed_results(qs.VARIANTS["anchor_0.1"], BASE)
    assert dv.meets_goal(results_, BASE) is False
    assert results_[4].fell == 1 and results_[4].last == pytest.approx(20.0)
    row = dv.row("anchor_0.1", results_, BASE, qs.FINAL_SEEDS)
    assert "| +19.2 [+19.0, +20.0] | -5.0 | 95.0 [95.0, 95.0] | 0.2 [0.0, 1.0] |" in row


def test_a_constructed_evaluation_is_kept_as_counts_and_diversities():
    report = {
        "protocol": {"samples_per_prompt": 8},
        "checkpoint": {"iteration": 200},
        "per_prompt": [{qs.METRIC: 0.375, qs.DIVERSITY: 0.2512345}, {qs.METRIC: 1.0, qs.DIVERSITY: 0.1}],
    }
    kept = qs.compact_per_prompt(report)
    assert kept == {"iteration": 200, "samples_per_prompt": 8, "correct": [3, 8], "diversity": [0.25123, 0.1]}


def test_annotating_refuses_a_run_that_is_not_the_cells(results, tmp_path):
    _cell("shipped", 3, [0.40, 0.50], [4, 4, 2, 8], 0.2)
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"kind": "eval", "iteration": 50 * i, qs.METRIC: v} for i, v in enumerate([0.40, 0.51])]
    (run / qs.records.LOG).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SystemExit, match="is not the run of"):
        qs.annotate(qs.VARIANTS["shipped"], 3, run, threads=1)


def test_the_doc_block_is_the_generated_one():
    """Regenerate with `python -m benchmarks.diversity --write-doc` after new cells land."""
    doc = (ROOT / "docs" / "quickstart.md").read_text()
    block = doc.split(dv.BEGIN)[1].split(dv.END)[0].strip()
    assert block == dv.report().strip()
    assert dv.DIVERSITY_RULE in doc


def test_the_screen_reference_is_the_shipped_seed_at_the_screen_iteration(results):
    out = qs.cell_dir("shipped", 1)
    out.mkdir(parents=True)
    rows = [
        {"kind": "eval", "iteration": i, qs.METRIC: c, qs.DIVERSITY: d}
        for i, c, d in ((0, 0.40, 0.25), (100, 0.55, 0.20), (200, 0.60, 0.15))
    ]
    (out / qs.records.RECORDS).write_text(json.dumps(qs.records.compact(rows)))
    gain, kept = dv.shipped_at(1, 100)
    assert gain == pytest.approx(15.0) and kept == pytest.approx(80.0)
    assert dv.shipped_at(1, 150) is None and dv.shipped_at(2, 100) is None


def test_a_missed_goal_names_each_part_it_misses_with_its_figure(results):
    for seed in range(5):
        # +19 each; seed 2 ends 6 below its best; diversity 0.16 = 80% of the base model's 0.2
        end = [0.40, 0.65, 0.59] if seed == 2 else [0.40, 0.59, 0.59]
        _cell("diversity_0.1", seed, end, [4, 4, 2, 8], 0.16)
    misses = dv.goal_misses(dv.seed_results(qs.VARIANTS["diversity_0.1"], BASE), BASE)
    assert misses == [
        "ended more than 2 points below its best: seed 2 -6.00",
        "diversity 80.0% of the base model's < 90%",
    ]
