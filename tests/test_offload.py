"""``train.offload_rewards``: reward models are moved to the accelerator for their call and back after.

This machine has no GPU, so most tests record the ``.to`` calls instead of moving tensors: a spy
replaces ``nn.Module.to``, logs the device asked for and leaves the tensors where they are. That
proves *which* modules are asked to move, *when* (before and after ``score``, also on error), *where*
they go back to, and that scores are unchanged; it does not prove a real copy to CUDA, which the
CUDA-only test at the end checks on a machine that has one.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from vgrpo_platform.config.schema import TrainSection
from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import BuildContext, Samples
from vgrpo_platform.training.iteration.offload import modules_of, park
from vgrpo_platform.training.iteration.scoring import WeightedReward, score_all

PROMPTS = ["a", "b", "c"]


class FakeReward:
    """Scores with a linear layer; logs its calls into ``log`` beside the spy's moves."""

    modalities = frozenset({"image"})

    def __init__(self, log: list, fail: bool = False) -> None:
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)
        self.note, self.fail = log.append, fail  # a bound method: the search does not enter it

    def score(self, samples, prompts, metadata):
        self.note("score")
        if self.fail:
            raise RuntimeError("boom")
        return self.net(samples.data.mean((2, 3))).squeeze(-1)  # [B]


@pytest.fixture
def spy(monkeypatch):
    """Every ``nn.Module.to(device)`` is logged as ``(module, "to <device>")``; no tensor moves."""
    log: list = []

    def to(self, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        log.append((self, f"to {device}"))
        return self

    monkeypatch.setattr(nn.Module, "to", to)
    return log


def samples() -> Samples:
    return Samples("image", torch.linspace(0, 1, 3 * 3 * 4 * 4).reshape(3, 3, 4, 4))


def events(log: list) -> list[str]:
    return [e if isinstance(e, str) else e[1] for e in log]


def test_offload_moves_the_model_to_the_device_for_the_call_and_back(spy):
    reward = FakeReward(spy)
    plain, _ = score_all([WeightedReward("fake", reward, 1.0)], samples(), PROMPTS)
    assert events(spy) == ["score"]  # offload off: nothing moves
    spy.clear()
    terms, _ = score_all([WeightedReward("fake", reward, 1.0)], samples(), PROMPTS, offload_device="cuda:0")
    assert events(spy) == ["to cuda:0", "score", "to cpu"]
    assert all(e[0] is reward.net for e in spy if not isinstance(e, str))
    torch.testing.assert_close(terms["fake"], plain["fake"], rtol=0, atol=0)


def test_offload_to_the_cpu_is_a_no_op(spy):
    reward = FakeReward(spy)
    score_all([WeightedReward("fake", reward, 1.0)], samples(), PROMPTS, offload_device="cpu")
    score_all([WeightedReward("fake", reward, 1.0)], samples(), PROMPTS, offload_device=torch.device("cpu"))
    assert events(spy) == ["score", "score"]


def test_a_failing_reward_still_goes_back_to_the_cpu(spy):
    reward = FakeReward(spy, fail=True)
    with pytest.raises(RewardError, match="reward 'fake' raised RuntimeError"):
        score_all([WeightedReward("fake", reward, 1.0)], samples(), PROMPTS, offload_device="cuda")
    assert events(spy) == ["to cuda", "score", "to cpu"]


def test_each_reward_is_on_the_device_only_for_its_own_call(spy):
    first, second = FakeReward(spy), FakeReward(spy)
    rewards = [WeightedReward("a", first, 1.0), WeightedReward("b", second, 1.0)]
    score_all(rewards, samples(), PROMPTS, offload_device="cuda")
    owners = [e[0] if not isinstance(e, str) else None for e in spy]
    assert events(spy) == ["to cuda", "score", "to cpu"] * 2
    assert owners == [first.net, None, first.net, second.net, None, second.net]


@dataclass
class Bundle:  # the shape of rewards/_clip_common.ClipBundle: a model beside non-module fields
    model: nn.Module
    tokenizer: object
    dtype: torch.dtype


class Wrapper:  # the shape of the video rewards' FramewiseReward: a reward holding another
    def __init__(self, inner: object) -> None:
        self.inner = inner


def test_modules_of_finds_models_where_rewards_keep_them():
    a, b, c, d, head = (nn.Linear(1, 1) for _ in range(5))
    holder = types.SimpleNamespace(
        clip=Bundle(a, tokenizer=types.SimpleNamespace(vocab={"x": 1}), dtype=torch.float32),
        heads=[b, {"extra": c}],
        head=head,
        same_head_again=head,
        reference=torch.zeros(3),  # tensors are not modules: left alone
        lib=types.ModuleType("lib"),
    )
    holder.lib.hidden = d  # a Python module's contents are never searched
    holder.self_ref = holder  # cycles end
    assert modules_of(holder) == [a, b, c, head]
    assert modules_of(Wrapper(holder)) == [a, b, head]  # inner.clip.model: three steps; c is four
    assert modules_of(Wrapper(Wrapper(Wrapper(holder)))) == []  # beyond the depth
    assert modules_of(a) == [a]  # a reward that is itself a module
    assert modules_of(None) == [] and modules_of("text") == []


def test_modules_go_back_where_they_were_not_to_a_fixed_device(spy):
    """A module a reward borrows from elsewhere (here on "meta", standing in for the generator's VAE
    on the GPU) returns to its own device, so offloading never strands it on the CPU."""
    reward = FakeReward(spy)
    reward.borrowed = nn.Linear(1, 1, device="meta")
    score_all([WeightedReward("fake", reward, 1.0)], samples(), PROMPTS, offload_device="cuda")
    names = {id(reward.net): "net", id(reward.borrowed): "borrowed"}
    assert [e if isinstance(e, str) else f"{names[id(e[0])]} {e[1]}" for e in spy] == [
        "net to cuda",
        "borrowed to cuda",
        "score",
        "net to cpu",
        "borrowed to meta",
    ]


def test_park_moves_the_rewards_modules_to_the_cpu_but_not_the_adapters(spy):
    adapter = types.SimpleNamespace(denoiser=nn.Sequential(nn.Linear(1, 1)), vae=nn.Linear(1, 1))
    reward = Wrapper(FakeReward(spy))
    reward.inner.vae = adapter.vae  # shared with the generator
    reward.inner.block = adapter.denoiser[0]  # a piece of the generator
    assert park(reward, keep=adapter) == 1
    assert [(m, e) for m, e in spy] == [(reward.inner.net, "to cpu")]
    spy.clear()
    assert park(reward) == 3  # without keep, everything the reward reaches


def test_builtin_image_rewards_are_found_and_score_the_same(spy, tmp_path):
    """The real PickScore and aesthetic rewards (tiny random CLIP) and the framewise video wrapper."""
    from tiny_clip import save_aesthetic_head, save_clip
    from vgrpo_rewards.aesthetic import Config as AestheticConfig
    from vgrpo_rewards.aesthetic.impl import AestheticReward
    from vgrpo_rewards.pickscore import Config as PickConfig
    from vgrpo_rewards.pickscore.impl import PickScoreReward
    from vgrpo_rewards.video.impl import FramewiseReward

    clip_dir = str(save_clip(tmp_path / "clip"))
    pick = PickScoreReward(PickConfig(model=clip_dir, processor=clip_dir), BuildContext())
    head = save_aesthetic_head(tmp_path / "head.pth", in_dim=pick.clip.model.config.projection_dim)
    aes = AestheticReward(AestheticConfig(model=clip_dir, head=str(head)), BuildContext())
    assert modules_of(pick) == [pick.clip.model]
    assert modules_of(aes) == [aes.clip.model, aes.head]
    assert modules_of(FramewiseReward(pick, frames=2)) == [pick.clip.model]

    images = Samples("image", torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    rewards = [WeightedReward("pickscore", pick, 1.0), WeightedReward("aesthetic", aes, 1.0)]
    plain, _ = score_all(rewards, images, ["a cat", "a dog"])
    spy.clear()
    moved, _ = score_all(rewards, images, ["a cat", "a dog"], offload_device="cuda")
    assert [(type(m).__name__, e) for m, e in spy] == [
        ("CLIPModel", "to cuda"),
        ("CLIPModel", "to cpu"),
        ("CLIPModel", "to cuda"),
        ("MLPHead", "to cuda"),
        ("MLPHead", "to cpu"),  # the aesthetic reward's own head.to(images.device): the images are on the CPU
        ("CLIPModel", "to cpu"),
        ("MLPHead", "to cpu"),
    ]
    for key in plain:
        torch.testing.assert_close(moved[key], plain[key], rtol=0, atol=0)


def test_the_recipe_key_exists_and_is_off_by_default():
    assert TrainSection().offload_rewards is False
    assert TrainSection(offload_rewards=True).offload_rewards is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real copies)")
def test_parameters_really_live_on_cuda_only_during_the_call():
    seen = []

    class Probe(FakeReward):
        def score(self, samples, prompts, metadata):
            seen.append(self.net.weight.device.type)
            return super().score(Samples("image", samples.data.to(self.net.weight.device)), prompts, metadata)

    reward = Probe([])
    score_all([WeightedReward("probe", reward, 1.0)], samples(), PROMPTS, offload_device="cuda")
    assert seen == ["cuda"]
    assert reward.net.weight.device.type == "cpu"
