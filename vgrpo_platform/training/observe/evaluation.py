"""Held-out evaluation under a pinned protocol: the one code path of training's evaluations and `vgrpo eval`.

The protocol (prompts, seed, sampler, steps, samples per prompt, sampling chunk) is read from the
recipe's ``[eval]`` alone, so the same weights give the same numbers during training and afterwards.
Besides the training rewards, an evaluation scores the ``[[eval.rewards]]`` (never trained on) and
the diversity of each prompt's samples: what the reward-hacking monitor watches (``monitor.py``).

Data parallel: each rank samples a contiguous block of the prompts with the noise of the whole set
(each sample gets its single-process noise); sharded models need the same number of forwards on every
rank, so a smaller share is padded and the padding dropped. Scores are gathered to every rank, and
so is a ``RewardError``: when one rank's rewards fail, every rank raises it after the same gather
(none is left waiting), which lets training handle it by ``train.on_fault`` on all ranks alike.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from vgrpo_platform.conditions import condition_images, has_condition, images_of
from vgrpo_platform.config.schema import DIVERSITY, EVAL_ONLY_TOTAL
from vgrpo_platform.errors import RewardError
from vgrpo_platform.parallel.context_parallel import degree_of
from vgrpo_platform.parallel.data_parallel import gather_objects, lockstep_rows, shard_of
from vgrpo_platform.parallel.sharded_state import gathered_while_generating
from vgrpo_platform.protocols import SamplerSpec, Samples
from vgrpo_platform.training.iteration.rollout import generate_with_extras
from vgrpo_platform.training.observe.clips import clip_folder, save_clips
from vgrpo_platform.training.observe.grids import save_grid


@dataclass(frozen=True)
class Protocol:
    """What an evaluation holds fixed, so two evaluations differ only in the weights."""

    prompts: tuple[str, ...]
    samples_per_prompt: int
    seed: int
    sampler: SamplerSpec
    chunk_size: int  # samples decoded per sampling call: batch size can move the last float digits

    @classmethod
    def of(cls, resolved: Any) -> Protocol:
        """The recipe's ``[eval]`` protocol (``resolved`` is a ``recipe.ResolvedRecipe``)."""
        r = resolved.recipe
        e = r.eval
        prompts = (resolved.eval_prompts or resolved.train_prompts)[: e.max_prompts]
        sampler = SamplerSpec(e.sampler or r.rollout.sampler, e.steps or r.rollout.steps)
        return cls(tuple(prompts), e.samples_per_prompt, e.seed, sampler, r.train.micro_batch_size)

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompts": list(self.prompts),
            "samples_per_prompt": self.samples_per_prompt,
            "seed": self.seed,
            "sampler": self.sampler.name,
            "steps": self.sampler.steps,
            "chunk_size": self.chunk_size,
        }


def source_images(prompts: Sequence[str]) -> list[torch.Tensor | None] | None:
    """Each prompt's first condition image (None where it has none), for grids; None when no prompt
    has one (a text-to-X run)."""
    if not has_condition(prompts):
        return None
    return [condition_images(p)[0] if images_of(p) else None for p in prompts]


def diversity(data: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[P]``: for each prompt's ``group_size`` consecutive samples, the mean over their pairs of the
    root-mean-square difference of all values (pixels, frames or audio samples, in the data's units).

    0 when a prompt's samples are identical: a policy collapsed onto one output scores 0 whatever the
    reward says. An explicit pairwise loop, not ``cdist``, so equal samples give exactly 0.
    """
    if group_size < 2:
        raise ValueError("diversity needs at least 2 samples per prompt")
    x = data.detach().float().reshape(len(data) // group_size, group_size, -1)  # [P, G, D]
    pairs = [
        (x[:, i] - x[:, j]).pow(2).mean(-1).sqrt()
        for i in range(group_size)
        for j in range(i + 1, group_size)
    ]
    return torch.stack(pairs, dim=1).mean(1)  # [P]


def standard_error(values: torch.Tensor) -> float:
    """``std / sqrt(n)`` with the unbiased std; NaN for fewer than two values."""
    n = values.numel()
    if n < 2:
        return math.nan
    return float(values.double().std(unbiased=True) / math.sqrt(n))


@dataclass
class Evaluation:
    """Every score of one evaluation, per sample (``diversity`` per prompt), prompts in protocol order."""

    protocol: Protocol
    terms: dict[str, torch.Tensor]  # reward key -> [N]: training rewards, then evaluation-only ones
    details: dict[str, torch.Tensor]  # "reward/criterion" -> [N]
    total: torch.Tensor  # [N] the training objective: weighted sum of the training rewards
    eval_only_total: torch.Tensor | None  # [N] weighted sum of the [[eval.rewards]]; None without any
    diversity: torch.Tensor | None  # [P]; None with one sample per prompt
    samples: Samples | None = None  # all samples, kept on request (grids, tracker media)

    def values(self) -> dict[str, torch.Tensor]:
        """Metric key (as in ``metrics.jsonl``) -> its values: ``[N]`` per sample, ``[P]`` for diversity."""
        out = {"reward": self.total}
        out.update({f"reward/{k}": v for k, v in self.terms.items()})
        out.update({f"detail/{k}": v for k, v in self.details.items()})
        if self.eval_only_total is not None:
            out[EVAL_ONLY_TOTAL] = self.eval_only_total
        if self.diversity is not None:
            out[DIVERSITY] = self.diversity
        return out

    def means(self) -> dict[str, float]:
        """What an evaluation record holds."""
        return {k: v.mean().item() for k, v in self.values().items()}

    def summary(self) -> dict[str, dict[str, float]]:
        """Metric -> mean, standard error of the mean and number of values it averages."""
        return {
            k: {"mean": v.mean().item(), "sem": standard_error(v), "n": v.numel()}
            for k, v in self.values().items()
        }

    def per_prompt(self) -> list[dict[str, Any]]:
        """Each prompt with the mean of every metric over its own samples."""
        g = self.protocol.samples_per_prompt
        rows = []
        for p, prompt in enumerate(self.protocol.prompts):
            row: dict[str, Any] = {"prompt": prompt}
            for key, v in self.values().items():
                row[key] = (v[p] if key == DIVERSITY else v[p * g : (p + 1) * g].mean()).item()
            rows.append(row)
        return rows

    def save_grid(self, path: Path, title: str) -> Path | None:
        """The labelled grid of the samples (``grids.save_grid``); None without kept samples that have
        pictures. Sounds and videos also leave a few playable files beside it (``clips.py``)."""
        if self.samples is None or len(self.samples) == 0:
            return None
        try:
            save_clips(self.samples, clip_folder(path), group_size=self.protocol.samples_per_prompt)
        except (ImportError, RuntimeError) as exc:  # no ffmpeg or soundfile here: the grid still comes
            print(f"warning: no playable clips beside {path}: {exc}", file=sys.stderr)
        return save_grid(
            self.samples,
            path,
            group_size=self.protocol.samples_per_prompt,
            prompts=list(self.protocol.prompts),
            details={k: v.tolist() for k, v in self.details.items()},
            rewards=self.total.tolist(),
            title=title,
            sources=source_images(self.protocol.prompts),
        )


@torch.no_grad()
def evaluate(
    session: Any,
    protocol: Protocol,
    *,
    accelerator: Any,
    scorer: Any,
    step: int | None = None,
    keep_samples: bool = False,
) -> Evaluation:
    """Sample the protocol's prompts with ``session``'s current weights and score them.

    ``session`` is a ``session.Session`` (adapter, training and evaluation-only rewards);
    ``accelerator`` anything with accelerate's ``num_processes`` / ``process_index`` / ``device``.
    Every rank returns the same scores; ``keep_samples`` gathers the samples too. ``scorer`` (a
    ``reward_workers.Scorer``: the training's ``[scoring]``, or an ``InlineScorer`` of the session's
    rewards) scores the training and evaluation-only rewards.
    """
    context = degree_of(session.adapter.denoiser)  # context parallelism: a group of processes is one rank
    shard = shard_of(accelerator, context)
    prompts, per_prompt = list(protocol.prompts), protocol.samples_per_prompt
    block = shard.block(len(prompts))  # each rank evaluates its share of the prompts
    mine = prompts[block]
    # sharded models need equal forward counts on all ranks: a smaller share is padded (and dropped)
    padding = lockstep_rows(shard, len(prompts)) - len(mine)  # 0 on one process
    rewards = [*session.rewards, *session.eval_rewards]
    local: dict[str, Any] = {"terms": {}, "details": {}, "diversity": [], "error": None}
    failure: RewardError | None = None
    images: list[torch.Tensor] = []
    soundtracks: list[torch.Tensor] = []  # a video's sound (``Samples.audio``), kept with its frames
    samples = None
    if mine or padding:
        padded = mine + [prompts[-1]] * padding
        with gathered_while_generating(session.adapter.denoiser):  # FSDP2: each unit gathered once
            group_ids, _, _, _, samples, _ = generate_with_extras(
                session.adapter,
                padded,
                group_size=per_prompt,
                sampler=protocol.sampler,
                generator=torch.Generator().manual_seed(protocol.seed),
                chunk_size=protocol.chunk_size,
                device=accelerator.device,
                noise_window=(block.start * per_prompt, len(prompts) * per_prompt),
            )
        real = len(mine) * per_prompt
        samples = samples.select(slice(0, real))
        flat_prompts = [mine[int(g)] for g in group_ids[:real]]
        if real:
            try:
                terms, details = scorer.score(
                    samples, flat_prompts, step=step, which="eval", group_size=per_prompt
                )
            except RewardError as exc:  # raised below, after every rank has reached the gather
                failure, local["error"] = exc, str(exc)
            else:
                local["terms"] = {k: v.tolist() for k, v in terms.items()}
                local["details"] = {k: v.tolist() for k, v in details.items()}
                if per_prompt >= 2:
                    local["diversity"] = diversity(samples.data, per_prompt).tolist()
                if keep_samples:
                    images = [samples.data.cpu()]
                    soundtracks = [] if samples.audio is None else [samples.audio.cpu()]
    gathered = gather_objects(accelerator, [local], context)  # rank order = prompt order
    if failure is not None:
        raise failure
    errors = [part["error"] for part in gathered if part.get("error") is not None]
    if errors:  # another rank's rewards failed: this one stops with the same message
        raise RewardError(errors[0])
    terms = {r.key: _joined(gathered, "terms", r.key) for r in rewards}
    detail_keys = sorted({k for part in gathered for k in part["details"]})
    details = {k: _joined(gathered, "details", k) for k in detail_keys}
    total = sum(r.weight * terms[r.key] for r in session.rewards)
    eval_only = sum(r.weight * terms[r.key] for r in session.eval_rewards) if session.eval_rewards else None
    div = torch.tensor([x for part in gathered for x in part["diversity"]]) if per_prompt >= 2 else None
    kept = None
    if keep_samples:
        images = gather_objects(accelerator, images, context)
        soundtracks = gather_objects(accelerator, soundtracks, context)
        if images and samples is not None:  # every rank's frames (and soundtracks: the clips beside a grid)
            audio = torch.cat(soundtracks) if len(soundtracks) == len(images) else None
            kept = replace(samples, data=torch.cat(images), audio=audio)
    return Evaluation(protocol, terms, details, total, eval_only, div, kept)


def _joined(parts: Sequence[dict[str, Any]], field: str, key: str) -> torch.Tensor:
    return torch.tensor([x for part in parts for x in part[field].get(key, [])])
