"""The ``flux_kontext`` adapter on a tiny FluxKontextPipeline built from configs, saved and loaded back.

Independent references: diffusers' own ``FluxKontextPipeline.__call__`` from the same noise and source
image (rollouts), the pipeline's ``load_lora_weights`` (export), the conformance kit; and an edit prompt
set with images run end to end (rollout, reward, evaluation, ``vgrpo sample``, report).
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from diffusers import FluxKontextPipeline
from diffusers.utils import logging as diffusers_logging
from PIL import Image
from tiny_kontext import build_tiny_flux_kontext, edit_prompt_set, edit_prompts, source_image
from tiny_pipelines import RESOLUTION
from vgrpo_adapters import flux_kontext as kontext_entry
from vgrpo_adapters.flux_kontext import FluxKontextAdapterConfig
from vgrpo_adapters.flux_kontext.impl import FluxKontextAdapter
from vgrpo_rewards import toy as toy_rewards

from vgrpo_platform.algo.surrogates import entry as surrogates_plugin
from vgrpo_platform.cli.eval_run import evaluate_recipe
from vgrpo_platform.cli.report import write_report
from vgrpo_platform.cli.sample import sample_to_folder
from vgrpo_platform.conditions import Prompt, condition_images, encode_conditioned
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.grids import read_layout

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers_logging.disable_progress_bar()

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "kontext_edit.toml"
TOKENS = 16
LATENT = (4, RESOLUTION // 2, RESOLUTION // 2)


def config(model: Path, **options) -> FluxKontextAdapterConfig:
    return FluxKontextAdapterConfig(
        model=str(model), resolution=RESOLUTION, max_sequence_length=TOKENS, **options
    )


TINY_PIPELINE, ADAPTER = build_tiny_flux_kontext, FluxKontextAdapter  # the conftest's fixtures
noise = partial(checks.seeded_noise, LATENT)


@pytest.fixture(scope="module")
def edits(tmp_path_factory) -> list[Prompt]:
    """Three edit prompts, each carrying its own source image."""
    return edit_prompts(tmp_path_factory.mktemp("edits"))


def test_registered_with_a_documented_config_and_a_torch_free_entry_module(model_dir) -> None:
    checks.assert_registered(kontext_entry, "flux_kontext", config(model_dir), FluxKontextAdapter)
    assert FluxKontextAdapterConfig.takes_condition_image and FluxKontextAdapterConfig().guidance == 2.5


def test_rollout_and_decode_equal_the_diffusers_pipeline_from_the_same_noise_and_source(
    adapter, model_dir, edits
) -> None:
    z = noise(1, seed=3)
    cond = encode_conditioned(adapter, edits[:1])
    assert cond["image_latents"].shape == (1, (LATENT[1] // 2) ** 2, 4 * LATENT[0])
    image = adapter.decode(adapter.sample(z, cond, SamplerSpec("euler", 4))).data
    pipe = FluxKontextPipeline.from_pretrained(model_dir)
    reference = checks.pipeline_output(
        pipe,
        str(edits[0]),
        RESOLUTION,
        FluxKontextPipeline._pack_latents(z, 1, *LATENT),
        image=Image.open(edits[0].images[0]),
        num_inference_steps=4,
        guidance_scale=2.5,
        max_sequence_length=TOKENS,
        max_area=RESOLUTION**2,
        _auto_resize=False,
    ).images
    torch.testing.assert_close(image, reference, atol=1e-5, rtol=1e-5)


def test_the_velocity_depends_on_the_source_and_each_row_stands_alone(adapter, edits) -> None:
    z, t = noise(3, seed=4), torch.tensor([0.2, 0.5, 0.9])
    cond = encode_conditioned(adapter, edits)
    v = adapter.predict(z, t, cond)
    assert v.shape == z.shape
    swapped = dict(cond, image_latents=cond["image_latents"].roll(1, 0))  # each row gets another source
    assert (adapter.predict(z, t, swapped) - v).abs().amax(dim=(1, 2, 3)).min() > 1e-4
    alone = adapter.predict(z[1:2], t[1:2], encode_conditioned(adapter, edits[1:2]))
    torch.testing.assert_close(alone, v[1:2], atol=1e-5, rtol=1e-5)
    smaller = Prompt("same", {}, edits[0].images)  # a source of another size is resized to the output's
    resized = adapter.encode_conditions([smaller], [[condition_images(smaller)[0][:, :8, :12]]])
    assert resized["image_latents"].shape == cond["image_latents"][:1].shape


def test_text_alone_or_several_sources_are_refused_in_one_line(adapter, edits) -> None:
    with pytest.raises(RecipeError, match="flux_kontext takes a condition image"):
        adapter.encode_prompts(["a red cat"])
    with pytest.raises(RecipeError, match="exactly one condition image per prompt"):
        adapter.encode_conditions(["two"], [condition_images(edits[0]) * 2])
    with pytest.raises(RecipeError, match="FluxKontextAdapter edits a condition image"):
        encode_conditioned(adapter, ["a red cat"])


def test_lora_export_loads_into_a_fresh_kontext_pipeline_with_the_same_predictions(
    model_dir, tmp_path, edits
) -> None:
    z, t = noise(2, seed=6), torch.tensor([0.4, 0.9])
    checks.assert_exported_lora_reloads(
        FluxKontextAdapter, FluxKontextPipeline, config(model_dir), tmp_path / "final", edits[:2], z, t
    )


def test_an_edit_prompt_set_runs_end_to_end_rollout_reward_eval_sample_report(model_dir, tmp_path) -> None:
    prompts = edit_prompt_set(tmp_path / "set")
    registry = checks.registry_of(kontext_entry, toy_rewards, surrogates_plugin)
    overrides = [
        *checks.brightness_run(model_dir, tmp_path, *checks.size_options(RESOLUTION, TOKENS)),
        *checks.two_iterations(),
        f'prompts.train_file="{prompts}"',
        "eval.max_prompts=2",
        "eval.every=2",
        "eval.steps=3",
        "log.save_grids=true",
    ]
    resolved = resolve_recipe(RECIPE, overrides, registry=registry)
    run_dir = Trainer(resolved).run()
    checks.assert_trained(run_dir, 2)
    grid = run_dir / "samples" / "eval_000002.png"
    tiles = read_layout(grid)["tiles"]
    assert [t["prompt"] for t in tiles] == [p for p in resolved.eval_prompts[:2]]
    x, y, w, h = tiles[0]["source"]  # the source, first in its tile, is the prompt's own image
    shown = np.asarray(Image.open(grid).convert("RGB").crop((x + 2, y + 2, x + w - 2, y + h - 2)), float)
    expected = np.asarray(source_image(0).resize((w - 4, h - 4), Image.Resampling.NEAREST), float)
    assert np.abs(shown - expected).mean() < 20
    assert (run_dir / "samples" / "before_after.png").is_file()
    out = sample_to_folder(resolved, out_dir=tmp_path / "samples", checkpoint=run_dir, num_per_prompt=2)
    index = [json.loads(line) for line in (tmp_path / "samples" / "index.jsonl").read_text().splitlines()]
    assert len(out) == len(index) == 4 and index[0]["image"] == "src/0.png"  # 2 prompts x 2 samples
    assert read_layout(tmp_path / "samples" / "grid.png")["tiles"][0]["source"]
    evaluated = evaluate_recipe(resolved, checkpoint=run_dir, out_dir=tmp_path / "eval")
    assert evaluated.report["protocol"]["prompts"] == [str(p) for p in resolved.eval_prompts[:2]]
    assert read_layout(tmp_path / "eval" / "grid.png")["tiles"][1]["source"]
    report = write_report(run_dir)
    assert "eval_000002.png" in report.read_text()


def test_shipped_recipe_passes_check_and_sets_the_peers_kontext_settings() -> None:
    registry = checks.registry_of(kontext_entry, surrogates_plugin, checks.reward_plugin_or_skip("edit_clip"))
    resolved = resolve_recipe(RECIPE, registry=registry)
    r = resolved.recipe
    assert resolved.adapter.config.guidance == 2.5 and resolved.adapter.config.resolution == 512
    assert (r.eval.steps, r.train.finetune) == (28, "lora")
    assert all(p.images for p in resolved.train_prompts)  # type: ignore[attr-defined]
