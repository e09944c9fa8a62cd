"""``recipes/sd35_geneval.toml`` for two iterations with tiny weights: a tiny SD3 pipeline, a tiny
Mask2Former detector and a tiny CLIP colour classifier, each saved with ``save_pretrained`` and loaded back
through the recipe's own options, on a few lines of GenEval's JSONL prompt set.

A randomly initialised 80-class head spreads its softmax near 1/81, so at the 0.9 thresholds set here no
detection is kept: every verdict then follows from each prompt's metadata alone (nothing present, no
count met, a colour or position clause failed where one is asked, 1.0 where none is), which is what shows
that each row's own JSONL fields reached the reward.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import adapter_checks as checks
import pytest
from diffusers.utils import logging as diffusers_logging
from tiny_clip import save_clip
from tiny_detectors import save_mask2former
from tiny_pipelines import RESOLUTION, build_tiny_sd3
from vgrpo_adapters import sd3 as sd3_entry

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.conditions import reward_metadata
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RewardError
from vgrpo_platform.training.loop import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "sd35_geneval.toml"
GENEVAL = ROOT / "recipes" / "prompts" / "geneval.jsonl"
TOKENS = 16
CRITERIA = ("presence", "count", "color", "position", "exclude")


def write_jsonl(path: Path, *prompts: str) -> Path:
    """A prompt file of the committed GenEval lines of these prompts, in this order."""
    rows = {json.loads(line)["prompt"]: line for line in GENEVAL.read_text().splitlines()}
    path.write_text("".join(rows[p] + "\n" for p in prompts))
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    """The tiny SD3 pipeline, Mask2Former and CLIP folders, built once for the module."""
    root = tmp_path_factory.mktemp("geneval_weights")
    return {
        "sd3": build_tiny_sd3(root / "sd3"),
        "detector": save_mask2former(root / "m2f"),
        "clip": save_clip(root / "clip"),
    }


def overrides(weights: dict[str, Path], tmp_path: Path, train: Path, evaluation: Path) -> list[str]:
    return [
        f'adapter.options.model="{weights["sd3"]}"',
        *checks.size_options(RESOLUTION, TOKENS),
        f'rewards.0.options.model="{weights["detector"]}"',
        f'rewards.0.options.clip_model="{weights["clip"]}"',
        "rewards.0.options.threshold=0.9",
        "rewards.0.options.counting_threshold=0.9",
        *checks.cpu_run(tmp_path),
        *checks.two_iterations(),
        f'prompts.train_file="{train}"',
        f'prompts.eval_file="{evaluation}"',
        "eval.max_prompts=2",
        "eval.every=2",
        "eval.steps=3",
    ]


def test_the_geneval_recipe_runs_two_iterations_with_each_prompts_metadata(weights, tmp_path) -> None:
    geneval = checks.reward_plugin_or_skip("geneval")
    train, evaluation = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    # training: position prompts only (two objects, the second placed relative to the first)
    write_jsonl(train, "a photo of a dog right of a teddy bear", "a photo of a wine glass above a kite")
    # evaluation: a colour prompt and a counting prompt (which forbids one object too many)
    write_jsonl(evaluation, "a photo of a blue fire hydrant", "a photo of two clocks")
    registry = checks.registry_of(sd3_entry, geneval, surrogates_plugin)
    resolved = resolve_recipe(RECIPE, overrides(weights, tmp_path, train, evaluation), registry=registry)
    assert [m["tag"] for m in reward_metadata(resolved.eval_prompts[:2])] == ["colors", "counting"]
    run_dir = Trainer(resolved).run()
    assert (run_dir / "final").is_dir()
    records = checks.assert_trained(run_dir, 2)
    for rec in records:
        # nothing kept: both include clauses absent, the position clause failed, no colour or exclude asked
        assert {k: rec[f"detail/geneval/{k}"] for k in CRITERIA} == {
            "presence": 0.0, "count": 0.0, "color": 1.0, "position": 0.0, "exclude": 1.0,
        }  # fmt: skip
        assert rec["reward"] == rec["reward/geneval"] == 0.0
        assert rec["detail/geneval/correct"] == rec["detail/geneval/graded"] == 0.0
    evals = checks.records_of(run_dir, "eval")
    assert [rec["iteration"] for rec in evals] == [0, 2]
    for rec in evals:
        # one image asks a colour (failed), the other asks none; only the counting prompt has an exclude
        # clause, and with no clock found it holds
        assert {k: rec[f"detail/geneval/{k}"] for k in CRITERIA} == {
            "presence": 0.0, "count": 0.0, "color": 0.5, "position": 1.0, "exclude": 1.0,
        }  # fmt: skip
        assert rec["reward/geneval"] == rec["detail/geneval/correct"] == 0.0


def test_a_plain_text_prompt_file_stops_the_run_with_the_metadata_fix(weights, tmp_path) -> None:
    """Without the JSONL fields the reward has nothing to judge: one line naming the prompt and the fix."""
    geneval = checks.reward_plugin_or_skip("geneval")
    train = tmp_path / "train.txt"
    train.write_text("a photo of a dog\na photo of a cat\n")
    evaluation = write_jsonl(tmp_path / "eval.jsonl", "a photo of two clocks")
    registry = checks.registry_of(sd3_entry, geneval, surrogates_plugin)
    resolved = resolve_recipe(
        RECIPE,
        [*overrides(weights, tmp_path, train, evaluation), "eval.every=0", "train.iterations=1"],
        registry=registry,
    )
    with pytest.raises(RewardError) as err:
        Trainer(resolved).run()
    message = str(err.value)
    assert "no 'include' list" in message and "make_prompts" in message and "\n" not in message
