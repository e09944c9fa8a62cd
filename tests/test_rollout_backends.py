"""Rollout backends: lossy and overlapped backends run, are measured, and are refused with the surrogates
whose ratio is the sampler's own log-probability (that the exact default keeps its numbers is
tests/test_behaviour_record.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vgrpo_platform.cli.app import app
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.protocols import SamplerSpec
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "toy.toml"
MDP_FAMILY = [
    "flow_grpo",
    "mixgrpo",
    "dance_grpo",
    "flow_grpo_fast",
    "flow_grpo_cps",
    "grpo_guard",
    "flow_dppo",
    "tree_grpo",
    "branch_grpo",
]


# ------------------------------------------------------------------------------ refused combinations
@pytest.mark.parametrize("surrogate", MDP_FAMILY)
@pytest.mark.parametrize(
    "backend",
    [
        ["rollout.backend=cached"],
        ["rollout.backend=worker"],
        ["rollout.backend=worker", "rollout.overlap=true"],
    ],
)
def test_a_lossy_or_overlapped_backend_is_refused_with_the_mdp_family(surrogate, backend):
    with pytest.raises(RecipeError, match="per-step log-probs") as info:
        resolve_recipe(TOY, [f"surrogate.name={surrogate!r}", *backend])
    assert "\n" not in str(info.value) and "rollout.backend = 'in_process'" in str(info.value)


@pytest.mark.parametrize(
    "surrogate", ["vgrpo", "elbo_naive", "diffusion_nft", "awm", "awm_authors", "diffusion_dpo", "dgpo"]
)
def test_final_sample_surrogates_accept_any_backend(surrogate):
    resolved = resolve_recipe(
        TOY, [f"surrogate.name={surrogate!r}", "rollout.backend=worker", "rollout.overlap=true"]
    )
    assert resolved.rollout_backend is not None and resolved.rollout_backend.spec.name == "worker"


def test_vgrpo_check_refuses_in_one_line():
    result = CliRunner().invoke(
        app, ["check", str(TOY), "--set", "surrogate.name=flow_grpo", "--set", "rollout.backend=cached"]
    )
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "flow_grpo" in lines[0] and "in_process" in lines[0]


def test_overlap_needs_a_background_backend_and_unknown_backends_are_named():
    with pytest.raises(RecipeError, match="needs a backend that generates in the background"):
        resolve_recipe(TOY, ["rollout.backend=cached", "rollout.overlap=true"])
    with pytest.raises(RecipeError, match="did you mean 'cached'"):
        resolve_recipe(TOY, ["rollout.backend=cahced"])
    with pytest.raises(RecipeError, match="rollout.backend_options"):
        resolve_recipe(TOY, ["rollout.backend=cached", "rollout.backend_options.cahce='mag'"])


# ------------------------------------------------------------------------------ cached
def _shapes_adapter():
    from vgrpo_adapters.shapes import Config
    from vgrpo_adapters.shapes.impl import load_shapes_adapter

    from vgrpo_platform.protocols import BuildContext

    return load_shapes_adapter(Config(), BuildContext())


def test_the_cache_changes_rollouts_only_while_it_is_installed():
    from diffusers.hooks import HookRegistry

    from vgrpo_platform.rollout_backends.cached import CachedBackend

    adapter = _shapes_adapter()
    cond = adapter.encode_prompts(["a red square above a blue circle"] * 4)
    noise = torch.randn((4, *adapter.latent_shape()), generator=torch.Generator().manual_seed(0))
    sampler = SamplerSpec("dpmsolver++", 8)
    exact = adapter.sample(noise, cond, sampler)
    backend = CachedBackend("taylorseer", {"cache_interval": 2, "disable_cache_before_step": 2})
    backend.start(adapter, {})
    cached = backend.sample_chunk(noise, cond, sampler)
    gap = float((cached - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())
    assert 0 < gap < 0.5  # the cache skipped work, and the images are still the model's
    registry = HookRegistry.check_if_exists_or_initialize(adapter.denoiser)
    assert not registry.hooks and all(not r.hooks for r in registry._get_child_registries())
    assert torch.equal(adapter.sample(noise, cond, sampler), exact)  # no hook left behind
    assert not adapter.network.call_hooks


def test_an_unknown_cache_option_is_one_line():
    from vgrpo_platform.rollout_backends.cached import cache_config

    with pytest.raises(RecipeError, match="rollout.backend_options.options: .*cache_intervall"):
        cache_config("taylorseer", {"cache_intervall": 2})


def _toy_run(tmp_path: Path, *overrides: str) -> list[dict]:
    base = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        "log.progress='none'",
        "log.save_grids=false",
        "eval.every=0",
    ]
    trainer = Trainer(resolve_recipe(TOY, [*base, *overrides]))
    run_dir = trainer.run()
    return read_metrics(run_dir / "metrics.jsonl")


def test_a_cached_run_logs_its_measured_gap_to_the_exact_sampler(tmp_path):
    records = _toy_run(
        tmp_path,
        "rollout.backend=cached",
        "rollout.backend_options.options={cache_interval=2, disable_cache_before_step=1}",
        "rollout.steps=6",
        "rollout.mismatch_every=2",
        "train.iterations=4",
    )
    train = [r for r in records if r["kind"] == "train"]
    measured = [r for r in train if "rollout_mismatch_rel_rmse" in r]
    assert [r["iteration"] for r in measured] == [2, 4]
    assert all(r["rollout_mismatch_rel_rmse"] > 0 for r in measured)
    assert all(math.isfinite(r["rollout_mismatch_reward_gap"]) for r in measured)
    from vgrpo_platform.cli.report import read_run_metrics, training_panels, write_report

    metrics = read_run_metrics(tmp_path / "toy" / "metrics.jsonl")
    keys = [key for _, key, _ in training_panels(metrics)]
    assert "rollout_mismatch_rel_rmse" in keys and "rollout_mismatch_reward_gap" in keys
    assert (write_report(tmp_path / "toy").parent / "training.png").exists()


# ------------------------------------------------------------------------------ worker
def test_a_worker_with_the_trainers_weights_generates_the_trainers_rollout(tmp_path):
    """Without overlap the worker receives every update before it generates: its latents are the exact
    sampler's up to float noise between two processes (measured on every iteration)."""
    records = _toy_run(tmp_path, "rollout.backend=worker", "rollout.mismatch_every=1", "train.iterations=3")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["rollout_staleness"] for r in train] == [0.0, 0.0, 0.0]
    assert all(r["rollout_mismatch_rel_rmse"] < 1e-4 for r in train)


def test_an_overlapped_worker_is_one_update_behind_and_still_learns(tmp_path):
    records = _toy_run(tmp_path, "rollout.backend=worker", "rollout.overlap=true", "rollout.mismatch_every=5")
    train = [r for r in records if r["kind"] == "train"]
    assert train[0]["rollout_staleness"] == 0.0 and all(r["rollout_staleness"] == 1.0 for r in train[1:])
    # the stale batch's ratio is taken against the weights that generated it: not 1 at the first step
    assert any(abs(r["ratio_mean"] - 1.0) > 1e-6 for r in train[1:])
    assert all(r["rollout_mismatch_rel_rmse"] > 0 for r in train if "rollout_mismatch_rel_rmse" in r)
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals[-1]["reward"] > evals[0]["reward"] + 0.2  # the toy's brightness is learned as in process


def test_an_overlapped_checkpoint_resumes_with_the_draws_of_the_next_iteration(tmp_path):
    """The checkpoint of an overlapped run stores the loop's state before the next rollout's draws:
    the same state as a run without overlap, so ``--resume`` draws the same prompts and noise."""
    for name, extra in (("plain", []), ("overlap", ["rollout.backend=worker", "rollout.overlap=true"])):
        _toy_run(tmp_path, f"run.name={name!r}", "train.iterations=3", "log.checkpoint_every=2", *extra)
    plain = latest_state(tmp_path / "plain", 2)
    overlap = latest_state(tmp_path / "overlap", 2)
    assert overlap["prompt_sampler"] == plain["prompt_sampler"]
    for key in ("rollout", "surrogate", "shuffle"):
        assert torch.equal(overlap["rng"][key], plain["rng"][key]), key


def latest_state(run_dir: Path, iteration: int) -> dict:
    from vgrpo_platform.training.recovery.checkpoint import list_checkpoints, load_checkpoint

    path = next(p for p in list_checkpoints(run_dir) if load_checkpoint(p).state["iteration"] == iteration)
    ckpt = load_checkpoint(path)
    return {"prompt_sampler": ckpt.state["prompt_sampler"], "rng": ckpt.rng}


# ------------------------------------------------------------------------------ the core owns the call
def test_no_adapter_calls_its_denoiser_and_nothing_patches_or_proxies_it():
    sources = [*ROOT.glob("adapters/**/*.py"), *ROOT.glob("examples/**/*.py")]
    sources += list((ROOT / "vgrpo_platform" / "cli" / "templates").rglob("*.tmpl"))
    calls = [str(p.relative_to(ROOT)) for p in sources if re.search(r"\.denoiser\(", p.read_text())]
    assert not calls
    core = list((ROOT / "vgrpo_platform").rglob("*.py"))
    patches = [
        str(p.relative_to(ROOT)) for p in core if re.search(r"\.forward\s*=|def __getattr__", p.read_text())
    ]
    assert not patches


# ------------------------------------------------------------------------------ cached, on diffusers models
def test_first_block_cache_on_flux_changes_only_the_cached_rollout(tmp_path):
    """FirstBlockCache (its blocks return both streams) with a threshold that always reuses the cache after
    the first step: the rollout changes, the hooks leave with it, the exact sampler is untouched."""
    from adapter_checks import adapter_from_config
    from tiny_pipelines import RESOLUTION, build_tiny_flux
    from vgrpo_adapters.flux import FluxAdapterConfig
    from vgrpo_adapters.flux.impl import FluxAdapter

    from vgrpo_platform.rollout_backends.cached import CachedBackend

    model = build_tiny_flux(tmp_path / "flux")
    adapter = adapter_from_config(FluxAdapter, FluxAdapterConfig(model=str(model), resolution=RESOLUTION))
    cond = adapter.encode_prompts(["a red cat", "a blue dog"])
    noise = torch.randn((2, *adapter.latent_shape()), generator=torch.Generator().manual_seed(0))
    sampler = SamplerSpec("euler", 6)
    exact = adapter.sample(noise, cond, sampler)
    backend = CachedBackend("first_block", {"threshold": 1e6})
    backend.start(adapter, {})
    cached = backend.sample_chunk(noise, cond, sampler)
    assert cached.shape == exact.shape and not torch.equal(cached, exact)
    assert torch.equal(adapter.sample(noise, cond, sampler), exact)


def test_a_second_cfg_call_runs_in_its_own_branch(tmp_path):
    """Qwen-Image guides with two calls per step: the core names the second "uncond", so a cache keeps one
    state per branch (as the pipelines' cache contexts do)."""
    from contextlib import contextmanager

    from adapter_checks import adapter_from_config
    from tiny_pipelines import RESOLUTION, build_tiny_qwen_image
    from vgrpo_adapters.qwen_image import QwenImageAdapterConfig
    from vgrpo_adapters.qwen_image.impl import QwenImageAdapter

    model = build_tiny_qwen_image(tmp_path / "qwen")
    options = QwenImageAdapterConfig(model=str(model), resolution=RESOLUTION, cfg_scale=4.0)
    adapter = adapter_from_config(QwenImageAdapter, options)
    cond = adapter.encode_prompts(["a red cat"])
    noise = torch.randn((1, *adapter.latent_shape()), generator=torch.Generator().manual_seed(0))
    seen: list[str] = []

    @contextmanager
    def record(module, branch):
        seen.append(branch)
        yield

    with adapter.network.hooked(record):
        adapter.sample(noise, cond, SamplerSpec("euler", 3))
    assert seen == ["cond", "uncond"] * 3 and adapter.network.branch_name == "cond"
