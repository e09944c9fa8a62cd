"""GRPO advantages, reward aggregation, soft-clip and the PPO-clip objective vs brute force."""

from __future__ import annotations

import math

import pytest
import torch

from vgrpo_platform.algo.grpo import compute_advantages, group_normalize, soft_clip, zero_std_fraction
from vgrpo_platform.algo.surrogates.elbo import clipped_mask, ppo_clip_objective, ppo_clip_terms


def brute_normalize(values: list[float], groups: list[int], std: str, eps: float) -> list[float]:
    """Per-sample python loop: (v - group mean) / (population std + eps)."""
    out = []
    glob_mean = sum(values) / len(values)
    glob_std = math.sqrt(sum((v - glob_mean) ** 2 for v in values) / len(values))
    for v, g in zip(values, groups, strict=True):
        members = [w for w, h in zip(values, groups, strict=True) if h == g]
        mean = sum(members) / len(members)
        if all(w == members[0] for w in members):
            out.append(0.0)
            continue
        if std == "group":
            scale = math.sqrt(sum((w - mean) ** 2 for w in members) / len(members)) + eps
        elif std == "global":
            scale = glob_std + eps
        else:
            scale = 1.0
        out.append((v - mean) / scale)
    return out


GROUPS = [3, 3, 3, 0, 0, 0, 7, 7, 7, 7]


@pytest.mark.parametrize("std", ["group", "global", "none"])
def test_group_normalize_matches_brute_force(std: str) -> None:
    g = torch.Generator().manual_seed(0)
    r = torch.randn(len(GROUPS), generator=g, dtype=torch.float64)
    got = group_normalize(r, torch.tensor(GROUPS), std=std, eps=1e-4)
    torch.testing.assert_close(
        got, torch.tensor(brute_normalize(r.tolist(), GROUPS, std, 1e-4), dtype=torch.float64)
    )


def test_advantages_have_zero_mean_unit_std_per_group() -> None:
    g = torch.Generator().manual_seed(1)
    r = torch.randn(len(GROUPS), generator=g, dtype=torch.float64) * 5 + 2
    ids = torch.tensor(GROUPS)
    adv, agg = compute_advantages({"r": r}, {"r": 1.0}, ids, eps=0.0)
    torch.testing.assert_close(agg, r)
    for gid in set(GROUPS):
        a = adv[ids == gid]
        assert abs(float(a.mean())) < 1e-12
        assert abs(float(a.std(correction=0)) - 1.0) < 1e-12


def test_permuting_within_a_group_permutes_advantages() -> None:
    g = torch.Generator().manual_seed(2)
    r = torch.randn(len(GROUPS), generator=g)
    ids = torch.tensor(GROUPS)
    perm = torch.tensor([2, 0, 1, 3, 4, 5, 9, 8, 6, 7])  # stays inside each group
    assert torch.equal(ids[perm], ids)
    adv, _ = compute_advantages({"r": r}, {"r": 1.0}, ids)
    adv_perm, _ = compute_advantages({"r": r[perm]}, {"r": 1.0}, ids)
    torch.testing.assert_close(adv_perm, adv[perm])


def test_constant_group_gives_exact_zeros_and_zero_std_fraction() -> None:
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 2.0, 4.0, 0.7, 0.7])
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    for std in ("group", "global", "none"):
        adv, _ = compute_advantages({"r": r}, {"r": 1.0}, ids, std=std)
        assert torch.equal(adv[:3], torch.zeros(3)) and torch.equal(adv[6:], torch.zeros(2))
        assert torch.all(adv[3:6] != 0)
    assert zero_std_fraction(r, ids) == pytest.approx(2 / 3)
    assert zero_std_fraction(torch.arange(8.0), ids) == 0.0


def test_multi_reward_aggregation_matches_manual() -> None:
    g = torch.Generator().manual_seed(3)
    ids = torch.tensor(GROUPS)
    terms = {
        "a": torch.randn(10, generator=g, dtype=torch.float64),
        "b": 100 * torch.rand(10, generator=g, dtype=torch.float64),
    }
    weights = {"a": 0.7, "b": 0.3}
    weighted = [0.7 * a + 0.3 * b for a, b in zip(terms["a"].tolist(), terms["b"].tolist(), strict=True)]

    adv, agg = compute_advantages(terms, weights, ids, aggregation="weighted_sum")
    torch.testing.assert_close(agg, torch.tensor(weighted, dtype=torch.float64))
    torch.testing.assert_close(
        adv, torch.tensor(brute_normalize(weighted, GROUPS, "group", 1e-4), dtype=torch.float64)
    )

    adv, agg = compute_advantages(terms, weights, ids, aggregation="normalize_then_sum")
    za = brute_normalize(terms["a"].tolist(), GROUPS, "group", 1e-4)
    zb = brute_normalize(terms["b"].tolist(), GROUPS, "group", 1e-4)
    manual = [0.7 * x + 0.3 * y for x, y in zip(za, zb, strict=True)]
    torch.testing.assert_close(adv, torch.tensor(manual, dtype=torch.float64))
    torch.testing.assert_close(agg, torch.tensor(weighted, dtype=torch.float64))


def test_missing_weight_and_unknown_modes_raise() -> None:
    ids = torch.tensor([0, 0])
    with pytest.raises(KeyError):
        compute_advantages({"a": torch.ones(2)}, {}, ids)
    with pytest.raises(ValueError):
        compute_advantages({"a": torch.ones(2)}, {"a": 1.0}, ids, aggregation="product")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        compute_advantages({"a": torch.ones(2)}, {"a": 1.0}, ids, std="mad")  # type: ignore[arg-type]


def test_soft_clip_identity_near_zero_and_bounded() -> None:
    eta = 3.0
    a = torch.tensor([0.0, 1e-3, -1e-3], dtype=torch.float64, requires_grad=True)
    out = soft_clip(a, eta)
    torch.testing.assert_close(out, a.detach(), atol=1e-9, rtol=1e-6)
    out.sum().backward()
    torch.testing.assert_close(a.grad[0], torch.tensor(1.0, dtype=torch.float64))
    big = torch.linspace(-1e3, 1e3, 2001, dtype=torch.float64)
    clipped = soft_clip(big, eta)
    assert float(clipped.abs().max()) <= eta
    assert torch.all(clipped[1:] >= clipped[:-1])  # monotone: order of advantages is kept
    assert torch.equal(soft_clip(big, None), big)


def test_soft_clip_applied_after_normalisation() -> None:
    r = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0])  # one outlier: z ~ 2.65
    ids = torch.zeros(8, dtype=torch.long)
    adv, _ = compute_advantages({"r": r}, {"r": 1.0}, ids)
    adv_soft, _ = compute_advantages({"r": r}, {"r": 1.0}, ids, soft_clip_eta=1.0)
    torch.testing.assert_close(adv_soft, torch.tanh(adv))


def brute_ppo(rho: list[float], adv: list[float], e: float | None) -> float:
    total = 0.0
    for r, a in zip(rho, adv, strict=True):
        if e is None:
            total += r * a
        else:
            total += min(r * a, max(min(r, 1 + e), 1 - e) * a)
    return total / len(rho)


@pytest.mark.parametrize("clip", [None, 0.01, 0.2])
def test_ppo_clip_objective_matches_python_loop(clip: float | None) -> None:
    g = torch.Generator().manual_seed(4)
    rho = torch.exp(0.1 * torch.randn(50, generator=g, dtype=torch.float64))
    adv = torch.randn(50, generator=g, dtype=torch.float64)
    got = ppo_clip_objective(rho, adv, clip)
    assert float(got) == pytest.approx(brute_ppo(rho.tolist(), adv.tolist(), clip), rel=1e-12, abs=1e-14)


def test_clipped_samples_have_zero_gradient() -> None:
    e = 0.05
    rho = torch.tensor([1.2, 0.8, 1.2, 0.8, 1.01, 0.99], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 2.0, -2.0], dtype=torch.float64)
    ppo_clip_terms(rho, adv, e).sum().backward()
    expected_clipped = torch.tensor([True, True, False, False, False, False])
    assert torch.equal(clipped_mask(rho.detach(), adv, e), expected_clipped)
    assert torch.equal(rho.grad[expected_clipped], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(rho.grad[~expected_clipped], adv[~expected_clipped])  # d(rho A)/d rho = A
