"""Surrogate diagnostics against brute-force numpy, and ``measure_surrogate`` against a hand-written
re-estimation of the V-GRPO surrogate and its per-sample gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter

from vgrpo_platform.algo.diagnostics import (
    mc_cv,
    measure_surrogate,
    pearson,
    surrogate_diagnostics,
    within_group_cv,
)
from vgrpo_platform.algo.surrogates.configs import NaiveELBOConfig, VGRPOConfig
from vgrpo_platform.algo.surrogates.vgrpo import VGRPOSurrogate
from vgrpo_platform.protocols import RolloutBatch


def brute_mc_cv(values: np.ndarray) -> float:
    cvs = []
    for i in range(values.shape[1]):
        col = values[:, i]
        mean = sum(col) / len(col)
        std = math.sqrt(sum((x - mean) ** 2 for x in col) / (len(col) - 1))
        cvs.append(std / abs(mean))
    return sum(cvs) / len(cvs)


def brute_within_group_cv(values: np.ndarray, groups: list[int]) -> float:
    cvs = []
    for row in values:
        for g in sorted(set(groups)):
            members = [row[i] for i in range(len(groups)) if groups[i] == g]
            if len(members) < 2:
                continue
            cvs.append(np.std(members, ddof=1) / abs(np.mean(members)))
    return float(np.mean(cvs))


def test_pure_diagnostics_match_brute_force_numpy():
    rng = np.random.default_rng(0)
    values = rng.uniform(0.5, 2.0, size=(5, 7))
    groups = [0, 0, 0, 1, 1, 2, 3]  # groups 2 and 3 are singletons: skipped
    t = torch.tensor(values)
    gid = torch.tensor(groups)
    assert mc_cv(t) == pytest.approx(brute_mc_cv(values), rel=1e-12)
    assert within_group_cv(t, gid) == pytest.approx(brute_within_group_cv(values, groups), rel=1e-12)
    assert within_group_cv(t[0], gid) == pytest.approx(brute_within_group_cv(values[:1], groups), rel=1e-12)
    x, y = rng.normal(size=9), rng.normal(size=9)
    assert pearson(torch.tensor(x), torch.tensor(y)) == pytest.approx(np.corrcoef(x, y)[0, 1], rel=1e-12)
    assert math.isnan(pearson(torch.ones(4), torch.arange(4.0)))
    norms = rng.uniform(size=4)
    out = surrogate_diagnostics(t, gid, torch.tensor(norms))
    assert out["diag/grad_corr"] == pytest.approx(np.corrcoef(norms, np.abs(values.mean(0))[:4])[0, 1])
    assert set(out) == {"diag/cv", "diag/within_group_cv", "diag/grad_corr"}
    with pytest.raises(ValueError):
        mc_cv(t[:1])


def manual_surrogate(adapter: TinyAdapter, x0, cond, t, eps, adaptive: bool):
    """``L_hat`` of one sample written out: ``mean_j mean_d (x_hat - x0)^2 / [sg(mean_d |x_hat - x0|)]``."""
    total = 0.0
    for j in range(t.shape[0]):
        z = (1 - t[j]) * x0 + t[j] * eps[j]
        diff = z - t[j] * adapter.predict(z[None], t[j][None], cond)[0] - x0
        den = diff.detach().abs().mean() if adaptive else 1.0
        total = total + (diff**2).mean() / den / t.shape[0]
    return total


@pytest.mark.parametrize("planned", [0, 1])
@pytest.mark.parametrize("config", [VGRPOConfig(n_mc=3), NaiveELBOConfig(n_mc=3)])
def test_measure_surrogate_equals_a_hand_written_re_estimation(config, planned):
    """``planned = 1``: the trainer's one-step plan (no old forward in ``prepare``) is lifted meanwhile."""
    adapter = TinyAdapter()
    g = torch.Generator().manual_seed(0)
    b = 6
    batch = RolloutBatch(
        prompts=["p"] * b,
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
        cond={"emb": torch.randn(b, 2, generator=g, dtype=DT)},
        latents=torch.randn(b, 2, 3, generator=g, dtype=DT),
        rewards=torch.zeros(b, dtype=DT),
        advantages=torch.randn(b, generator=g, dtype=DT),
    )
    surrogate = VGRPOSurrogate(config)
    surrogate.plan_updates(planned)
    got = measure_surrogate(
        surrogate, batch, adapter, torch.Generator().manual_seed(7), repeats=3, grad_samples=4
    )
    assert batch.state is None and batch.extras == {}  # the batch itself is untouched
    assert surrogate.gradient_steps == planned  # the trainer's plan is restored
    # independent: the same three pair draws, the surrogate and its gradients written out
    gen = torch.Generator().manual_seed(7)
    params = list(adapter.denoiser.parameters())
    values, norms = [], []
    for r in range(3):
        copy = RolloutBatch(**{**batch.__dict__, "state": None})
        surrogate.prepare(copy, adapter, gen)  # only used for its (t, eps) draws
        t, eps = copy.state.t, copy.state.eps
        row = []
        for i in range(b):
            cond = {"emb": batch.cond["emb"][i : i + 1]}
            value = manual_surrogate(adapter, batch.latents[i], cond, t[i], eps[i], config.adaptive_weighting)
            row.append(float(value.detach()))
            if r == 0 and i < 4:
                grads = torch.autograd.grad(value, params)
                norms.append(math.sqrt(sum(float(gr.square().sum()) for gr in grads)))
        values.append(row)
    want = surrogate_diagnostics(
        torch.tensor(values, dtype=DT), batch.group_ids, torch.tensor(norms, dtype=DT)
    )
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-8), key
