"""The quickstart's seed table and README figure come from committed records, by the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import quickstart_seeds as qs

ROOT = Path(__file__).resolve().parents[1]


def _cell(
    root: Path, seed: int, correct: list[float], wall_s: float = 600.0, variant: str = "shipped", **facts
) -> None:
    """A finished seed: evaluations at 0, 100, 200 and two timed train records."""
    rows = [{"kind": "eval", "iteration": 100 * i, qs.METRIC: v} for i, v in enumerate(correct)]
    rows += [{"kind": "train", "iteration": i, "time_rollout": 1.0, "time_train": 2.0 + i} for i in (1, 2)]
    out = root / variant / f"seed{seed}"
    out.mkdir(parents=True)
    table = qs.records.compact(rows)
    (out / qs.records.RECORDS).write_text(json.dumps(table))
    (out / "cell.json").write_text(json.dumps({"seed": seed, "wall_s": wall_s, **facts}))


def test_gains_are_points_over_iteration_zero_and_tuning_seeds_are_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(qs, "RESULTS", tmp_path)
    _cell(tmp_path, 0, [0.40, 0.55, 0.60])  # +20 at the end, best +20
    _cell(tmp_path, 3, [0.40, 0.62, 0.50])  # +10 at the end, best +22: ended 12 below its best
    variant = qs.Variant("shipped", (), (0, 3, 5))
    rows = {r["seed"]: r for r in qs.seed_rows(variant)}
    assert rows[0]["last"] == pytest.approx(20.0) and rows[3]["best"] == pytest.approx(22.0)
    text = qs.table(variant)
    assert "| 3 | unseen | +22.0 | +10.0 | -12.0 |" in text
    assert "all seeds +15.0 [+10.0, +20.0] over 2" in text and "Not run yet: seeds 5." in text
    sentence = qs.readme_sentence(variant)
    assert "took 10 min 0 s" in sentence and "1.00 s of rollout and 3.50 s of training" in sentence
    assert "**+15.0 points on average over 2 run seeds (range +10.0 to +20.0)**" in sentence
    assert "+20.0 over the 1 seeds the recipe was tuned on, +10.0 over 1 it never saw" in sentence
    assert "seed 5 of the seed rule not run yet" in sentence


def test_a_second_cpus_seeds_are_stated_beside_the_first_cpus_records_of_the_same_seeds(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(qs, "RESULTS", tmp_path)
    shipped = qs.Variant("shipped", (), (0, 3))
    second = qs.Variant("second_cpu", (), (0, 3, 4))
    monkeypatch.setattr(qs, "VARIANTS", {"shipped": shipped, "second_cpu": second})
    assert qs.second_cpu_line() == ""  # nothing run there yet: nothing said
    _cell(tmp_path, 0, [0.40, 0.55, 0.60])
    _cell(tmp_path, 3, [0.40, 0.62, 0.50])
    cpu = {"model": "Some CPU", "kernels": "AVX2"}
    _cell(tmp_path, 0, [0.40, 0.60, 0.50], variant="second_cpu", cpu=cpu)  # +10 where the first gave +20
    line = qs.second_cpu_line()
    assert line.startswith("On a second CPU (Some CPU, AVX2 kernels)")
    assert "+10.0 points for seed 0, where" in line
    assert "where its record on the first CPU gives +20.0" in line and "seeds 3, 4 not run yet" in line
    _cell(tmp_path, 3, [0.40, 0.45, 0.46], variant="second_cpu", cpu=cpu)  # +6 where the first gave +10
    line = qs.second_cpu_line()
    assert "+8.0 points on average over seeds 0, 3 (range +6.0 to +10.0)" in line
    assert "where their records on the first CPU give +15.0" in line
    assert qs.readme_sentence(shipped).endswith(" " + line) and qs.table(shipped).endswith(line + "\n")
    assert line not in qs.table(second)  # said once, under the shipped seeds


def test_the_readme_figure_is_the_generated_one():
    """Regenerate with `python -m benchmarks.quickstart_seeds table --write-doc` after new seeds land."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split(qs.README_BEGIN)[1].split(qs.README_END)[0].strip()
    assert block == qs.readme_sentence(qs.VARIANTS["shipped"])
    doc = (ROOT / "docs" / "quickstart.md").read_text()
    assert qs.table(qs.VARIANTS["shipped"]) in doc


def test_every_committed_cell_ran_the_shipped_recipe_settings():
    expected = qs.recipe_digest(qs.RECIPE)
    cells = sorted((qs.RESULTS / "shipped").glob("seed*/cell.json"))
    assert cells, "no committed seed of the quickstart"
    for path in cells:
        assert json.loads(path.read_text())["recipe_settings_sha256"] == expected, path


def test_every_committed_audio_cell_ran_the_frozen_recipe_and_the_table_names_the_base_model():
    expected = qs.recipe_digest(qs.AUDIO.recipe)
    cells = sorted((qs.results_of(qs.AUDIO) / "shipped").glob("seed*/cell.json"))
    assert cells, "no committed seed of the audio quickstart"
    for path in cells:
        assert json.loads(path.read_text())["recipe_settings_sha256"] == expected, path
    report = json.loads((qs.ROOT / "adapters" / "tones" / "weights" / "pretrain_report.json").read_text())
    line = qs.base_model_line(qs.AUDIO)
    assert f"held-out correct {100 * report['eval']['heldout']['correct']:.1f}%, count" in line
    assert f"{report['steps']} pretraining steps" in line and qs.base_model_line(qs.IMAGE) == ""


def _media_cells(quickstart, variant: str, ends: dict[int, float], base: float = 0.1) -> None:
    """Committed cells of a media quickstart: held-out correct ``base`` at iteration 0, ``ends[seed]`` at 100;
    seed s took 600 + 60 s seconds on one thread."""
    for seed, end in ends.items():
        rows = [
            {"kind": "eval", "iteration": 100 * i, quickstart.metric: v} for i, v in enumerate((base, end))
        ]
        out = qs.cell_dir(variant, seed, quickstart)
        out.mkdir(parents=True)
        (out / qs.records.RECORDS).write_text(json.dumps(qs.records.compact(rows)))
        (out / "cell.json").write_text(json.dumps({"seed": seed, "wall_s": 600.0 + 60 * seed, "threads": 1}))


def test_a_media_quickstart_reports_its_unseen_seeds_with_the_tuning_seed_apart(tmp_path, monkeypatch):
    """The video quickstart's cells live beside the image one's; its figure is seeds 1-3 (MEDIA_SEED_RULE)."""
    monkeypatch.setattr(qs, "RESULTS", tmp_path / "quickstart")
    variant = qs.MEDIA_VARIANTS["video"]
    root = qs.results_of(qs.VIDEO)
    assert root == tmp_path / "quickstart_video" and qs.cell_dir("shipped", 2, qs.VIDEO).parent.parent == root
    _media_cells(qs.VIDEO, "shipped", {0: 0.70, 1: 0.55, 2: 0.60}, base=0.4)
    text = qs.table(variant)
    assert "| 0 | tuning | +30.0 |" in text and "| 1 | unseen | +15.0 |" in text
    assert "unseen seeds +17.5 [+15.0, +20.0] over 2" in text and "Not run yet: seeds 3." in text
    line = qs.media_sentence(variant)
    assert line.startswith("`vgrpo run recipes/quickstart_video.toml` (video)")
    assert "**+17.5 points on average over 2 unseen run seeds (range +15.0 to +20.0)**" in line
    assert "seed 0, which tuned it: +30.0" in line
    assert "the longest run took 12 min on one thread, beside another run on the other core" in line
    assert "seed 3 not run yet" in line
    begin, end, readme_begin, _ = qs.markers(qs.VIDEO)
    assert "--quickstart video" in begin and begin != qs.BEGIN and readme_begin != qs.README_BEGIN
    with pytest.raises(SystemExit, match="only the shipped recipe's seeds"):
        qs.pick_variant("audio", "diversity_0.1")


def test_the_audio_figure_states_the_previous_judges_figure_beside_it(tmp_path, monkeypatch):
    """A protocol change that moves a figure is stated beside the old one: the lenient judge's seeds."""
    monkeypatch.setattr(qs, "RESULTS", tmp_path / "quickstart")
    lenient, what = qs.PREVIOUS_PROTOCOL["audio"]
    assert qs.pick_variant("audio", "lenient_judge") is lenient and "tonal_share" in lenient.overrides[0]
    shipped = qs.MEDIA_VARIANTS["audio"]
    assert qs.previous_protocol_line(qs.AUDIO) == ""  # no old records: nothing to state
    _media_cells(qs.AUDIO, "shipped", {0: 0.35, 1: 0.30, 2: 0.25, 3: 0.35})
    _media_cells(qs.AUDIO, "lenient_judge", {0: 0.50, 1: 0.40, 2: 0.45, 3: 0.35})
    seed0 = qs.cell_dir("shipped", 0, qs.AUDIO) / "cell.json"  # seed 0 ran on every core: named apart
    seed0.write_text(json.dumps({"seed": 0, "wall_s": 420.0, "threads": None, "wall_note": qs.ALONE}))
    text = qs.table(shipped)
    old_figure = f"Under {what}: unseen seeds +30.0 [+25.0, +35.0] over 3, tuning seed 0 +40.0 (from 10.0%"
    assert old_figure in text and text.endswith(f"{tmp_path}/quickstart_audio/lenient_judge`).\n")
    assert "unseen seeds +20.0 [+15.0, +25.0] over 3." in text and "unseen seeds +30.0 [+25.0, +35.0]" in text
    sentence = qs.media_sentence(shipped)
    assert "**+20.0 points on average over 3 unseen run seeds" in sentence
    timings = "took 13 min on one thread, beside another run on the other core; seed 0, run alone on both"
    assert f"{timings} cores, took 7 min" in sentence
    assert sentence.endswith(f"; under {what}, +30.0 over the same unseen seeds (committed records).")
    assert "Under" not in qs.table(lenient)  # the old table does not state itself


def test_the_media_seed_rule_in_the_docs_is_the_scripts():
    doc = (ROOT / "docs" / "video-audio.md").read_text()
    block = doc.split("<!-- media-seed-rule:begin -->")[1].split("<!-- media-seed-rule:end -->")[0]
    assert block.strip() == qs.MEDIA_SEED_RULE


def test_the_second_cpu_rule_in_the_docs_is_the_scripts():
    doc = (ROOT / "docs" / "quickstart.md").read_text()
    block = doc.split("<!-- second-cpu-rule:begin -->")[1].split("<!-- second-cpu-rule:end -->")[0]
    assert block.strip() == qs.SECOND_CPU_RULE


def test_a_saved_cell_records_its_cpu_and_library_versions(tmp_path, monkeypatch):
    monkeypatch.setattr(qs, "RESULTS", tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"kind": "eval", "iteration": 0, qs.METRIC: 0.4}, {"kind": "train", "iteration": 1, "loss": 0.1}]
    (run / qs.records.LOG).write_text("".join(json.dumps(r) + "\n" for r in rows))
    qs.save_cell(qs.VARIANTS["second_cpu"], 0, run, wall_s=1.0, threads=1)
    cell = json.loads((tmp_path / "second_cpu" / "seed0" / "cell.json").read_text())
    import torch

    assert cell["cpu"]["kernels"] == torch.backends.cpu.get_cpu_capability() and cell["cpu"]["model"]
    assert cell["libraries"]["torch"] == torch.__version__.split("+")[0]
