"""The ``tones`` adapter: a tiny folder loads through the plugin, samples, decodes, trains a LoRA;
its codec keeps what the ``tones`` reward hears; ``vgrpo pretrain-tones`` writes a loadable, resumable run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import adapter_checks as checks
import numpy as np
import pytest
import torch
from typer.testing import CliRunner
from vgrpo_adapters import tones as tones_entry
from vgrpo_adapters._flow_pretrain import resume_state_file, score_into
from vgrpo_adapters._weights import ModelWeightsError
from vgrpo_adapters.tones import WEIGHTS_DIR, Config
from vgrpo_adapters.tones.build import ModelSize, build_tones_model
from vgrpo_adapters.tones.codec import BINS, FRAMES, N_SAMPLES, SAMPLE_RATE, SpectrogramCodec
from vgrpo_adapters.tones.impl import TonesAdapter, model_folder
from vgrpo_adapters.tones.pretrain import TONES_CONFIG, pretrain, rescore, synth_batch, world_words
from vgrpo_rewards import tones as tones_rewards
from vgrpo_rewards.tones import world as w
from vgrpo_rewards.tones.detect import score_clip

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.ode_solvers import solve_flow_ode
from vgrpo_platform.protocols import Adapter, BuildContext, SamplerSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = ModelSize(dit_dim=32, dit_depth=1, dit_heads=2, text_dim=16, text_layers=1, text_heads=2)
PROMPTS = ["a high beep", "two short clicks then a rising tone"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny random model saved with ``save_pretrained``, its output layer nudged off LongCat's zero init
    (so predictions depend on the inputs)."""
    path = build_tones_model(tmp_path_factory.mktemp("tones") / "model", TINY, words=tuple(world_words()))
    adapter = TonesAdapter.load(path)
    with torch.no_grad():
        adapter.denoiser.proj_out.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(0))
        adapter.denoiser.norm_out.linear.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
    adapter.denoiser.save_pretrained(path / "transformer")
    return path


def build(options: dict) -> TonesAdapter:
    registry = checks.registry_of(tones_entry)
    return registry.build("adapter", "tones", options, BuildContext())


def test_registered_with_documented_options_and_a_torch_free_entry_module() -> None:
    spec = checks.registry_of(tones_entry).get("adapter", "tones")
    assert spec.config is Config and Config.modality == "audio"
    assert all(field.description for field in Config.model_fields.values())
    code = "import vgrpo_adapters.tones, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_path_defaults_to_the_shipped_model_and_is_resolved_against_the_recipe_folder(
    tmp_path: Path,
) -> None:
    assert model_folder(Config()) == WEIGHTS_DIR
    assert model_folder(Config(model_path="m"), BuildContext(recipe_dir=tmp_path)) == tmp_path / "m"
    with pytest.raises(ModelWeightsError, match="lacks transformer/.*vgrpo pretrain-tones"):
        build({"model_path": str(tmp_path / "missing")})


def test_the_shipped_model_is_small_finished_and_not_solving_the_heldout_sounds() -> None:
    files = [p for p in WEIGHTS_DIR.rglob("*") if p.is_file()]
    assert {p.parent.name for p in files} >= {"transformer", "text_encoder", "tokenizer"}
    assert not any(p.suffix in (".bin", ".pt") for p in files)
    assert sum(p.stat().st_size for p in files) < 10 * 2**20
    report = json.loads((WEIGHTS_DIR / "pretrain_report.json").read_text())
    assert report["finished"] and report["heldout_solved"] is False  # RL has something to teach
    assert report["eval"]["train"]["correct"] > report["eval"]["heldout"]["correct"]  # learned train more
    adapter = build({})
    direct = TonesAdapter.load(WEIGHTS_DIR)
    for a, b in zip(adapter.denoiser.parameters(), direct.denoiser.parameters(), strict=True):
        assert torch.equal(a, b)


def test_codec_keeps_what_the_reward_hears_on_every_prompt() -> None:
    """Synthesised clips, encoded to latents and decoded by Griffin-Lim, are still judged correct."""
    codec = SpectrogramCodec()
    prompts = w.all_prompts()
    latents = synth_batch(prompts, np.random.default_rng(0), codec)
    assert latents.shape == (len(prompts), BINS, FRAMES) and latents.min() >= -1 and latents.max() <= 1
    waves = codec.decode(latents)
    assert torch.equal(waves, codec.decode(latents))  # a deterministic decode
    for prompt, wave in zip(prompts, waves, strict=True):
        assert score_clip(wave, w.parse_prompt(prompt))["correct"] == 1.0, prompt
    assert codec.magnitude(-torch.ones(1, BINS, FRAMES)).abs().max() == 0  # the floor is silence


def test_loads_samples_through_the_core_sampler_and_decodes_audio(folder: Path) -> None:
    adapter = build({"model_path": str(folder), "shift": 3.0})
    assert isinstance(adapter, TonesAdapter) and isinstance(adapter, Adapter)
    assert adapter.latent_shape() == (BINS, FRAMES) and adapter.modality == "audio"
    assert not any(p.requires_grad for p in adapter.text_encoder.parameters())
    cond = adapter.encode_prompts(PROMPTS)
    assert cond["prompt_mask"].sum(1).tolist() == [5, 9]  # one token a word, + BOS and EOS
    noise = torch.randn(2, BINS, FRAMES, generator=torch.Generator().manual_seed(0))
    sampler = SamplerSpec("dpmsolver++", 4)
    x0 = adapter.sample(noise, cond, sampler)
    by_hand = solve_flow_ode(lambda z, t: adapter.predict(z, t, cond), noise, sampler, shift=3.0)
    assert torch.equal(x0, by_hand) and not torch.allclose(x0, noise)
    clips = adapter.decode(x0)
    assert clips.modality == "audio" and clips.sample_rate == SAMPLE_RATE
    assert clips.data.shape == (2, 1, N_SAMPLES) and clips.data.abs().max() <= 1


def test_velocity_is_longcats_reversed_time_prediction_negated(folder: Path) -> None:
    adapter = TonesAdapter.load(folder)
    cond = adapter.encode_prompts(PROMPTS)
    z = torch.randn(2, BINS, FRAMES, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.2, 0.7])
    with torch.no_grad():
        raw = adapter.denoiser(
            hidden_states=z.transpose(1, 2),
            encoder_hidden_states=cond["prompt_embeds"],
            encoder_attention_mask=cond["prompt_mask"],
            timestep=1 - t,
        ).sample
        assert torch.equal(adapter.predict(z, t, cond), -raw.transpose(1, 2))


def test_lora_export_reloads_with_peft_and_gives_the_trained_velocities(folder: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    trained = TonesAdapter.load(folder)
    checks.attach_trained_lora(trained)
    trained.export_trained(tmp_path / "final")
    fresh = TonesAdapter.load(folder)

    def load() -> None:
        config = json.loads((tmp_path / "final" / "transformer_lora_config.json").read_text())
        inject_adapter_in_model(LoraConfig(**config), fresh.denoiser)
        loaded = set_peft_model_state_dict(
            fresh.denoiser, load_file(tmp_path / "final" / "transformer_lora.safetensors")
        )
        assert not loaded.unexpected_keys

    z, t = torch.randn(2, BINS, FRAMES, generator=torch.Generator().manual_seed(2)), torch.tensor([0.3, 0.8])
    cond = trained.encode_prompts(PROMPTS)
    checks.assert_reload_matches(trained, fresh, load, z, t, cond, atol=1e-6, rtol=1e-5)


def test_a_lora_v_grpo_run_on_the_tones_reward_trains_and_exports(folder: Path, tmp_path: Path) -> None:
    """Two LoRA iterations scored by ``tones`` (and ``loudness``, whose spread moves a random model's LoRA
    where ``tones`` gives a whole group the same score)."""
    from vgrpo_rewards import audio as audio_rewards

    from vgrpo_platform.algo.surrogates import entry as surrogates
    from vgrpo_platform.training.loop import Trainer

    recipe = tmp_path / "tones.toml"
    recipe.write_text(
        f'[run]\nname = "tones"\n\n[adapter]\nname = "tones"\n\n'
        f'[adapter.options]\nmodel_path = "{folder}"\n\n'
        '[[rewards]]\nname = "tones"\n\n[[rewards]]\nname = "loudness"\n\n[surrogate]\nname = "vgrpo"\n\n'
        f"[prompts]\ntrain = {json.dumps(w.train_prompts()[:4])}\n\n"
        '[rollout]\nsampler = "dpmsolver++"\n\n[train]\nfinetune = "lora"\n'
    )
    registry = checks.registry_of(tones_entry, tones_rewards, audio_rewards, surrogates)
    overrides = [
        *checks.cpu_run(tmp_path),
        *checks.lora_iterations(2, group_size=4, steps=2, micro_batch_size=8),
        "eval.every=0",
    ]
    trainer = Trainer(resolve_recipe(recipe, overrides, registry=registry))
    run_dir = trainer.run()
    records = checks.assert_trained(run_dir, 2)
    assert all("reward/tones" in rec or any("tones" in k for k in rec) for rec in records), records[0]
    checks.assert_lora_moved(trainer.session.adapter)
    assert (run_dir / "final" / "transformer_lora.safetensors").is_file()


def test_pretraining_smoke_writes_a_loadable_folder_and_a_report(tmp_path: Path) -> None:
    config = dataclasses.replace(TONES_CONFIG, steps=3, batch_size=4, warmup_steps=1)
    report = pretrain(tmp_path / "m", config, TINY, eval_seeds=(0,), log=lambda s: None)
    assert (
        report["steps"] == 3 and report["finished"] and not resume_state_file(tmp_path / "m").parent.exists()
    )
    written = json.loads((tmp_path / "m" / "pretrain_report.json").read_text())
    assert set(written["eval"]) == {"train", "heldout"}
    assert set(written["eval"]["heldout"]) == {"count", "kind", "pitch", "direction", "order", "correct"}
    assert written["heldout_solved"] is False  # three steps solve nothing
    adapter = TonesAdapter.load(tmp_path / "m")
    assert adapter.denoiser.config.dit_dim == TINY.dit_dim
    assert (
        len(adapter.tokenizer("a high beep then two short clicks", add_special_tokens=False).input_ids) == 7
    )


def test_rescoring_reevaluates_under_the_current_judge_and_keeps_the_old_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A judge whose defaults change moves the report's figures with no training: ``rescore`` writes the
    new ones and keeps the replaced ones beside them."""
    import vgrpo_adapters.tones.pretrain as pretraining

    config = dataclasses.replace(TONES_CONFIG, steps=2, batch_size=2, warmup_steps=1)
    first = pretrain(tmp_path / "m", config, TINY, eval_seeds=(0,), log=lambda s: None)
    again = rescore(tmp_path / "m", log=lambda s: None)  # same judge, same model: same figures
    assert again["eval"] == first["eval"] and again["rescored"][0]["before"]["eval"] == first["eval"]
    judge = pretraining.TonesRewardConfig
    monkeypatch.setattr(pretraining, "TonesRewardConfig", lambda: judge(floor_db=1000.0))  # hears nothing
    rescore(tmp_path / "m", log=lambda s: None)
    written = json.loads((tmp_path / "m" / "pretrain_report.json").read_text())
    assert written["eval"]["heldout"]["count"] == 0 and written["eval_seeds"] == [0]
    assert [r["before"]["eval"] for r in written["rescored"]] == [first["eval"], first["eval"]]
    with pytest.raises(RecipeError, match="has no pretrain_report.json"):
        rescore(tmp_path / "nothing", log=lambda s: None)


def test_written_and_rescored_reports_judge_solved_by_one_rule() -> None:
    """``score_into`` is what both ``write_pretrained`` and ``rescore_report`` call: the held-out
    ``correct`` at or above ``solved`` marks the base model as leaving RL nothing to teach, and says so."""
    lines: list[str] = []
    scores = {"train": {"correct": 0.9}, "heldout": {"correct": 0.5}}
    report: dict = {}
    score_into(report, scores, (3,), solved=0.5, log=lines.append)
    assert report == {"eval": scores, "eval_seeds": [3], "heldout_solved": True}
    assert lines[0].startswith("train    correct 0.900") and "train less" in lines[-1]
    lines.clear()
    score_into(report, scores, (3,), solved=0.51, log=lines.append)
    assert report["heldout_solved"] is False and len(lines) == 2
    unjudged: dict = {}
    score_into(unjudged, scores, (0, 1), solved=None, log=lines.append)
    assert "heldout_solved" not in unjudged and unjudged["eval_seeds"] == [0, 1]


def test_a_capped_run_resumes_to_the_uninterrupted_runs_weights(tmp_path: Path) -> None:
    config = dataclasses.replace(TONES_CONFIG, steps=3, batch_size=2, warmup_steps=1)
    pretrain(tmp_path / "a", config, TINY, eval_seeds=(), log=lambda s: None)
    capped = dataclasses.replace(config, max_minutes=0)  # stops after every step
    first = pretrain(tmp_path / "b", capped, TINY, eval_seeds=(), log=lambda s: None)
    assert first["steps"] == 1 and not first["finished"] and resume_state_file(tmp_path / "b").is_file()
    pretrain(tmp_path / "b", capped, TINY, eval_seeds=(), log=lambda s: None)
    last = pretrain(tmp_path / "b", config, TINY, eval_seeds=(), log=lambda s: None)
    assert last["steps"] == 3 and last["finished"] and not resume_state_file(tmp_path / "b").parent.exists()
    a, b = TonesAdapter.load(tmp_path / "a"), TonesAdapter.load(tmp_path / "b")
    for (name, p), q in zip(a.denoiser.state_dict().items(), b.denoiser.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    pretrain(tmp_path / "c", capped, TINY, eval_seeds=(), log=lambda s: None)
    with pytest.raises(RecipeError, match="saved with other config"):
        pretrain(tmp_path / "c", dataclasses.replace(config, lr=0.1), TINY, eval_seeds=(), log=lambda s: None)


def test_cli_pretrain_tones_and_plugins_list_both_plugins(tmp_path: Path) -> None:
    from vgrpo_platform.cli import app as cli

    runner = CliRunner()
    listed = runner.invoke(cli.app, ["plugins"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in listed.stdout.splitlines()]
    assert {(row[0], row[1]) for row in cells if len(row) > 2 and row[1] == "tones"} == {
        ("adapter", "tones"),
        ("reward", "tones"),
    }, listed.stdout
    import typer

    app = typer.Typer()

    @app.command()
    def other() -> None:  # a second command, so typer keeps sub-command names
        pass

    from vgrpo_platform.host.manager import build_plugin_manager

    build_plugin_manager(load_entry_points=False, extra_plugins=[tones_entry]).hook.register_commands(app=app)
    result = runner.invoke(
        app, ["pretrain-tones", "--out", str(tmp_path / "m"), "--steps", "2", "--eval-seeds", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "step 2/2" in result.stdout
    report = json.loads((tmp_path / "m" / "pretrain_report.json").read_text())
    assert report["steps"] == 2 and report["config"]["steps"] == 2
    assert TonesAdapter.load(tmp_path / "m").denoiser.config.dit_dim == ModelSize().dit_dim
    nothing = runner.invoke(app, ["pretrain-tones", "--out", str(tmp_path / "none"), "--rescore"])
    assert isinstance(nothing.exception, RecipeError) and not (tmp_path / "none").exists()
