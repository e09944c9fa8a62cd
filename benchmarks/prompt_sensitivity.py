"""Which words of its prompts does a pretrained moving-shapes model listen to?

Why: the shipped video model gets colour, shape and count right but the direction of motion only at
chance, so RL starts from a coin toss. This asks the model directly: the flow-matching loss of rendered
clips under their own prompt, beside the same clips, noise and times under the prompt with one attribute
swapped (colour, shape, direction) or with its motion phrase cut. A word the model uses raises the loss
when swapped; a word it ignores leaves it all but unchanged.

    python -m benchmarks.prompt_sensitivity                       # the shipped model, its 48 one-object clips
    python -m benchmarks.prompt_sensitivity --model DIR --out F   # a folder pretrain-moving-shapes wrote

The record (``--out``, default ``benchmarks/results/video/prompt_sensitivity.json``) holds the loss per
time and variant, and the mean relative change per variant.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "benchmarks" / "results" / "video" / "prompt_sensitivity.json"
TIMES = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
SWAPS: dict[str, dict[str, str]] = {  # word -> its replacement, per attribute
    "colour": {"red": "blue", "blue": "red", "green": "yellow", "yellow": "green"},
    "shape": {"square": "circle", "circle": "triangle", "triangle": "square"},
    "direction": {"left": "right", "right": "left", "rises": "falls", "falls": "rises"},
}


def swap_words(prompt: str, swaps: Mapping[str, str]) -> str:
    """``prompt`` with every word in ``swaps`` replaced (all at once, so a swap is not undone)."""
    return " ".join(swaps.get(word, word) for word in prompt.split())


def without_motion(prompt: str) -> str:
    """A one-object prompt's "a <colour> <shape>": the words before its motion phrase."""
    return " ".join(prompt.split()[:3])


def prompt_variants(prompts: Sequence[str]) -> dict[str, list[str]]:
    """The prompts themselves, each attribute swapped, and the motion phrase cut."""
    variants = {"own": list(prompts)}
    variants.update({name: [swap_words(p, swaps) for p in prompts] for name, swaps in SWAPS.items()})
    variants["no_motion"] = [without_motion(p) for p in prompts]
    return variants


def losses_by_variant(
    predict: Callable[[torch.Tensor, torch.Tensor, list[str]], torch.Tensor],
    noise: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    variants: Mapping[str, list[str]],
    times: Sequence[float] = TIMES,
    seed: int = 0,
) -> dict[str, list[float]]:
    """The flow-matching loss ``|v(z_t, t, prompt) - (eps - x0)|^2`` per variant at each time, every
    variant on the same ``eps`` and ``t`` (so the variants differ only by their prompts)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[float]] = {name: [] for name in variants}
    for t_value in times:
        t = torch.full((x0.shape[0],), float(t_value))
        eps = torch.randn(x0.shape, generator=gen)
        z_t = noise(x0, eps, t)
        with torch.no_grad():
            for name, prompts in variants.items():
                out[name].append(torch.mean((predict(z_t, t, prompts) - (eps - x0)) ** 2).item())
    return out


def relative_change(losses: Mapping[str, list[float]]) -> dict[str, float]:
    """Mean over times of each variant's loss relative to the own prompt's, minus one."""
    own = losses["own"]
    return {
        name: float(np.mean([v / o - 1.0 for v, o in zip(values, own, strict=True)]))
        for name, values in losses.items()
        if name != "own"
    }


def measure(model: Path | None, clips: int = 96, seed: int = 0) -> dict:
    """The record for the model in ``model`` (default: the shipped one) on ``clips`` one-object clips."""
    from vgrpo_adapters.moving_shapes import WEIGHTS_DIR
    from vgrpo_adapters.moving_shapes.impl import MovingShapesAdapter
    from vgrpo_adapters.moving_shapes.pretrain import render_clips
    from vgrpo_rewards.moving_shapes.world import train_prompts

    adapter = MovingShapesAdapter.load(model or WEIGHTS_DIR, shift=3.0)
    adapter.denoiser.eval()
    prompts = [p for p in train_prompts() if "while" not in p][:clips]
    x0 = render_clips(prompts, np.random.default_rng(seed), adapter.side, adapter.num_frames)

    def predict(z_t: torch.Tensor, t: torch.Tensor, ps: list[str]) -> torch.Tensor:
        return adapter.predict(z_t, t, adapter.encode_prompts(ps))

    losses = losses_by_variant(predict, adapter.schedule.noise, x0, prompt_variants(prompts), seed=seed)
    return {
        "model": "shipped" if model is None else Path(model).name,
        "clips": len(prompts),
        "times": list(TIMES),
        "loss": {k: [round(v, 6) for v in values] for k, values in losses.items()},
        "relative_change": {k: round(v, 5) for k, v in relative_change(losses).items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a model folder; default: the shipped one")
    parser.add_argument("--clips", type=int, default=96)
    parser.add_argument("--out", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    record = measure(args.model, args.clips)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    for name, change in record["relative_change"].items():
        print(f"{name:10s} loss {change:+.2%} against the own prompt")


if __name__ == "__main__":
    main()
