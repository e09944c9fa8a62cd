"""Where a quickstart iteration's time goes on the CPU: model forward, backward, optimiser, sampler,
reward and everything else, as self-times (a forward inside the sampler counts as a forward).

Wall-clock regions around the loop's own calls (the adapter's ``predict``, ``sample``, ``decode`` and
``encode_prompts``, the scorer, the surrogate's ``prepare`` and ``loss``, ``accelerator.backward``, the
optimiser step and gradient clip, the weights' moving average); each region's children are taken out
of its time, and "everything else" is the iteration minus every region. The first iteration is left
out (one-off allocations). Why not torch.profiler: its per-op records cost more than the small ops
they time at this scale, and what we want is the split by the loop's stages, not by kernel.

    python -m benchmarks.profile_cpu                   # 4 iterations of recipes/quickstart.toml
    python -m benchmarks.profile_cpu --iterations 6 --out benchmarks/results/profile_cpu.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.training.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "quickstart.toml"
ORDER = [
    "model forward",
    "backward",
    "optimizer",
    "sampler",
    "decode",
    "text encoder",
    "reward",
    "surrogate math",
    "EMA",
    "everything else",
]


class Regions:
    """Nested wall-clock regions; a region's self-time excludes the regions inside it."""

    def __init__(self) -> None:
        self.self_time: dict[str, float] = defaultdict(float)
        self._stack: list[list[Any]] = []  # [name, start, seconds of children]
        self.active = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return fn(*args, **kwargs)
            self._stack.append([name, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                region, start, children = self._stack.pop()
                elapsed = time.perf_counter() - start
                self.self_time[region] += elapsed - children
                if self._stack:
                    self._stack[-1][2] += elapsed

        return timed


def instrument(trainer: Trainer, regions: Regions) -> None:
    adapter, surrogate = trainer.session.adapter, trainer.session.surrogate
    for attr, name in (
        ("predict", "model forward"),
        ("sample", "sampler"),
        ("decode", "decode"),
        ("encode_prompts", "text encoder"),
    ):
        setattr(adapter, attr, regions.wrap(name, getattr(adapter, attr)))
    for attr in ("prepare", "loss"):
        setattr(surrogate, attr, regions.wrap("surrogate math", getattr(surrogate, attr)))
    for attr in ("score", "collect"):
        setattr(trainer.scorer, attr, regions.wrap("reward", getattr(trainer.scorer, attr)))
    trainer.accelerator.backward = regions.wrap("backward", trainer.accelerator.backward)
    trainer.accelerator.clip_grad_norm_ = regions.wrap("optimizer", trainer.accelerator.clip_grad_norm_)
    trainer.optimizer.step = regions.wrap("optimizer", trainer.optimizer.step)
    trainer.optimizer.zero_grad = regions.wrap("optimizer", trainer.optimizer.zero_grad)
    if trainer.average is not None:
        trainer.average.update = regions.wrap("EMA", trainer.average.update)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="recipe override")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    # the timing wrapper around optimizer.step looks like an override to the LR scheduler's check
    warnings.filterwarnings("ignore", message="Seems like `optimizer.step\\(\\)` has been overridden")
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"run.output_dir={tmp!r}",
            f"train.iterations={args.iterations}",
            "eval.every=0",
            "eval.max_prompts=8",
            "eval.samples_per_prompt=2",
            "log.checkpoint_every=0",
            "log.diagnostics_every=0",
            "log.save_grids=false",
            "log.progress='none'",
            *args.overrides,
        ]
        trainer = Trainer(resolve_recipe(RECIPE, overrides))
        regions = Regions()
        instrument(trainer, regions)
        original, totals = trainer.iterate, []

        def iterate(iteration: int) -> dict:
            regions.active = iteration > 1
            t0 = time.perf_counter()
            try:
                return original(iteration)
            finally:
                if regions.active:
                    totals.append(time.perf_counter() - t0)
                regions.active = False

        trainer.iterate = iterate
        trainer.run()
    n, total = len(totals), sum(totals)
    split = {name: regions.self_time.get(name, 0.0) / n for name in ORDER[:-1]}
    split["everything else"] = total / n - sum(split.values())
    print(f"quickstart, iterations 2..{args.iterations}: {total / n:.2f} s an iteration on average")
    print(f"{'region':18s} {'s/iter':>8s} {'share':>7s}")
    for name in ORDER:
        print(f"{name:18s} {split[name]:8.3f} {100 * split[name] / (total / n):6.1f}%")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"iteration_s": total / n, "split_s": split, "overrides": args.overrides}
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
