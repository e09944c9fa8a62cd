"""The ``moving_shapes`` adapter and ``pretrain-moving-shapes``: a tiny Wan video model of the world."""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from tiny_moving_shapes import TINY, build_tiny_moving_shapes
from typer.testing import CliRunner
from vgrpo_adapters._diffusers_export import LORA_FILE
from vgrpo_adapters._flow_pretrain import PretrainConfig, flow_matching_loss, resume_state_file
from vgrpo_adapters._weights import ModelWeightsError
from vgrpo_adapters.moving_shapes import WEIGHTS_DIR, Config
from vgrpo_adapters.moving_shapes.build import ModelSize, build_moving_shapes_model, world_words
from vgrpo_adapters.moving_shapes.impl import MovingShapesAdapter
from vgrpo_adapters.moving_shapes.pretrain import (
    REPORT_FILE,
    pretrain_moving_shapes,
    render_clips,
)
from vgrpo_rewards.moving_shapes import Config as RewardConfig
from vgrpo_rewards.moving_shapes.impl import MovingShapesReward
from vgrpo_rewards.moving_shapes.track import CRITERIA
from vgrpo_rewards.moving_shapes.world import DEFAULT_FRAMES, DEFAULT_SIZE, all_prompts

from vgrpo_platform.cli.app import add_plugin_commands, app
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.finetune import make_trainable
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.ode_solvers import solve_flow_ode
from vgrpo_platform.protocols import BuildContext, SamplerSpec

PROMPTS = ["a red square rises", "a blue circle moving left while a yellow triangle falls"]


def _load(folder: Path) -> MovingShapesAdapter:
    return MovingShapesAdapter.load(folder, resolution=TINY.resolution, num_frames=TINY.num_frames)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("moving_shapes") / "model"
    build_tiny_moving_shapes(path)
    return path


def test_plugin_loads_the_folder_relative_to_the_recipe_and_samples_a_clip(folder: Path) -> None:
    context = BuildContext(device="cpu", seed=0, run_dir=None, recipe_dir=folder.parent)
    options = {"model_path": "model", "resolution": TINY.resolution, "num_frames": TINY.num_frames}
    adapter = default_registry().build("adapter", "moving_shapes", options, context)
    assert isinstance(adapter, MovingShapesAdapter) and adapter.modality == "video"
    assert type(adapter.denoiser).__name__ == "WanTransformer3DModel"
    assert type(adapter.text_encoder).__name__ == "UMT5EncoderModel"
    assert adapter.latent_shape() == (3, TINY.num_frames, TINY.resolution, TINY.resolution)
    noise = torch.randn(2, *adapter.latent_shape(), generator=torch.Generator().manual_seed(0))
    cond = adapter.encode_prompts(PROMPTS)
    sampler = SamplerSpec("dpmsolver++", 3)
    x0 = adapter.sample(noise, cond, sampler)
    # the core's ODE solver on the adapter's velocity, called directly: the same clip
    direct = solve_flow_ode(lambda z, t: adapter.predict(z, t, cond), noise, sampler, shift=3.0)
    assert torch.equal(x0, direct) and not torch.equal(x0, noise)
    clips = adapter.decode(x0)
    assert clips.modality == "video" and clips.fps == 8.0
    assert clips.data.shape == (2, TINY.num_frames, 3, TINY.resolution, TINY.resolution)
    assert 0 <= float(clips.data.min()) and float(clips.data.max()) <= 1
    scores = MovingShapesReward(RewardConfig()).score(clips, PROMPTS, [{}, {}])
    assert set(CRITERIA) <= set(scores) and scores["score"].shape == (2,)


def test_decode_turns_a_rendered_clip_back_into_frames_the_reward_accepts(folder: Path) -> None:
    """The latent layout is Wan's ``[3, F, H, W]``: a rendered clip in it decodes to a correct video."""
    adapter = MovingShapesAdapter.load(folder, resolution=32, num_frames=8)
    prompts = ["a green square moving right while a red triangle falls", "a blue circle rises"]
    latents = render_clips(prompts, np.random.default_rng(0), 32, 8)
    assert latents.shape == (2, 3, 8, 32, 32) and latents.min() >= -1 and latents.max() <= 1
    scores = MovingShapesReward(RewardConfig()).score(adapter.decode(latents), prompts, [{}, {}])
    assert scores["correct"].tolist() == [1.0, 1.0]


def test_prompts_are_whole_word_tokens_and_padding_is_zeroed(folder: Path) -> None:
    adapter = _load(folder)
    longest = max(all_prompts(), key=lambda p: len(p.split()))
    ids = adapter.tokenizer(longest).input_ids
    assert len(ids) == len(longest.split()) + 2 <= adapter.max_prompt_tokens  # BOS, one per word, EOS
    assert {w for p in all_prompts() for w in p.split()} <= set(world_words())
    embeds = adapter.encode_prompts(["a red square rises"])["prompt_embeds"]  # [1, S, D]
    assert embeds.shape[1] == adapter.max_prompt_tokens
    assert embeds[0, 6:].abs().sum() == 0 and embeds[0, :6].abs().sum() > 0  # 4 words + BOS + EOS


def test_lora_targets_wan_attention_and_changes_the_velocity(folder: Path) -> None:
    from vgrpo_platform.config.schema import TrainSection

    adapter = _load(folder)
    trainable = make_trainable(adapter, TrainSection(finetune="lora", lora_rank=2))
    assert trainable and all("lora_" in n for n in trainable)
    assert any("attn1.to_q" in n for n in trainable) and any("attn2.to_v" in n for n in trainable)
    z = torch.randn(1, *adapter.latent_shape(), generator=torch.Generator().manual_seed(1))
    t, cond = torch.tensor([0.5]), adapter.encode_prompts(PROMPTS[:1])
    before = adapter.predict(z, t, cond)
    with torch.no_grad():
        for name, p in trainable.items():
            if "lora_B" in name:
                p.fill_(0.05)
    assert not torch.allclose(adapter.predict(z, t, cond), before)


def test_exported_lora_loads_into_a_bare_wan_transformer_and_predicts_the_same(
    folder: Path, tmp_path: Path
) -> None:
    """The export is in Wan's diffusers LoRA layout (``transformer.``-prefixed keys, rank and alpha in the
    file's metadata): ``WanTransformer3DModel.load_lora_adapter`` reads it into the base model."""
    from diffusers import WanTransformer3DModel

    trained = _load(folder)
    checks.attach_trained_lora(trained)
    assert "load_lora_adapter" in checks.export_lora(trained, tmp_path / "final")
    transformer = WanTransformer3DModel.from_pretrained(folder / "transformer")
    fresh = MovingShapesAdapter(
        transformer,
        trained.text_encoder,
        trained.tokenizer,
        resolution=TINY.resolution,
        num_frames=TINY.num_frames,
    )
    load = partial(transformer.load_lora_adapter, tmp_path / "final", weight_name=LORA_FILE)
    z = torch.randn(2, *trained.latent_shape(), generator=torch.Generator().manual_seed(0))
    cond = trained.encode_prompts(PROMPTS)
    checks.assert_reload_matches(
        trained, fresh, load, z, torch.tensor([0.3, 0.8]), cond, atol=1e-6, rtol=1e-5
    )


def test_full_export_is_a_model_folder_the_adapter_loads(folder: Path, tmp_path: Path) -> None:
    trained = _load(folder)
    with torch.no_grad():
        next(trained.denoiser.parameters()).add_(0.1)  # "trained": differs from the base folder
    trained.export_trained(tmp_path / "final")
    reloaded = _load(tmp_path / "final")
    for a, b in zip(reloaded.denoiser.parameters(), trained.denoiser.parameters(), strict=True):
        assert torch.equal(a, b)
    note = json.loads((tmp_path / "final" / "vgrpo_export.json").read_text())
    assert note["kind"] == "full" and "MovingShapesAdapter.load" in note["load"]


def test_the_shipped_model_is_the_default_small_finished_and_not_solving_the_heldout_clips() -> None:
    files = [p for p in WEIGHTS_DIR.rglob("*") if p.is_file()]
    assert {p.parent.name for p in files} >= {"transformer", "text_encoder", "tokenizer"}
    assert not any(p.suffix in (".bin", ".pt") for p in files)
    assert sum(p.stat().st_size for p in files) < 10 * 2**20
    report = json.loads((WEIGHTS_DIR / REPORT_FILE).read_text())
    assert report["finished"] and report["heldout_solved"] is False  # RL has something to teach
    assert report["eval"]["train"]["correct"] > report["eval"]["heldout"]["correct"]  # learned train more
    adapter = default_registry().build("adapter", "moving_shapes", {}, BuildContext(device="cpu"))
    direct = MovingShapesAdapter.load(WEIGHTS_DIR)
    for a, b in zip(adapter.denoiser.parameters(), direct.denoiser.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_recipe_options_default_to_the_worlds_clip_and_the_shipped_models_size() -> None:
    """One clip length and frame side: the recipe's, the model's and the renderer's defaults agree."""
    report = json.loads((WEIGHTS_DIR / REPORT_FILE).read_text())
    options = Config()
    assert (options.num_frames, options.resolution) == (DEFAULT_FRAMES, DEFAULT_SIZE)
    assert (ModelSize().num_frames, ModelSize().resolution) == (DEFAULT_FRAMES, DEFAULT_SIZE)
    assert (report["size"]["num_frames"], report["size"]["resolution"]) == (DEFAULT_FRAMES, DEFAULT_SIZE)
    adapter = MovingShapesAdapter.load(WEIGHTS_DIR)
    assert (adapter.num_frames, adapter.side) == (DEFAULT_FRAMES, DEFAULT_SIZE)


def test_a_folder_missing_parts_is_a_one_line_error(tmp_path: Path) -> None:
    context = BuildContext(device="cpu", seed=0, run_dir=None, recipe_dir=tmp_path)
    (tmp_path / "half" / "transformer").mkdir(parents=True)
    with pytest.raises(ModelWeightsError, match=r"lacks text_encoder/, tokenizer/"):
        default_registry().build("adapter", "moving_shapes", {"model_path": "half"}, context)


def test_a_three_step_pretraining_writes_a_loadable_folder_and_its_report(tmp_path: Path) -> None:
    config = PretrainConfig(steps=3, batch_size=2, lr=3e-3, warmup_steps=1)
    out = tmp_path / "m"
    report = pretrain_moving_shapes(
        out, config, TINY, eval_seeds=(0,), log=lambda s: None, max_eval_prompts=4
    )
    assert report["steps"] == 3 and report["finished"] and not resume_state_file(out).parent.exists()
    written = json.loads((out / REPORT_FILE).read_text())
    assert written["eval"]["heldout"].keys() == {*CRITERIA, "correct"} == written["eval"]["train"].keys()
    assert written["heldout_solved"] is False and written["size"]["num_frames"] == TINY.num_frames
    loaded = _load(out)
    assert all("name_or_path" not in json.loads(p.read_text()) for p in out.glob("*/config.json"))
    initial = _load(build_moving_shapes_model(tmp_path / "init", TINY))
    assert any(  # trained: the saved weights moved away from the initial ones
        not torch.equal(a, b)
        for a, b in zip(loaded.denoiser.parameters(), initial.denoiser.parameters(), strict=True)
    )


def test_a_capped_run_resumes_to_the_uninterrupted_runs_weights(tmp_path: Path) -> None:
    """``max_minutes=0`` stops after every step; two resumes finish the schedule where one run ends."""
    quiet = lambda s: None  # noqa: E731
    base = PretrainConfig(steps=3, batch_size=2, lr=3e-3, warmup_steps=1)
    pretrain_moving_shapes(tmp_path / "whole", base, TINY, eval_seeds=(), log=quiet)
    capped = PretrainConfig(**{**base.__dict__, "max_minutes": 0.0})
    out = tmp_path / "capped"
    first = pretrain_moving_shapes(out, capped, TINY, eval_seeds=(), log=quiet)
    assert first["steps"] == 1 and not first["finished"] and resume_state_file(out).is_file()
    longer = PretrainConfig(**{**capped.__dict__, "steps": 4})
    with pytest.raises(RecipeError, match="saved with other config"):  # another schedule: refused
        pretrain_moving_shapes(out, longer, TINY, eval_seeds=(), log=quiet)
    other_length = dataclasses.replace(TINY, num_frames=TINY.num_frames * 2)  # same weights' shapes
    with pytest.raises(RecipeError, match="saved with other size"):
        pretrain_moving_shapes(out, capped, other_length, eval_seeds=(), log=quiet)
    pretrain_moving_shapes(out, capped, TINY, eval_seeds=(), log=quiet)
    last = pretrain_moving_shapes(out, capped, TINY, eval_seeds=(), log=quiet)
    assert last["steps"] == 3 and last["finished"] and not resume_state_file(out).parent.exists()
    whole, resumed = _load(tmp_path / "whole"), _load(out)
    for a, b in zip(whole.denoiser.parameters(), resumed.denoiser.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(whole.text_encoder.parameters(), resumed.text_encoder.parameters(), strict=True):
        assert torch.equal(a, b)


def test_flow_matching_loss_takes_clips(folder: Path) -> None:
    adapter = _load(folder)
    x0 = render_clips(PROMPTS, np.random.default_rng(0), TINY.resolution, TINY.num_frames)
    loss = flow_matching_loss(adapter, x0, PROMPTS, torch.Generator().manual_seed(0))
    assert loss.ndim == 0 and torch.isfinite(loss) and loss > 0


def test_the_command_and_both_plugins_are_registered() -> None:
    add_plugin_commands(app)  # what `vgrpo` does at start (once per process)
    runner = CliRunner()
    result = runner.invoke(app, ["pretrain-moving-shapes", "--help"])
    assert result.exit_code == 0, result.output
    flags = ("--out", "--steps", "--minutes", "--seed", "--eval-seeds", "--frames-per-token")
    assert all(flag in result.output for flag in flags)
    listed = runner.invoke(app, ["plugins"])
    assert listed.exit_code == 0, listed.output
    rows = [line for line in listed.output.splitlines() if "moving_shapes" in line]
    assert any("adapter" in r for r in rows) and any("reward" in r for r in rows), listed.output


def test_the_same_command_again_goes_on_from_a_capped_run(tmp_path: Path) -> None:
    """The CLI keeps a capped run's state in ``OUT_resume/`` and the next identical call finishes it."""
    add_plugin_commands(app)
    out = tmp_path / "m"
    command = [
        "pretrain-moving-shapes",
        "--out",
        str(out),
        "--steps",
        "2",
        "--minutes",
        "0",
        "--eval-seeds",
        "0",
    ]
    first = CliRunner().invoke(app, command)
    assert first.exit_code == 0, first.output
    assert "stopped at step 1/2" in first.output and resume_state_file(out).is_file()
    second = CliRunner().invoke(app, command)
    assert second.exit_code == 0, second.output
    assert "resuming at step 1/2" in second.output and not resume_state_file(out).parent.exists()
    assert json.loads((out / REPORT_FILE).read_text())["finished"] is True


def test_frames_per_token_sets_the_temporal_patch_and_a_non_divisor_is_refused(tmp_path: Path) -> None:
    add_plugin_commands(app)
    out = tmp_path / "m"
    base = ["pretrain-moving-shapes", "--out", str(out), "--steps", "1", "--eval-seeds", "0"]
    refused = CliRunner().invoke(app, [*base, "--frames-per-token", "3"])
    assert refused.exit_code != 0 and "does not divide the clip's 4 frames" in refused.output
    assert not out.exists()
    made = CliRunner().invoke(app, [*base, "--frames-per-token", "2"])
    assert made.exit_code == 0, made.output
    config = json.loads((out / "transformer" / "config.json").read_text())
    assert config["patch_size"] == [2, 4, 4]
    adapter = MovingShapesAdapter.load(out)  # the folder's own patch: no size to pass when loading
    x0 = render_clips(PROMPTS[:1], np.random.default_rng(0), 32, 4)
    loss = flow_matching_loss(adapter, x0, PROMPTS[:1], torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)
