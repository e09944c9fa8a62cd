"""benchmarks/compare.py end to end on the toy world: every row a real run, one table, the plot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _compare():
    spec = importlib.util.spec_from_file_location("compare", ROOT / "benchmarks" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_runs_each_method_and_prints_one_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    compare = _compare()
    args = ["--world", "toy", "--iterations", "2", "--eval-every", "1", "--eval-prompts", "2"]
    assert (
        compare.main([*args, "--methods", "vgrpo", "diffusion_nft", "--no-ablation", "--out", str(tmp_path)])
        == 0
    )
    printed = capsys.readouterr().out
    table = printed[printed.index("Methods") :]
    assert "vgrpo" in table and "diffusion_nft" in table
    (run,) = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert [row["label"] for row in summary["methods"]] == ["vgrpo", "diffusion_nft"]
    for row in summary["methods"]:
        assert len(row["curve"]) == 3  # evaluations at 0, 1, 2
        assert row["time_train"] > 0 and row["time_rollout"] > 0
    # each row trained its own surrogate: the runs' resolved recipes say so
    names = {
        json.loads((run / d / "resolved_recipe.json").read_text())["surrogate"]["name"]
        for d in ("vgrpo", "diffusion_nft")
    }
    assert names == {"vgrpo", "diffusion_nft"}
    assert (run / "curves.png").stat().st_size > 1000


def test_targets_are_reached_where_the_curve_first_crosses_them():
    compare = _compare()
    records = [
        {"kind": "eval", "iteration": 0, "reward": 0.1, "wall_seconds": 0.0},
        {"kind": "train", "iteration": 1, "gradient_steps": 2, "time_rollout": 1.0},
        {"kind": "train", "iteration": 2, "gradient_steps": 2, "time_rollout": 1.0},
        {"kind": "eval", "iteration": 2, "reward": 0.5, "wall_seconds": 7.0},
    ]

    class Recipe:  # what nfe_per_iteration reads
        class rollout:  # noqa: N801
            group_size, prompts_per_iteration, steps = 4, 2, 8

        class train:  # noqa: N801
            gradient_steps_per_iteration = 2

        class surrogate:  # noqa: N801
            name, options = "vgrpo", {"n_mc": 2}

    row = {"label": "x", "records": records, "wall": 9.0, "recipe": Recipe}
    summary = compare.summarise(row, target=0.4)
    assert (
        summary["iter_to_target"] == 2
        and summary["steps_to_target"] == 4
        and summary["wall_to_target"] == 7.0
    )
    assert summary["nfe_to_target"] == 2 * 8 * (8 + 2 * 3)  # 8 samples x (8 sampling + 2 pairs x 3 passes)
    assert summary["time_rollout"] == 2.0
    assert compare.summarise(row, target=0.9)["iter_to_target"] is None
