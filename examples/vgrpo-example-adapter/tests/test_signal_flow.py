"""The plugin's own tests: the vgrpo conformance kit on both components, and the reward in closed form."""

from __future__ import annotations

import math

import torch
from vgrpo_example_adapter import SignalFlowConfig, ToneConfig, build_adapter, build_tone

from vgrpo_platform.protocols import Samples
from vgrpo_platform.testing import check_adapter, check_reward

T = 32


def sinusoids(cycles: list[float], phase: float = 0.3) -> torch.Tensor:
    x = torch.arange(T) / T
    return torch.stack([torch.sin(2 * math.pi * k * x + phase) for k in cycles]).unsqueeze(1)  # [B, 1, T]


def test_adapter_conforms():
    check_adapter(build_adapter, SignalFlowConfig(length=T, hidden=32), entry_module="vgrpo_example_adapter")


def test_reward_conforms():
    samples = Samples("signal", torch.cat([sinusoids([1, 2, 3]), torch.zeros(1, 1, T)]))
    prompts = ["a tone at 2 cycles"] * 4
    kit_args = dict(samples=samples, prompts=prompts, entry_module="vgrpo_example_adapter")
    check_reward(build_tone, ToneConfig(), **kit_args)


def test_tone_is_one_for_the_asked_sinusoid_and_zero_otherwise():
    reward = build_tone(ToneConfig(default_cycles=3), None)
    samples = Samples("signal", torch.cat([sinusoids([2, 5, 3]), torch.full((1, 1, T), 0.7)]))
    prompts = ["a tone at 2 cycles", "a tone at 2 cycles", "a tone", "a tone at 4 cycles"]
    score = reward.score(samples, prompts, [{}] * 4)["score"]
    torch.testing.assert_close(score, torch.tensor([1.0, 0.0, 1.0, 0.0]), atol=1e-5, rtol=0)
