"""``vgrpo sample``: generate files from the base model or a trained checkpoint (whose loading
``vgrpo eval`` shares)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vgrpo_platform import media
from vgrpo_platform.conditions import Prompt
from vgrpo_platform.config.recipe import RESOLVED_JSON, ResolvedRecipe
from vgrpo_platform.errors import CheckpointError
from vgrpo_platform.protocols import BuildContext, SamplerSpec, Samples
from vgrpo_platform.training.iteration.rollout import generate_with_extras
from vgrpo_platform.training.observe.evaluation import source_images
from vgrpo_platform.training.observe.grids import save_grid
from vgrpo_platform.training.recovery.checkpoint import (
    FILES,
    Checkpoint,
    latest_valid_checkpoint,
    load_checkpoint,
    missing_files,
)
from vgrpo_platform.training.recovery.recipe_changes import Change, listed, model_changes, refuse_foreign
from vgrpo_platform.training.session import Session, build_session, fingerprint, resolve_device


def resolve_checkpoint(checkpoint: str | Path | None) -> Checkpoint | None:
    """The checkpoint ``--checkpoint`` names (its contents checked: ``checkpoint_contents.py``); a folder
    that is none says what it lacks. A run directory gives its newest usable checkpoint."""
    if checkpoint is None:
        return None
    path = Path(checkpoint)
    if (path / "checkpoints").is_dir():  # a run directory: take its newest valid checkpoint
        found = latest_valid_checkpoint(path, on_skip=lambda why: print(f"warning: {why}", file=sys.stderr))
        if found is None:
            raise CheckpointError(
                f"run directory {path} holds no usable checkpoint in {path / 'checkpoints'} (none complete, "
                "or only damaged ones: see the warnings); train it first, or name one of its "
                "checkpoints/iter_* folders"
            )
        return found
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} does not exist; pass a run directory or a checkpoints/iter_* folder"
        )
    missing = missing_files(path)
    if len(missing) == len(FILES):
        raise CheckpointError(
            f"{path} is neither a run directory (it has no checkpoints/ folder) nor a checkpoint (it has "
            f"no {', '.join(FILES)}); pass a run directory (run.output_dir/run.name) or one of its "
            "checkpoints/iter_* folders"
        )
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is incomplete: it lacks {', '.join(missing)}; pass its run directory "
            f"{path.parent.parent} to take the newest complete checkpoint"
        )
    return load_checkpoint(path)


def used(ckpt: Checkpoint) -> str:
    """The line naming the checkpoint a command loaded, and the newer ones of the run it passed over."""
    line = f"checkpoint: {ckpt.path} (iteration {ckpt.iteration})"
    if ckpt.skipped:
        line += f", an older one: the newer {'; '.join(ckpt.skipped)}"
    return line


def check_fit(resolved: ResolvedRecipe, ckpt: Checkpoint) -> list[Change] | None:
    """Compare the checkpoint's fingerprint with the recipe's before any model loads: another adapter or
    LoRA setup stops here, naming the keys; other adapter options (guidance, resolution) get a note and
    the weights are loaded if they fit. Returns the model keys that differ (``None``: unknown)."""
    found = ckpt.state.get("fingerprint")
    if found is None or found == fingerprint(resolved.recipe):
        return []
    run_dir = ckpt.path.parent.parent
    differ = model_changes(run_dir, resolved.recipe)
    source = str(resolved.path) if resolved.path else "this recipe"
    if differ is None:
        print(
            f"note: checkpoint {ckpt.path} was written for another model or LoRA setup than {source} "
            f"(no {RESOLVED_JSON} in {run_dir} says which keys); its weights are loaded if they fit",
            file=sys.stderr,
        )
        return None
    refuse_foreign(ckpt.path, differ, source)
    if differ:
        print(f"note: {source} differs from the run's recipe in {listed(differ)}", file=sys.stderr)
    return differ


def load_weights(
    trainable: dict[str, torch.nn.Parameter], ckpt: Checkpoint, differ: list[Change] | None
) -> None:
    """Copy the served weights in (``vgrpo sample``, ``vgrpo eval``, ``vgrpo export``); names or shapes that
    do not match are one error naming the cause."""
    weights = ckpt.served_weights
    missing = set(trainable) - set(weights)
    extra = set(weights) - set(trainable)
    shaped = [k for k, p in trainable.items() if k in weights and weights[k].shape != p.shape]
    if missing or extra or shaped:
        why = f"; the run's recipe differs in {listed(differ)}" if differ else ""
        raise CheckpointError(
            f"checkpoint {ckpt.path} does not fit this recipe's model ({len(missing)} weights missing, "
            f"{len(extra)} with no place in it, {len(shaped)} of another shape{why}); use the recipe the "
            "run was trained with"
        )
    for name, p in trainable.items():
        p.copy_(weights[name].to(p.device, p.dtype))


@torch.no_grad()
def trained_session(
    resolved: ResolvedRecipe,
    context: BuildContext,
    checkpoint: str | Path | None = None,
) -> tuple[Session, Checkpoint | None]:
    """The recipe's session with a run's weights loaded, to sample from (``vgrpo sample``, ``vgrpo eval``).

    ``checkpoint`` is a run directory (its newest complete checkpoint) or a ``checkpoints/iter_*``
    folder; None = the base model. The moving average is loaded where the run kept one: what it
    evaluated and exported. The checkpoint is read and its fingerprint checked first, so a wrong path or
    another model's checkpoint fails before any model loads.
    """
    ckpt = resolve_checkpoint(checkpoint)
    differ = check_fit(resolved, ckpt) if ckpt is not None else []
    session = build_session(resolved, context)
    if ckpt is not None:
        load_weights(session.trainable, ckpt, differ)
        print(used(ckpt), file=sys.stderr)  # which one, and why not a newer one of the run
    session.adapter.denoiser.eval()
    return session, ckpt


@torch.no_grad()
def sample_to_folder(
    resolved: ResolvedRecipe,
    *,
    out_dir: str | Path,
    checkpoint: str | Path | None = None,
    prompts: Sequence[str] | None = None,
    num_per_prompt: int = 1,
    seed: int = 0,
) -> list[Path]:
    """Write ``num_per_prompt`` samples for each prompt (the recipe's eval prompts by default)."""
    recipe = resolved.recipe
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(recipe.run.device)
    context = BuildContext(device=device, seed=recipe.run.seed, run_dir=out, recipe_dir=resolved.recipe_dir)
    session, _ = trained_session(resolved, context, checkpoint)
    if not prompts:
        prompts = (resolved.eval_prompts or resolved.train_prompts)[: recipe.eval.max_prompts]
    sampler = SamplerSpec(
        recipe.eval.sampler or recipe.rollout.sampler, recipe.eval.steps or recipe.rollout.steps
    )
    group_ids, _, _, _, samples, _ = generate_with_extras(
        session.adapter,
        list(prompts),
        group_size=num_per_prompt,
        sampler=sampler,
        generator=torch.Generator().manual_seed(seed),
        chunk_size=recipe.train.micro_batch_size,
        device=device,
    )
    written = write_samples(samples, out, [prompts[int(g)] for g in group_ids])
    index = [index_row(p.name, prompts[int(g)]) for p, g in zip(written, group_ids, strict=True)]
    (out / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    sources = source_images(list(prompts))
    if sources is not None or samples.modality in ("video", "audio"):  # filmstrips, spectrograms
        title = f"{num_per_prompt} sample(s) per prompt"
        if sources is not None:  # an edit's source beside its results
            title = f"source (black border), then {title}"
        save_grid(
            samples,
            out / "grid.png",
            group_size=num_per_prompt,
            prompts=list(prompts),
            sources=sources,
            title=title,
        )
    return written


def index_row(file: str, prompt: str) -> dict[str, Any]:
    """A line of ``index.jsonl``: the file, its prompt and the prompt's JSONL fields (its ``image``)."""
    return {"file": file, "prompt": str(prompt), **(prompt.metadata if isinstance(prompt, Prompt) else {})}


def write_samples(samples: Samples, out: Path, prompts: Sequence[str]) -> list[Path]:
    """One file per sample in its modality's usual format."""
    from PIL import Image

    paths = []
    data = samples.data.detach().float().cpu()
    for i in range(len(samples)):
        if samples.modality == "image":
            path = out / f"{i:05d}.png"
            array = (data[i].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            Image.fromarray(array).save(path)
        elif samples.modality == "video":
            path = media.write_video(data[i], out / f"{i:05d}.mp4", fps=samples.fps or 16.0)
            if samples.audio is not None and samples.sample_rate:  # its soundtrack, beside it
                media.write_audio(
                    samples.audio[i].detach().float().cpu(), path.with_suffix(".wav"), samples.sample_rate
                )
        elif samples.modality == "audio" and samples.sample_rate:
            path = media.write_audio(data[i], out / f"{i:05d}.wav", samples.sample_rate)
        else:
            path = out / f"{i:05d}.pt"
            torch.save(data[i], path)
        paths.append(path)
    return paths
