"""Experiment trackers (``log.trackers``: TensorBoard, W&B, MLflow) through accelerate's tracking API.

Why accelerate's: the run's ``Accelerator`` already knows the main process, and one ``log`` call
reaches every tracker. What this module adds around it:

- a start-up check that each tracker's package is installed (accelerate silently drops a missing
  one), before any model loads;
- the resolved recipe as the run's config, flattened to ``a.b.c`` scalars (TensorBoard's hparams
  and MLflow's params take nothing else);
- every ``metrics.jsonl`` record at its iteration (evaluations under ``eval/``);
- the evaluation grids as images (and, for audio, clips) where accelerate has no common call, and
  beside each grid single samples captioned ``prompt | reward`` (as Flow-GRPO logs them), since a
  grid's labels are too small to read in a tracker's thumbnail;
- a resumed run continuing the same tracker run: the W&B run id and MLflow run id are kept in
  ``RUN_DIR/trackers.json``; TensorBoard keeps its folder and drops events after the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vgrpo_platform.errors import TrackerError

STATE_FILE = "trackers.json"
TENSORBOARD_DIR = "tensorboard"  # events in RUN_DIR/tensorboard/<log.project>/
RECORD_PREFIX = {"train": "", "eval": "eval/"}  # metrics.jsonl kind -> tracker key prefix
MAX_CLIPS = 4  # audio clips logged per evaluation (one per prompt)
MAX_IMAGES = 16  # captioned single samples logged per evaluation (the first of each of the first prompts)


def installed(name: str) -> bool:
    """Whether accelerate can start tracker ``name`` (its own availability check)."""
    from accelerate.utils import is_mlflow_available, is_tensorboard_available, is_wandb_available

    checks = {
        "tensorboard": is_tensorboard_available,
        "wandb": is_wandb_available,
        "mlflow": is_mlflow_available,
    }
    return checks[name]()


def require(names: Sequence[str]) -> None:
    """Stop with the install command when a tracker's package is missing (call before building models)."""
    for name in names:
        if not installed(name):
            raise TrackerError(
                f"log.trackers: '{name}' is not installed; pip install \"vgrpo[{name}]\", "
                f"or remove it from log.trackers"
            )


def flatten(tree: Any, prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested tables and arrays -> ``{"train.lr": 0.01, "rewards.0.name": "brightness", ...}``.

    Arrays of scalars become one JSON string (``"[0.9, 0.999]"``), ``None`` the string ``"none"``.
    """
    if isinstance(tree, Mapping):
        out: dict[str, bool | int | float | str] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(tree, list | tuple):
        if all(not isinstance(v, Mapping | list | tuple) for v in tree):
            return {prefix: json.dumps(list(tree))}
        out = {}
        for i, value in enumerate(tree):
            out.update(flatten(value, f"{prefix}.{i}"))
        return out
    if tree is None:
        return {prefix: "none"}
    return {prefix: tree}


def metrics_of(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one ``metrics.jsonl`` record under their tracker keys (``{}`` for other kinds)."""
    prefix = RECORD_PREFIX.get(str(record.get("kind")))
    if prefix is None:
        return {}
    return {
        f"{prefix}{k}": float(v)
        for k, v in record.items()
        if k not in ("kind", "iteration") and isinstance(v, int | float) and not isinstance(v, bool)
    }


class Tracking:
    """The run's trackers; every call is a no-op without ``log.trackers`` or off the main process."""

    def __init__(self, accelerator: Any, trackers: Sequence[str], project: str, run_dir: Path) -> None:
        self.accelerator, self.names, self.project = accelerator, list(trackers), project
        self.run_dir = Path(run_dir)
        self.started = False

    @staticmethod
    def accelerator_kwargs(trackers: Sequence[str], run_dir: Path) -> dict[str, Any]:
        """What ``Accelerator(...)`` needs for ``trackers`` (TensorBoard writes under ``run_dir``)."""
        if not trackers:
            return {}
        from accelerate.utils import ProjectConfiguration

        where = ProjectConfiguration(
            project_dir=str(run_dir), logging_dir=str(Path(run_dir) / TENSORBOARD_DIR)
        )
        return {"log_with": list(trackers), "project_config": where}

    def start(self, *, run_name: str, config: Mapping[str, Any], resumed_at: int | None) -> None:
        """Open the tracker runs; ``resumed_at`` (the checkpoint's iteration) continues the earlier ones.

        A resumed run logs no config again: MLflow refuses a parameter whose value changed (a ``--set``).
        """
        if not self.names or not self.accelerator.is_main_process:
            return
        state = self._state() if resumed_at is not None else {}
        kwargs: dict[str, dict[str, Any]] = {}
        if "tensorboard" in self.names and resumed_at is not None:
            # same folder; readers drop the events a killed run wrote after its checkpoint
            kwargs["tensorboard"] = {"purge_step": resumed_at + 1}
        if "wandb" in self.names:
            wandb = {"name": run_name, "dir": str(self.run_dir)}
            if state.get("wandb_id"):
                wandb.update(id=state["wandb_id"], resume="allow")
            kwargs["wandb"] = wandb
        if "mlflow" in self.names:
            kwargs["mlflow"] = {"run_name": run_name, "run_id": state.get("mlflow_run_id")}
        try:
            self.accelerator.init_trackers(
                self.project, config=None if resumed_at is not None else flatten(config), init_kwargs=kwargs
            )
        except Exception as exc:  # each tracker raises its own types (no login, unreachable server)
            raise TrackerError(
                f"log.trackers: starting {', '.join(self.names)} failed ({type(exc).__name__}: {exc}); "
                "for W&B run `wandb login` or set WANDB_MODE=offline, for MLflow check MLFLOW_TRACKING_URI"
            ) from exc
        if "wandb" in self.names:
            state["wandb_id"] = self.accelerator.get_tracker("wandb", unwrap=True).id
        if "mlflow" in self.names:
            state["mlflow_run_id"] = self.accelerator.get_tracker("mlflow", unwrap=True).info.run_id
        (self.run_dir / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
        self.started = True

    def _state(self) -> dict[str, Any]:
        try:
            return json.loads((self.run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):  # a run that logged to no tracker before: start new tracker runs
            return {}

    def log_record(self, record: Mapping[str, Any]) -> None:
        """One ``metrics.jsonl`` record at its iteration."""
        values = metrics_of(record)
        if self.started and values:
            self.accelerator.log(values, step=int(record["iteration"]))

    def log_samples(
        self,
        iteration: int,
        grid: Path | None,
        samples: Any = None,
        group_size: int = 1,
        *,
        prompts: Sequence[str] = (),
        rewards: Sequence[float] = (),
    ) -> None:
        """The evaluation's grid as an image (and, for audio, a clip of each first prompt) at ``iteration``,
        and the first sample of each of the first prompts captioned ``prompt | reward`` (``prompts``: one
        per prompt; ``rewards``: one per sample, the weighted total).

        TensorBoard gets the single samples as ``eval/sample_NN`` and their captions as the text
        ``eval/sample_captions``; W&B a list of captioned ``wandb.Image`` (``eval/sample_images``); MLflow,
        beside the grid, its layout JSON (each tile's prompt and rewards). Video is logged as middle
        frames: TensorBoard's and W&B's video writers need moviepy.
        """
        if not self.started:
            return
        clips = _audio_clips(samples, group_size)
        singles = sample_images(samples, group_size, prompts, rewards)
        if "tensorboard" in self.names:
            writer = self.accelerator.get_tracker("tensorboard", unwrap=True)
            if grid is not None:
                writer.add_image("eval/samples", _pixels(grid), iteration, dataformats="HWC")
            for i, (pixels, _) in enumerate(singles):
                writer.add_image(f"eval/sample_{i:02d}", pixels, iteration, dataformats="HWC")
            if singles:
                lines = [f"sample_{i:02d}: {caption}" for i, (_, caption) in enumerate(singles)]
                writer.add_text("eval/sample_captions", "  \n".join(lines), iteration)
            for i, (clip, rate) in enumerate(clips):
                writer.add_audio(f"eval/clip_{i}", clip, iteration, sample_rate=rate)
            writer.flush()
        if "wandb" in self.names:
            import wandb

            media: dict[str, Any] = {}
            if grid is not None:
                media["eval/samples"] = wandb.Image(
                    str(grid), caption=f"held-out prompts, iteration {iteration}"
                )
            if singles:
                media["eval/sample_images"] = [wandb.Image(p, caption=c) for p, c in singles]
            if clips:
                media["eval/clips"] = [wandb.Audio(c.numpy(), sample_rate=r) for c, r in clips]
            if media:
                self.accelerator.get_tracker("wandb", unwrap=True).log(media, step=iteration)
        if "mlflow" in self.names and grid is not None:
            mlflow = self.accelerator.get_tracker("mlflow")
            mlflow.log_artifact(str(grid), artifact_path="samples")
            if grid.with_suffix(".json").is_file():
                mlflow.log_artifact(str(grid.with_suffix(".json")), artifact_path="samples")

    def finish(self) -> None:
        """Close the tracker runs (not ``end_training``: that also ends the process group)."""
        if self.started:
            for tracker in self.accelerator.trackers:
                tracker.finish()
            self.started = False


def _pixels(grid: Path) -> Any:
    import numpy as np
    from PIL import Image

    with Image.open(grid) as image:
        return np.asarray(image.convert("RGB"))


def caption(prompt: str, reward: float | None) -> str:
    """``prompt | reward``, the prompt cut at 100 characters (Flow-GRPO's caption)."""
    return f"{prompt[:100]} | {'–' if reward is None else f'{reward:.4g}'}"


def sample_images(
    samples: Any, group_size: int, prompts: Sequence[str], rewards: Sequence[float]
) -> list[tuple[Any, str]]:
    """``[(HWC uint8 pixels, "prompt | reward")]``: the first sample of each of the first ``MAX_IMAGES``
    prompts (a video's middle frame); ``[]`` for samples that are not visual."""
    if samples is None:
        return []
    from vgrpo_platform.training.observe.grids import frames_for_grid

    frames = frames_for_grid(samples)  # [B, 3, H, W] in [0, 1], or None
    if frames is None:
        return []
    out = []
    for n, i in enumerate(list(range(0, len(frames), max(1, group_size)))[:MAX_IMAGES]):
        pixels = (frames[i].detach().float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
        prompt = prompts[n] if n < len(prompts) else ""
        out.append((pixels, caption(prompt, float(rewards[i]) if i < len(rewards) else None)))
    return out


def _audio_clips(samples: Any, group_size: int) -> list[tuple[Any, int]]:
    """``[(mono waveform [samples], sample_rate)]``: the first sample of each of the first prompts (a
    video's soundtrack too)."""
    samples = None if samples is None else samples.for_modalities({"audio"})
    if samples is None or samples.modality != "audio" or not samples.sample_rate:
        return []
    data = samples.data.detach().float().clamp(-1, 1).mean(1).cpu()  # [B, samples]
    firsts = range(0, len(data), max(1, group_size))
    return [(data[i], int(samples.sample_rate)) for i in list(firsts)[:MAX_CLIPS]]
