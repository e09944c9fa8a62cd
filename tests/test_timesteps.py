"""Timestep / noise sampling and the rectified-flow schedule, against closed forms and diffusers."""

from __future__ import annotations

import math

import pytest
import torch

from vgrpo_platform.algo.timesteps import draw_pairs, iid_uniform, stratified_uniform
from vgrpo_platform.noise_schedules import RectifiedFlowSchedule


def ks_uniform(values: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance between the empirical CDF of ``values`` and U(0, 1)."""
    x = values.flatten().double().sort().values
    n = x.numel()
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n - x
    lower = x - torch.arange(0, n, dtype=torch.float64) / n
    return float(torch.maximum(upper, lower).max())


def ks_critical(n: int) -> float:
    return 1.95 / math.sqrt(n)  # alpha ~ 0.001


def test_stratified_one_draw_per_stratum() -> None:
    g = torch.Generator().manual_seed(0)
    k = 7
    u = stratified_uniform(500, k, g)
    assert u.shape == (500, k)
    strata = torch.floor(u * k).long()
    assert torch.equal(strata, torch.arange(k).expand(500, k))


def test_stratified_is_uniform_overall_and_within_strata() -> None:
    g = torch.Generator().manual_seed(1)
    k, n = 4, 5000
    u = stratified_uniform(n, k, g)
    # a randomly chosen column of each row is exactly U(0, 1)
    pick = torch.randint(0, k, (n,), generator=g)
    assert ks_uniform(u[torch.arange(n), pick]) < ks_critical(n)
    # the position inside each stratum is U(0, 1) too
    for j in range(k):
        assert ks_uniform(u[:, j] * k - j) < ks_critical(n)


def test_iid_uniform_is_uniform_and_unstratified() -> None:
    g = torch.Generator().manual_seed(2)
    u = iid_uniform(4000, 3, g)
    assert u.shape == (4000, 3)
    assert ks_uniform(u) < ks_critical(u.numel())
    for j in range(3):  # every column covers all of [0, 1], not one stratum
        assert u[:, j].min() < 0.05 and u[:, j].max() > 0.95


def _assert_shared(t: torch.Tensor, eps: torch.Tensor, i: int, j: int) -> None:
    assert torch.equal(t[i], t[j]) and torch.equal(eps[i], eps[j])


def _assert_distinct(t: torch.Tensor, eps: torch.Tensor, i: int, j: int) -> None:
    assert not torch.equal(t[i], t[j]) and not torch.equal(eps[i], eps[j])


GROUPS = torch.tensor([5, 2, 5, 9, 2, 5])  # non-contiguous, unsorted ids


def test_group_scope_shares_within_and_differs_across_groups() -> None:
    t, eps = draw_pairs(GROUPS, 3, (2, 4), generator=torch.Generator().manual_seed(0), scope="group")
    assert t.shape == (6, 3) and eps.shape == (6, 3, 2, 4)
    for i in range(6):
        for j in range(6):
            if GROUPS[i] == GROUPS[j]:
                _assert_shared(t, eps, i, j)
            else:
                _assert_distinct(t, eps, i, j)


def test_batch_scope_shares_across_the_batch() -> None:
    t, eps = draw_pairs(GROUPS, 3, (4,), generator=torch.Generator().manual_seed(0), scope="batch")
    for i in range(1, 6):
        _assert_shared(t, eps, 0, i)
    assert not torch.equal(t[0, 0], t[0, 1])  # different pairs within a set


def test_sample_scope_shares_nothing() -> None:
    t, eps = draw_pairs(GROUPS, 3, (4,), generator=torch.Generator().manual_seed(0), scope="sample")
    for i in range(6):
        for j in range(i + 1, 6):
            _assert_distinct(t, eps, i, j)


def test_pairs_are_stratified_on_the_warped_grid_and_clamped() -> None:
    sched = RectifiedFlowSchedule(shift=3.0)
    g = torch.Generator().manual_seed(3)
    k = 4
    t, _ = draw_pairs(
        torch.arange(200), k, (1,), generator=g, warp=sched.warp, t_min=0.01, t_max=0.99, dtype=torch.float64
    )
    edges = sched.warp(torch.linspace(0, 1, k + 1, dtype=torch.float64))  # strata of u, warped
    for j in range(k):
        lo, hi = max(float(edges[j]), 0.01), min(float(edges[j + 1]), 0.99)
        assert float(t[:, j].min()) >= lo and float(t[:, j].max()) <= hi
    assert float(t.min()) >= 0.01 and float(t.max()) <= 0.99


def test_pairs_reproducible_from_the_seed_and_unstratified_option() -> None:
    ids = torch.tensor([0, 0, 1, 1])
    a = draw_pairs(ids, 4, (3,), generator=torch.Generator().manual_seed(7), stratified=False)
    b = draw_pairs(ids, 4, (3,), generator=torch.Generator().manual_seed(7), stratified=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    g = torch.Generator().manual_seed(8)
    many, _ = draw_pairs(torch.arange(500), 4, (1,), generator=g, stratified=False)
    assert float(many[:, 0].max()) > 0.5  # column 0 is not confined to the first stratum


def test_noise_statistics() -> None:
    _, eps = draw_pairs(torch.arange(64), 4, (8, 8), generator=torch.Generator().manual_seed(4))
    assert abs(float(eps.mean())) < 0.02 and abs(float(eps.std()) - 1) < 0.02


@pytest.mark.parametrize("shift", [1.0, 3.0, 0.5])
def test_warp_closed_form_monotone_and_fixed_end_points(shift: float) -> None:
    sched = RectifiedFlowSchedule(shift=shift)
    u = torch.linspace(0, 1, 1001, dtype=torch.float64)
    w = sched.warp(u)
    expected = torch.tensor([shift * x / (1 + (shift - 1) * x) for x in u.tolist()], dtype=torch.float64)
    torch.testing.assert_close(w, expected)
    assert torch.all(w[1:] > w[:-1])
    assert float(w[0]) == 0.0 and float(w[-1]) == 1.0


def test_warp_matches_diffusers_flow_match_shift() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    n = 1000
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=n, shift=3.0)
    unshifted = torch.linspace(1, n, n).flip(0) / n
    torch.testing.assert_close(RectifiedFlowSchedule(shift=3.0).warp(unshifted), scheduler.sigmas[:n])


def test_noise_and_predict_x0_round_trip() -> None:
    g = torch.Generator().manual_seed(5)
    sched = RectifiedFlowSchedule(shift=2.0)
    x0 = torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64)
    eps = torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64)
    t = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    z = sched.noise(x0, eps, t)
    for i in range(3):  # per-sample closed form
        torch.testing.assert_close(z[i], (1 - t[i]) * x0[i] + t[i] * eps[i])
    torch.testing.assert_close(sched.predict_x0(z, eps - x0, t), x0)  # the true velocity recovers x0


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        RectifiedFlowSchedule(shift=0.0)
    with pytest.raises(ValueError):
        draw_pairs(torch.arange(2), 2, (1,), scope="prompt")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        draw_pairs(torch.arange(2), 0, (1,))
