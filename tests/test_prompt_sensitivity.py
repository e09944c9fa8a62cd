"""benchmarks/prompt_sensitivity.py: which prompt words a moving-shapes model's velocity depends on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_moving_shapes import build_tiny_moving_shapes

from benchmarks import prompt_sensitivity as ps


def test_swaps_replace_each_word_once_and_the_motion_cut_keeps_the_object() -> None:
    prompt = "a red circle moving left"
    assert ps.swap_words(prompt, ps.SWAPS["direction"]) == "a red circle moving right"
    assert ps.swap_words("a green square rises", ps.SWAPS["direction"]) == "a green square falls"
    assert ps.swap_words(prompt, ps.SWAPS["colour"]) == "a blue circle moving left"  # not swapped back
    assert ps.without_motion(prompt) == "a red circle"
    variants = ps.prompt_variants([prompt])
    assert set(variants) == {"own", "colour", "shape", "direction", "no_motion"}
    assert variants["shape"] == ["a red triangle moving left"]


def _noise(x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return (1 - t)[:, None] * x0 + t[:, None] * eps


def test_a_model_that_ignores_a_word_shows_no_change_and_one_that_uses_it_does() -> None:
    x0 = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    variants = {"own": ["a red"] * 6, "colour": ["a blue"] * 6}

    def deaf(z_t: torch.Tensor, t: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return z_t

    def listening(z_t: torch.Tensor, t: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return z_t + torch.tensor([[1.0 if "blue" in p else 0.0] for p in prompts])

    times = (0.2, 0.7)
    same = ps.losses_by_variant(deaf, _noise, x0, variants, times, seed=3)
    assert same["own"] == same["colour"]
    assert ps.relative_change(same) == {"colour": 0.0}
    changed = ps.losses_by_variant(listening, _noise, x0, variants, times, seed=3)
    assert changed["own"] == same["own"] and all(
        c > o for c, o in zip(changed["colour"], changed["own"], strict=True)
    )
    # the first time's own loss, computed directly from the same noise draw
    eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(3))
    t = torch.full((6,), 0.2)
    direct = torch.mean((_noise(x0, eps, t) - (eps - x0)) ** 2).item()
    assert same["own"][0] == pytest.approx(direct, rel=1e-6)


def test_the_command_writes_a_record_of_a_model_folder(tmp_path: Path) -> None:
    build_tiny_moving_shapes(tmp_path / "model")
    out = tmp_path / "record.json"
    ps.main(["--model", str(tmp_path / "model"), "--clips", "4", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["clips"] == 4 and record["model"] == "model"
    assert set(record["loss"]) == {"own", "colour", "shape", "direction", "no_motion"}
    assert all(len(v) == len(ps.TIMES) for v in record["loss"].values())
    own = record["loss"]["own"]
    colour = sum(c / o - 1 for c, o in zip(record["loss"]["colour"], own, strict=True)) / len(own)
    assert record["relative_change"]["colour"] == pytest.approx(colour, abs=1e-4)
