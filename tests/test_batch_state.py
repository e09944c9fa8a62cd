"""Typed per-surrogate state (``BatchState``): it slices by rows for micro-batches and joins rollout chunks,
each built-in ``loss`` refuses a missing or foreign state in one line, and the deprecated ``batch.extras``
still works for third-party surrogates, with a warning."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter

from vgrpo_platform.algo.surrogates.awm import AWMState, AWMSurrogate
from vgrpo_platform.algo.surrogates.flow_grpo import FlowGRPOState, FlowGRPOSurrogate
from vgrpo_platform.algo.surrogates.nft import DiffusionNFTSurrogate, NFTState
from vgrpo_platform.algo.surrogates.vgrpo import VGRPOState, VGRPOSurrogate
from vgrpo_platform.protocols import BatchState, RolloutBatch, SamplerSpec
from vgrpo_platform.training.iteration.rollout import join_states


@dataclass
class Pairs(BatchState):
    t: torch.Tensor  # [B, K]
    eps: torch.Tensor  # [B, K, 2]
    anchor: torch.Tensor | None = None


def pairs(b: int, start: float = 0.0) -> Pairs:
    t = torch.arange(b * 3, dtype=DT).reshape(b, 3) + start
    return Pairs(t=t, eps=t[..., None].expand(b, 3, 2).clone())


def make_batch(b: int = 4, seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    return RolloutBatch(
        prompts=["p"] * b,
        group_ids=torch.arange(b) // 2,
        cond={"emb": torch.randn(b, 2, generator=g, dtype=DT)},
        latents=torch.randn(b, 2, 3, generator=g, dtype=DT),
        rewards=torch.zeros(b, dtype=DT),
        advantages=torch.randn(b, generator=g, dtype=DT),
    )


def test_state_selects_rows_of_every_tensor_field_and_keeps_none() -> None:
    state = pairs(4)
    index = torch.tensor([2, 0])
    part = state.select(index)
    assert type(part) is Pairs and part.anchor is None
    assert torch.equal(part.t, state.t[index]) and torch.equal(part.eps, state.eps[index])


def test_state_concatenates_chunks_along_the_batch() -> None:
    a, b = pairs(2), pairs(3, start=100.0)
    a.anchor, b.anchor = torch.zeros(2, 1), torch.ones(3, 1)
    whole = Pairs.concat([a, b])
    assert torch.equal(whole.t, torch.cat([a.t, b.t])) and torch.equal(whole.eps, torch.cat([a.eps, b.eps]))
    assert torch.equal(whole.anchor, torch.tensor([[0.0], [0.0], [1.0], [1.0], [1.0]]))
    assert torch.equal(Pairs.concat([pairs(5)]).select(torch.tensor([4])).t, pairs(5).t[4:])


def test_a_field_that_is_no_tensor_is_refused_in_one_line() -> None:
    @dataclass
    class WithCount(BatchState):
        t: torch.Tensor
        count: int = 3

    with pytest.raises(TypeError, match="WithCount.count is a int") as err:
        WithCount(t=torch.zeros(2)).select(torch.tensor([0]))
    assert "\n" not in str(err.value)


def test_a_micro_batch_carries_its_rows_of_the_state() -> None:
    batch = make_batch()
    batch.state = pairs(4)
    part = batch.select(torch.tensor([1, 3]))
    assert isinstance(part.state, Pairs) and torch.equal(part.state.t, pairs(4).t[[1, 3]])
    assert make_batch().select(torch.tensor([0])).state is None


def test_rollout_states_join_chunk_by_chunk_and_flow_grpo_chunks_equal_one_rollout() -> None:
    adapter, sur = TinyAdapter(), FlowGRPOSurrogate()
    g = torch.Generator().manual_seed(0)
    noise, cond = (
        torch.randn(4, 2, 3, generator=g, dtype=DT),
        {"emb": torch.randn(4, 2, generator=g, dtype=DT)},
    )
    sampler = SamplerSpec("euler", 3)
    _, whole = sur.rollout(adapter, noise, cond, sampler, torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(1)
    chunks = [
        sur.rollout(adapter, noise[part], {"emb": cond["emb"][part]}, sampler, gen)[1]
        for part in (slice(0, 2), slice(2, 4))
    ]
    joined = join_states(chunks)
    assert isinstance(joined, FlowGRPOState) and joined.train_mask is None
    assert torch.equal(joined.timesteps, whole.timesteps) and torch.equal(joined.sde_mask, whole.sde_mask)
    assert joined.trajectory.shape == whole.trajectory.shape and joined.old_log_prob.shape == (4, 3)
    assert join_states([]) is None


def prepared(sur: Any, batch: RolloutBatch, adapter: TinyAdapter) -> RolloutBatch:
    if isinstance(sur, FlowGRPOSurrogate):
        g = torch.Generator().manual_seed(0)
        batch.latents, batch.state = sur.rollout(
            adapter, torch.randn(4, 2, 3, dtype=DT), batch.cond, SamplerSpec("euler", 3), g
        )
    sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    return batch


SURROGATES = {
    "vgrpo": (VGRPOSurrogate, VGRPOState),
    "awm": (AWMSurrogate, AWMState),
    "diffusion_nft": (DiffusionNFTSurrogate, NFTState),
    "flow_grpo": (FlowGRPOSurrogate, FlowGRPOState),
}


@pytest.mark.parametrize("name", sorted(SURROGATES))
def test_loss_before_prepare_is_a_one_line_error(name: str) -> None:
    cls, kind = SURROGATES[name]
    with pytest.raises(ValueError, match=f"needs the {kind.__name__} written by") as err:
        cls().loss(make_batch(), TinyAdapter())
    assert "\n" not in str(err.value) and "loss" in str(err.value)


@pytest.mark.parametrize("name", sorted(SURROGATES))
def test_loss_refuses_another_surrogates_state(name: str) -> None:
    cls, kind = SURROGATES[name]
    adapter = TinyAdapter()
    batch = make_batch()
    batch.state = pairs(4)  # a state of another surrogate
    with pytest.raises(TypeError, match=f"needs batch.state to be a {kind.__name__}, got Pairs") as err:
        cls().loss(batch, adapter)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(SURROGATES))
def test_prepare_writes_the_surrogates_own_state(name: str) -> None:
    cls, kind = SURROGATES[name]
    adapter, sur = TinyAdapter(), cls()
    batch = prepared(sur, make_batch(), adapter)
    assert type(batch.state) is kind
    loss, _ = sur.loss(batch.select(torch.tensor([0, 2])), adapter)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_flow_grpo_prepare_without_its_rollout_says_so() -> None:
    with pytest.raises(ValueError, match="needs its own SDE rollout"):
        FlowGRPOSurrogate().prepare(make_batch(), TinyAdapter(), torch.Generator().manual_seed(0))


class LegacySurrogate(VGRPOSurrogate):
    """A third-party surrogate written before ``BatchState``: it passes its tensors through ``extras``."""

    def prepare(self, batch, adapter, generator):
        super().prepare(batch, adapter, generator)
        assert isinstance(batch.state, VGRPOState)
        batch.extras["t"], batch.extras["eps"] = batch.state.t, batch.state.eps
        batch.state = None

    def loss(self, batch, adapter):
        batch.state = VGRPOState(t=batch.extras["t"], eps=batch.extras["eps"])
        return super().loss(batch, adapter)


def test_extras_still_work_for_a_third_party_surrogate_and_warn() -> None:
    adapter, sur = TinyAdapter(), LegacySurrogate()
    sur.plan_updates(1)  # no old forward: the loss's own forward is the old policy's
    batch = make_batch()
    with pytest.warns(DeprecationWarning, match="batch.extras is deprecated"):
        sur.prepare(batch, adapter, torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the core's slicing does not warn
        part = batch.select(torch.tensor([1, 2]))
    with pytest.warns(DeprecationWarning):
        loss, metrics = sur.loss(part, adapter)
    modern = VGRPOSurrogate()
    modern.plan_updates(1)
    fresh = make_batch()
    modern.prepare(fresh, adapter, torch.Generator().manual_seed(0))
    want, _ = modern.loss(fresh.select(torch.tensor([1, 2])), adapter)
    assert torch.equal(loss, want) and metrics["ratio_mean"] == 1.0


def test_a_rollout_returning_a_dict_is_still_joined_with_a_warning() -> None:
    parts = [{"x": torch.zeros(2, 1)}, {"x": torch.ones(1, 1)}]
    with pytest.warns(DeprecationWarning, match="return a BatchState"):
        joined = join_states(parts)
    assert isinstance(joined, dict) and torch.equal(joined["x"], torch.tensor([[0.0], [0.0], [1.0]]))
    with pytest.raises(TypeError, match="one BatchState type"):
        join_states([pairs(1), {"x": torch.zeros(1)}])
