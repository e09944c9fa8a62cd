"""The http_engine backend against the fake engine: the trainer's rollouts come back over HTTP."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from vgrpo_example_engine.fake_engine import FakeEngine, serve

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.testing import check_entry_module_cheap
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics

RECIPE = Path(__file__).resolve().parents[1] / "recipe.toml"


@pytest.fixture(scope="module")
def engine_url():
    server = serve(FakeEngine(str(RECIPE)), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}"
    server.shutdown()


def train(tmp_path: Path, url: str, *overrides: str) -> list[dict]:
    settings = [f"run.output_dir={tmp_path.as_posix()!r}", f"rollout.backend_options.url={url!r}"]
    settings += ["train.iterations=4", "log.progress='none'", *overrides]
    run_dir = Trainer(resolve_recipe(RECIPE, settings)).run()
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def test_the_entry_module_is_cheap():
    check_entry_module_cheap("vgrpo_example_engine")


@pytest.mark.parametrize("send_noise", [True, False])
def test_the_engine_with_the_trainers_weights_makes_the_trainers_rollouts(tmp_path, engine_url, send_noise):
    """Without overlap the engine has every update before it generates: the exact sampler, regenerated
    from the noise the engine used (the trainer's, or the engine's own draw from the seeds), agrees."""
    noise = [f"rollout.backend_options.send_noise={str(send_noise).lower()}"]
    records = train(tmp_path, engine_url, "rollout.overlap=false", "rollout.mismatch_every=1", *noise)
    assert [r["rollout_staleness"] for r in records] == [0.0] * 4
    assert all(r["rollout_mismatch_rel_rmse"] < 1e-4 for r in records)


def test_overlapped_rollouts_are_one_update_behind(tmp_path, engine_url):
    records = train(tmp_path, engine_url)
    assert [r["rollout_staleness"] for r in records] == [0.0, 1.0, 1.0, 1.0]
