"""What a finished run prints: the held-out figures before and after, and the before/after grid."""

from __future__ import annotations

from pathlib import Path

from vgrpo_platform.training.observe.grids import save_before_after
from vgrpo_platform.training.observe.metrics import Progress, read_metrics


def summarise(run_dir: Path, progress: Progress) -> None:
    """Before / after on the held-out prompts: every reward and detail, and the sample grids."""
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
    if len(evals) < 2:
        return
    first, last = evals[0], evals[-1]
    progress.message(
        f"held-out reward: {first['reward']:.4f} at iteration {first['iteration']} -> "
        f"{last['reward']:.4f} at iteration {last['iteration']}  (run dir: {run_dir})"
    )
    for key in sorted(k for k in last if k.startswith(("reward/", "detail/", "monitor/")) and k in first):
        delta = last[key] - first[key]
        progress.message(f"  {key}: {first[key]:.4f} -> {last[key]:.4f} ({delta:+.4f})")
    samples = run_dir / "samples"
    grid = save_before_after(
        samples / f"eval_{first['iteration']:06d}.png",
        samples / f"eval_{last['iteration']:06d}.png",
        samples / "before_after.png",
        labels=(f"iteration {first['iteration']}", f"iteration {last['iteration']}"),
    )
    if grid is not None:
        progress.message(f"before/after samples (same prompts, same seeds): {grid}")
