"""A run's export, end to end on the toy model: ``RUN/final`` (weights, note, model card) at the end of a
run, ``vgrpo export`` of a checkpoint, ``vgrpo push`` (to a folder, and to a stand-in for the Hub), and
``train.init_lora`` starting a new run from an export's weights."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from vgrpo_platform import finetune
from vgrpo_platform.cli import app as cli
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import CheckpointError, HubError, RecipeError
from vgrpo_platform.lora_files import EXPORT_INFO, LORA_FILE
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics
from vgrpo_platform.training.session import fingerprint

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOY = Path(__file__).resolve().parents[1] / "recipes" / "toy.toml"
PROMPTS = ["a bright image", "a dark image"]


def toy_overrides(out: Path, name: str, *extra: str) -> list[str]:
    """Two quick LoRA iterations of the toy recipe, evaluated before and after, ending with a checkpoint."""
    return [
        f"run.output_dir={out.as_posix()!r}",
        f"run.name={name!r}",
        "log.progress='none'",
        "log.save_grids=false",
        "train.iterations=2",
        "train.micro_batch_size=8",
        "rollout.group_size=4",
        "rollout.prompts_per_iteration=1",
        "eval.every=0",
        "eval.max_prompts=1",
        "eval.samples_per_prompt=2",
        *extra,
    ]


def velocities(adapter: Any) -> torch.Tensor:
    """The adapter's prediction on fixed noise, times and prompts."""
    z = torch.randn(2, *adapter.latent_shape(), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return adapter.predict(z, torch.tensor([0.3, 0.8]), adapter.encode_prompts(PROMPTS))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One toy run with a moving average (rank 4, alpha 8): its directory, and the served velocities."""
    out = tmp_path_factory.mktemp("runs")
    extra = ("train.ema_decay=0.5", "train.lora_rank=4", "train.lora_alpha=8")
    trainer = Trainer(resolve_recipe(TOY, toy_overrides(out, "first", *extra)))
    run_dir = trainer.run()
    with trainer.average.applied(trainer.session.trainable):  # what the run served and exported
        served = velocities(trainer.session.adapter)
    with finetune.reference_mode(trainer.session.adapter):
        base = velocities(trainer.session.adapter)
    return {"run_dir": run_dir, "served": served, "base": base}


def load_into_plain_sd3(final: Path, run_dir: Path) -> Any:
    """The base toy model of the run with the export loaded by diffusers' own loader."""
    from diffusers import SD3Transformer2DModel
    from vgrpo_adapters.toy.impl import ToyAdapter

    base = ToyAdapter.load(run_dir / "toy_model")
    transformer = SD3Transformer2DModel.from_pretrained(run_dir / "toy_model" / "transformer")
    transformer.load_lora_adapter(final, weight_name=LORA_FILE)
    return ToyAdapter(transformer, base.text_encoder, base.tokenizer)


# ---------------------------------------------------------------------------------------- end of run


def test_a_run_ends_with_a_loadable_export_of_the_served_weights(trained) -> None:
    run_dir = trained["run_dir"]
    final = run_dir / "final"
    info = json.loads((final / EXPORT_INFO).read_text())
    assert info["kind"] == "lora" and (info["lora_rank"], info["lora_alpha"]) == (4, 8)
    loaded = velocities(load_into_plain_sd3(final, run_dir))
    assert (trained["served"] - trained["base"]).abs().max() > 1e-4  # training moved the policy
    torch.testing.assert_close(loaded, trained["served"], atol=1e-6, rtol=1e-5)


def test_the_model_card_reports_the_runs_evaluations_and_how_to_load(trained) -> None:
    from huggingface_hub import ModelCard

    run_dir = trained["run_dir"]
    card = ModelCard.load(run_dir / "final" / "README.md")
    assert {"vgrpo", "lora", "toy", "text-to-image"} <= set(card.data.tags)
    assert card.data.library_name == "diffusers" and card.data.base_model is None  # a local folder
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    first, last = evals[0], evals[-1]
    before, after = first["reward"], last["reward"]
    assert f"| `reward` | {before:.4f} | {after:.4f} | {after - before:+.4f} |" in card.text
    assert "load_lora_adapter" in card.text and "train.ema_decay = 0.5" in card.text
    final = run_dir.resolve() / "final"  # where the export lay here means nothing where the card is read
    assert str(final) not in card.text and "load_lora_adapter('path/to/this/folder'" in card.text
    assert "LoRA (rank 4, alpha 8)" in card.text


# --------------------------------------------------------------------------------------- vgrpo export


def test_vgrpo_export_rewrites_a_checkpoint_as_the_run_exported_it(trained, tmp_path) -> None:
    """``vgrpo export`` of the run's last checkpoint gives the end of run's weights bit for bit (the moving
    average), and its card also reports a ``vgrpo eval`` of the run."""
    run_dir, again = trained["run_dir"], tmp_path / "again"
    report = {
        "checkpoint": None,
        "protocol": {"prompts": ["p"], "samples_per_prompt": 2, "seed": 1},
        "results": {"reward": {"mean": 0.25, "sem": 0.125, "n": 2}},
    }
    (run_dir / "eval" / "base").mkdir(parents=True)
    (run_dir / "eval" / "base" / "eval.json").write_text(json.dumps(report))
    overrides = toy_overrides(run_dir.parent, "first", "train.lora_rank=4", "train.lora_alpha=8")
    args = ["export", str(TOY), "--out", str(again), *[a for o in overrides for a in ("--set", o)]]
    try:
        result = CliRunner().invoke(cli.app, args)
    finally:
        (run_dir / "eval" / "base" / "eval.json").unlink()
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith(str(again))
    exported = load_file(again / LORA_FILE)
    for name, tensor in load_file(run_dir / "final" / LORA_FILE).items():
        assert torch.equal(exported[name], tensor), name
    card = (again / "README.md").read_text()
    assert "`vgrpo eval` of the base model" in card and "| `reward` | 0.2500 | 0.1250 | 2 |" in card


def test_vgrpo_export_refuses_a_folder_that_is_not_an_export(trained, tmp_path) -> None:
    from vgrpo_platform.cli.publish import export_checkpoint

    (tmp_path / "notes.txt").write_text("mine")
    overrides = toy_overrides(trained["run_dir"].parent, "first", "train.lora_rank=4", "train.lora_alpha=8")
    resolved = resolve_recipe(TOY, overrides)
    with pytest.raises(CheckpointError, match="is not a vgrpo export"):
        export_checkpoint(resolved, out=tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ----------------------------------------------------------------------------------------- vgrpo push


def test_push_to_a_folder_writes_the_weights_and_the_model_card(trained, tmp_path) -> None:
    target = tmp_path / "upload"
    result = CliRunner().invoke(
        cli.app, ["push", str(trained["run_dir"]), "--repo-id", "me/toy-lora", "--to-folder", str(target)]
    )
    assert result.exit_code == 0, result.output
    assert {p.name for p in target.iterdir()} == {LORA_FILE, EXPORT_INFO, "README.md"}
    assert "load_lora_adapter" in (target / "README.md").read_text()


def test_push_uploads_the_export_folder_with_huggingface_hub(trained, monkeypatch) -> None:
    import huggingface_hub

    calls: list[tuple[str, dict]] = []

    class FakeApi:
        def create_repo(self, repo_id: str, **kwargs: Any) -> None:
            calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

        def upload_folder(self, **kwargs: Any) -> Any:
            calls.append(("upload_folder", kwargs))
            url = "https://hf.co/me/toy-lora/commit/1"
            return huggingface_hub.CommitInfo(url, commit_message="m", commit_description="", oid="1")

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    from vgrpo_platform.cli.publish import push

    url = push(trained["run_dir"], "me/toy-lora", private=True)
    assert url == "https://hf.co/me/toy-lora/commit/1"
    created = {"repo_id": "me/toy-lora", "private": True, "exist_ok": True, "repo_type": "model"}
    assert calls[0] == ("create_repo", created)
    upload = calls[1][1]
    assert upload["repo_id"] == "me/toy-lora" and Path(upload["folder_path"]) == trained["run_dir"] / "final"


def test_push_failures_are_one_line(trained, tmp_path, monkeypatch) -> None:
    import huggingface_hub

    from vgrpo_platform.cli.publish import push

    with pytest.raises(CheckpointError, match="holds no vgrpo export"):
        push(tmp_path, "me/x")

    class Refusing:
        def create_repo(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("401 Client Error\nInvalid credentials")

    monkeypatch.setattr(huggingface_hub, "HfApi", Refusing)
    with pytest.raises(HubError, match="401 Client Error\\); log in") as caught:
        push(trained["run_dir"], "me/x")
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------------------------------- init_lora


def test_init_lora_starts_training_from_the_exported_weights(trained, tmp_path) -> None:
    final = trained["run_dir"] / "final"
    overrides = toy_overrides(tmp_path, "second", f"train.init_lora={str(final)!r}", "train.lora_rank=2")
    trainer = Trainer(resolve_recipe(TOY, overrides))
    denoiser = trainer.session.adapter.denoiser
    assert finetune.lora_config(denoiser).r == 4  # the file's rank, not the recipe's lora_rank
    torch.testing.assert_close(velocities(trainer.session.adapter), trained["served"], atol=1e-6, rtol=1e-5)
    assert all(p.requires_grad and p.dtype == torch.float32 for p in trainer.session.trainable.values())
    start = {k: p.detach().clone() for k, p in trainer.session.trainable.items()}
    run_dir = trainer.run()
    assert any(not torch.equal(p.detach(), start[k]) for k, p in trainer.session.trainable.items())
    assert json.loads((run_dir / "final" / EXPORT_INFO).read_text())["lora_rank"] == 4


def test_init_lora_is_resolved_against_the_recipe_folder_and_fingerprinted(trained, tmp_path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(TOY.read_text())
    (tmp_path / "start").symlink_to(trained["run_dir"] / "final")
    resolved = resolve_recipe(recipe, ["train.init_lora='start'"])
    assert resolved.recipe.train.init_lora == str((trained["run_dir"] / "final").resolve())
    assert fingerprint(resolved.recipe) != fingerprint(resolve_recipe(recipe).recipe)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("'missing/folder/x'", "train.init_lora: '.*missing/folder/x' does not exist"),
        ("'./nope'", "does not exist"),
    ],
)
def test_a_missing_init_lora_is_a_one_line_recipe_error(value, fragment) -> None:
    with pytest.raises(RecipeError, match=fragment) as caught:
        resolve_recipe(TOY, [f"train.init_lora={value}"])
    assert "\n" not in str(caught.value)


def test_init_lora_needs_lora_finetuning() -> None:
    with pytest.raises(RecipeError, match="train.init_lora starts a LoRA"):
        resolve_recipe(TOY, ["train.init_lora='me/lora'", "train.finetune='full'"])


def test_an_unusable_init_lora_is_a_one_line_error(trained, tmp_path) -> None:
    from vgrpo_adapters.toy import ToyAdapterConfig
    from vgrpo_adapters.toy.impl import ToyAdapter

    from vgrpo_platform.protocols import BuildContext

    final = trained["run_dir"] / "final"
    other = ToyAdapter.from_config(ToyAdapterConfig(num_heads=4), BuildContext())  # wider: other shapes
    no_metadata = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file(load_file(final / LORA_FILE), no_metadata)
    toy = ToyAdapter.load(trained["run_dir"] / "toy_model")
    cases = [
        (other.denoiser, str(final), "does not fit SD3Transformer2DModel"),
        (toy.denoiser, str(no_metadata), "stores no rank and alpha"),
        (toy.denoiser, str(tmp_path), "holds no pytorch_lora_weights.safetensors"),
        (toy.denoiser, "someone/not-cached", "could not be fetched from the Hub"),
    ]
    for denoiser, source, fragment in cases:
        with pytest.raises(CheckpointError, match=fragment) as caught:
            finetune.attach_lora_from(denoiser, source)
        assert "\n" not in str(caught.value)


def test_the_cores_own_export_round_trips_through_init_lora(trained, tmp_path) -> None:
    """An adapter without ``export_trained`` still leaves a LoRA that ``train.init_lora`` reads back."""
    from vgrpo_adapters.toy.impl import ToyAdapter

    source = ToyAdapter.load(trained["run_dir"] / "toy_model")
    finetune.attach_lora(source.denoiser, rank=2, alpha=3, target_modules=source.lora_target_modules)
    with torch.no_grad():
        for name, p in source.denoiser.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    info = finetune.export_trainable(source.denoiser, tmp_path)
    assert info["kind"] == "lora" and "init_lora" in info["load"]
    fresh = ToyAdapter.load(trained["run_dir"] / "toy_model")
    finetune.attach_lora_from(fresh.denoiser, str(tmp_path))
    assert finetune.lora_config(fresh.denoiser).lora_alpha == 3
    torch.testing.assert_close(velocities(fresh), velocities(source), atol=0, rtol=0)
