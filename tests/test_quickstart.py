"""``recipes/quickstart.toml``: it validates, runs end to end, and (slow) V-GRPO raises held-out accuracy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vgrpo_adapters import shapes as shapes_adapter
from vgrpo_rewards import shapes as shapes_reward
from vgrpo_rewards.shapes.world import heldout_partner_split

from vgrpo_platform.algo.surrogates import entry as surrogates
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.host.collect import collect_components
from vgrpo_platform.host.manager import build_plugin_manager

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RECIPE = Path(__file__).parents[1] / "recipes" / "quickstart.toml"


def resolve(*overrides: str):
    # the components the recipe names, whether or not their entry points are installed
    plugins = [shapes_adapter, shapes_reward, surrogates]
    pm = build_plugin_manager(load_entry_points=False, extra_plugins=plugins)
    return resolve_recipe(RECIPE, overrides, registry=collect_components(pm))


def eval_records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in rows if r.get("kind") == "eval"]


def test_recipe_trains_on_half_the_heldout_compositions_and_evaluates_on_the_other_half() -> None:
    resolved = resolve()
    r = resolved.recipe
    assert resolved.adapter.spec.name == "shapes" and r.surrogate.name == "vgrpo"
    assert r.train.finetune == "lora"
    assert r.rollout.sampler == "dpmsolver++"
    rl, evaluation = heldout_partner_split()
    assert sorted(resolved.train_prompts) == sorted(rl)
    assert sorted(resolved.eval_prompts) == sorted(evaluation)
    # every evaluation prompt, 756+ samples in all: a standard error under 2 points
    assert r.eval.max_prompts >= len(evaluation) and r.eval.samples_per_prompt * len(evaluation) >= 756


def test_short_quickstart_runs_end_to_end_and_exports_a_lora_diffusers_loads(tmp_path: Path) -> None:
    """A short quickstart run; its ``final/`` LoRA, loaded by diffusers' own ``load_lora_adapter`` into a
    plain ``SD3Transformer2DModel`` of the shipped weights, gives the velocities the run served (its moving
    average) at the end, not the base model's."""
    import torch
    from diffusers import SD3Transformer2DModel
    from vgrpo_adapters.shapes import WEIGHTS_DIR
    from vgrpo_adapters.toy.impl import ToyAdapter

    from vgrpo_platform.finetune import reference_mode
    from vgrpo_platform.lora_files import LORA_FILE
    from vgrpo_platform.training.loop import Trainer

    resolved = resolve(
        "train.iterations=2",
        "rollout.prompts_per_iteration=2",
        "rollout.group_size=4",
        "eval.max_prompts=4",
        "eval.samples_per_prompt=2",
        "log.progress=none",
        f"run.output_dir={tmp_path}",
    )
    trainer = Trainer(resolved)
    run_dir = trainer.run()
    evals = eval_records(run_dir)
    assert [e["iteration"] for e in evals] == [0, 2]
    for e in evals:
        assert 0 <= e["detail/shapes/correct"] <= 1
    assert (run_dir / "samples").is_dir() and any((run_dir / "checkpoints").iterdir())
    assert (run_dir / "samples" / "before_after.png").is_file()  # same prompts and seeds, before | after

    policy = trainer.session.adapter
    z = torch.randn(2, *policy.latent_shape(), generator=torch.Generator().manual_seed(0))
    t, cond = torch.tensor([0.3, 0.8]), policy.encode_prompts(resolved.eval_prompts[:2])
    with torch.no_grad(), trainer.average.applied(trainer.session.trainable):
        served = policy.predict(z, t, cond)
        with reference_mode(policy):
            base = policy.predict(z, t, cond)
    transformer = SD3Transformer2DModel.from_pretrained(WEIGHTS_DIR / "transformer")
    transformer.load_lora_adapter(run_dir / "final", weight_name=LORA_FILE)  # rank, alpha: the file's
    with torch.no_grad():
        loaded = ToyAdapter(transformer, policy.text_encoder, policy.tokenizer, shift=3.0).predict(z, t, cond)
    assert (served - base).abs().max() > 1e-3  # two iterations moved the policy
    torch.testing.assert_close(loaded, served, atol=1e-5, rtol=1e-5)


TUNING_SEEDS = (0, 1, 2)  # the recipe was chosen on these; the README also reports seeds 3 and 4


@pytest.fixture(scope="module")
def tuning_seed_gains(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Held-out `correct` gain (last evaluation minus iteration 0) of the full recipe on each tuning seed."""
    from vgrpo_platform.training.loop import run

    gains = []
    for seed in TUNING_SEEDS:
        out = tmp_path_factory.mktemp(f"seed{seed}")
        run_dir = run(resolve("log.progress=plain", f"run.output_dir={out}", f"run.seed={seed}"))
        evals = eval_records(run_dir)
        gains.append(evals[-1]["detail/shapes/correct"] - evals[0]["detail/shapes/correct"])
    return gains


@pytest.mark.slow
def test_full_quickstart_gains_20_points_on_average_over_seeds(tuning_seed_gains: list[float]) -> None:
    """The quickstart's target: held-out `correct` +20 points as the mean of 3 run seeds, each seed +15
    (measured on the development machine: +21.5, +23.6, +20.3; docs/quickstart.md, Results). Another
    CPU follows other trajectories, so this is the claim that has to survive it, not a fixed number."""
    gains = tuning_seed_gains
    assert sum(gains) / len(gains) >= 0.20 and min(gains) >= 0.15, gains
