"""``[train.data_anchor]``: DDRL's flow-matching loss on real data beside the surrogate's loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from toy_runs import TOY, surrogate_toy_run

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.config.schema import DataAnchorSection
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.parallel.data_parallel import Shard
from vgrpo_platform.training.iteration.data_anchor import METRIC, DataAnchor, anchor_generator

RESOLUTION = 16  # recipes/toy.toml's


def write_anchor(path: Path, n: int = 6, shape: tuple[int, ...] = (3, RESOLUTION, RESOLUTION)) -> Path:
    latents = torch.randn((n, *shape), generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
    prompts = [f"a data image {i}" for i in range(n)]
    save_file({"latents": latents}, str(path), metadata={"prompts": json.dumps(prompts)})
    return path


@pytest.fixture(scope="module")
def toy_adapter():
    from vgrpo_adapters.toy import ToyAdapterConfig
    from vgrpo_adapters.toy.impl import ToyAdapter

    from vgrpo_platform.protocols import BuildContext

    torch.manual_seed(0)
    return ToyAdapter.from_config(ToyAdapterConfig(resolution=RESOLUTION), BuildContext())


def test_anchor_loss_is_the_velocity_mse_recomputed_by_hand(tmp_path: Path, toy_adapter) -> None:
    path = write_anchor(tmp_path / "data.safetensors")
    config = DataAnchorSection(weight=1.0, source=str(path), batch_size=4, seed=7)
    anchor = DataAnchor(config, toy_adapter)
    loss = anchor.loss(toy_adapter, 3, torch.device("cpu"), torch.float32)

    g = anchor_generator(7, 3)  # the same draws, in the same order
    index = torch.randint(6, (4,), generator=g)
    u = torch.rand(4, generator=g)
    shift = toy_adapter.schedule.shift
    t = (shift * u / (1 + (shift - 1) * u)).clamp(1e-3, 1 - 1e-3)
    eps = torch.randn((4, 3, RESOLUTION, RESOLUTION), generator=g)
    x0 = anchor.latents[index]
    z = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    v = toy_adapter.predict(z, t, toy_adapter.encode_prompts([anchor.prompts[i] for i in index]))
    assert torch.allclose(loss, ((v - (eps - x0)) ** 2).mean(), rtol=1e-4, atol=1e-6)
    assert loss.requires_grad  # it trains the denoiser


def test_two_ranks_draw_the_halves_of_one_process_batch(tmp_path: Path, toy_adapter) -> None:
    path = write_anchor(tmp_path / "data.safetensors")
    config = DataAnchorSection(weight=1.0, source=str(path), batch_size=4)
    whole = DataAnchor(config, toy_adapter).draw(toy_adapter, 5)
    halves = [DataAnchor(config, toy_adapter, Shard(r, 2)).draw(toy_adapter, 5) for r in range(2)]
    assert torch.equal(torch.cat([h[0] for h in halves]), whole[0])
    assert torch.equal(torch.cat([h[1] for h in halves]), whole[1])
    assert halves[0][2] + halves[1][2] == whole[2]
    with pytest.raises(RecipeError, match="multiple of 3"):
        DataAnchor(config, toy_adapter, Shard(0, 3))


def test_latents_of_another_shape_are_a_recipe_error(tmp_path: Path, toy_adapter) -> None:
    path = write_anchor(tmp_path / "data.safetensors", shape=(3, 8, 8))
    with pytest.raises(RecipeError, match="shape"):
        DataAnchor(DataAnchorSection(weight=1.0, source=str(path)), toy_adapter)


def test_a_missing_dataset_is_a_one_line_recipe_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        resolve_recipe(
            TOY, ["train.data_anchor.weight=0.5", "train.data_anchor.source='nowhere.safetensors'"]
        )
    assert "train.data_anchor.source" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(RecipeError, match="needs train.data_anchor.source"):
        resolve_recipe(TOY, ["train.data_anchor.weight=0.5"])


def test_a_toy_run_with_the_anchor_trains_and_logs_its_loss(tmp_path: Path) -> None:
    path = write_anchor(tmp_path / "data.safetensors")
    records, trainer = surrogate_toy_run(
        tmp_path,
        "vgrpo",
        "train.data_anchor.weight=0.5",
        f"train.data_anchor.source={str(path)!r}",
        "train.data_anchor.batch_size=2",
    )
    assert len(records) == 2
    assert all(METRIC in r and r[METRIC] > 0 for r in records)
    assert records[0][METRIC] != records[1][METRIC]  # a fresh batch (and weights) each step


def test_weight_zero_builds_no_anchor_and_logs_nothing(tmp_path: Path) -> None:
    records, trainer = surrogate_toy_run(tmp_path, "vgrpo", "train.data_anchor.source='nowhere.safetensors'")
    assert trainer.update.anchor is None and all(METRIC not in r for r in records)


def test_the_shapes_renderer_writes_anchor_data_the_shapes_adapter_takes(tmp_path: Path) -> None:
    from vgrpo_adapters.shapes import Config
    from vgrpo_adapters.shapes.anchor_data import write_shapes_anchor
    from vgrpo_adapters.shapes.impl import load_shapes_adapter

    from vgrpo_platform.protocols import BuildContext

    path = write_shapes_anchor(tmp_path / "shapes.safetensors", 4, seed=1)
    adapter = load_shapes_adapter(Config(), BuildContext())
    anchor = DataAnchor(DataAnchorSection(weight=1.0, source=str(path), batch_size=4), adapter)
    assert anchor.latents.shape == (4, 3, 32, 32) and anchor.latents.min() >= -1 and anchor.latents.max() <= 1
    assert len(set(anchor.prompts)) > 1
    with torch.no_grad():
        pretrained = anchor.loss(adapter, 0, torch.device("cpu"), torch.float32)
    assert torch.isfinite(pretrained)


def test_the_shapes_anchor_data_command_writes_a_readable_data_set(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner
    from vgrpo_adapters import shapes as shapes_entry

    from vgrpo_platform.training.iteration.data_anchor import load_anchor_data

    app = typer.Typer()
    shapes_entry.register_commands(app)
    out = tmp_path / "anchor.safetensors"
    result = CliRunner().invoke(
        app, ["shapes-anchor-data", "--out", str(out), "--samples", "3", "--seed", "2"]
    )
    assert result.exit_code == 0, result.output
    latents, prompts = load_anchor_data(out)
    assert latents.shape == (3, 3, 32, 32) and len(prompts) == 3
