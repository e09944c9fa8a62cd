"""The plugin's own tests: the vgrpo conformance kit, and the metric against a NumPy computation."""

from __future__ import annotations

import numpy as np
import torch
from vgrpo_example_reward import Config, build

from vgrpo_platform.protocols import Samples
from vgrpo_platform.testing import check_reward


def test_conforms_to_the_reward_contract():
    check_reward(build, Config(), entry_module="vgrpo_example_reward")


def hasler_suesstrunk(image: np.ndarray) -> float:
    """The paper's formula on one ``[H, W, 3]`` image, written independently of the plugin."""
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    rg, yb = r - g, 0.5 * (r + g) - b
    return float(np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean()))


def test_matches_the_formula_and_is_zero_for_grey():
    rng = np.random.default_rng(0)
    images = rng.random((3, 8, 8, 3)).astype(np.float32)
    images[0] = 0.5  # grey: no colour at all
    samples = Samples("image", torch.from_numpy(images).permute(0, 3, 1, 2))
    out = build(Config(), None).score(samples, ["a", "b", "c"], [{}, {}, {}])
    expected = [hasler_suesstrunk(img) for img in images]
    np.testing.assert_allclose(out["score"].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert out["score"][0] == 0
