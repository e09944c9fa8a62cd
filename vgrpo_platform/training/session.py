"""Turning a validated recipe into live objects: device, adapter, what is trained, rewards, surrogate.

Shared by ``vgrpo run`` and ``vgrpo sample`` so both see the policy the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from vgrpo_platform.config.recipe import ResolvedRecipe, ResolvedReward
from vgrpo_platform.config.schema import Recipe
from vgrpo_platform.errors import PluginError
from vgrpo_platform.finetune import make_trainable
from vgrpo_platform.kernels import apply_to_denoiser
from vgrpo_platform.network import denoiser_call_of
from vgrpo_platform.protocols import Adapter, BuildContext, Samples, SurrogateBase
from vgrpo_platform.training.iteration import offload
from vgrpo_platform.training.iteration.scoring import WeightedReward


def resolve_device(name: str) -> torch.device:
    """``run.device`` as a torch device; a CPU one is also told to DeepSpeed (``tell_deepspeed``)."""
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif name == "cuda" and not torch.cuda.is_available():
        from vgrpo_platform.errors import RecipeError

        raise RecipeError("run.device = 'cuda' but no CUDA device is visible; use 'auto' or 'cpu'")
    else:
        device = torch.device(name)
    tell_deepspeed(device)
    return device


def tell_deepspeed(device: torch.device) -> None:
    """Name the CPU to DeepSpeed (``DS_ACCELERATOR``, unless the user set it) before anything imports it.

    Why: where DeepSpeed is installed, accelerate imports it whenever a model is unwrapped (transformers'
    ``save_pretrained`` does, to recognise a DeepSpeed engine), even in runs that never use it; on
    import DeepSpeed looks for a GPU and, finding none, prints "Setting accelerator to CPU. If you have
    GPU or other accelerator, we were unable to detect it." at every start of a CPU run.
    """
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def run_dir_of(recipe: Recipe) -> Path:
    return Path(recipe.run.output_dir) / recipe.run.name


@dataclass
class Session:
    adapter: Adapter
    trainable: dict[str, torch.nn.Parameter]  # name -> parameter the optimiser updates
    rewards: list[WeightedReward]
    surrogate: SurrogateBase
    context: BuildContext
    eval_rewards: list[WeightedReward] = field(
        default_factory=list
    )  # [[eval.rewards]]: scored, never trained
    speed: list[str] = field(default_factory=list)  # start-up lines: kernels, parallel.context


class ScoredInWorker:
    """Stands for a reward that ``scoring.isolation = "process"`` builds in its worker, not here: the
    session keeps its key and weight (advantages, evaluation totals) without holding its model."""

    modalities: frozenset[str] = frozenset()

    def __init__(self, key: str) -> None:
        self.key = key

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> NoReturn:
        raise RuntimeError(
            f"reward '{self.key}' is scored by the reward worker (reward_workers.ProcessScorer)"
        )


def build_session(
    resolved: ResolvedRecipe,
    context: BuildContext,
    *,
    rewards_here: bool = True,
) -> Session:
    """Build every component from the resolved recipe and make the policy trainable.

    ``rewards_here = False``: the rewards live in a worker process; the session holds stand-ins."""
    adapter = resolved.adapter.spec.factory(resolved.adapter.config, context)
    call = denoiser_call_of(adapter)  # the core makes every call of the denoiser: one-line error if it can't
    trainable = make_trainable(adapter, resolved.recipe.train)
    speed = apply_to_denoiser(call.module, resolved.recipe.train, resolved.adapter.spec.name)
    offload_rewards = resolved.recipe.train.offload_rewards

    def build_rewards(refs: Sequence[ResolvedReward]) -> list[WeightedReward]:
        built = []
        for r in refs:
            if not rewards_here:
                built.append(WeightedReward(r.key, ScoredInWorker(r.key), r.weight))
                continue
            reward = r.spec.factory(r.config, context)
            if offload_rewards:
                offload.park(reward, keep=adapter)  # host memory until it scores (scoring.score_all)
            built.append(WeightedReward(r.key, reward, r.weight))
        return built

    rewards = build_rewards(resolved.rewards)
    surrogate = resolved.surrogate.spec.factory(resolved.surrogate.config, context)
    if not isinstance(surrogate, SurrogateBase):  # the loop calls its hooks without asking
        raise PluginError(
            f"surrogate '{resolved.surrogate.spec.name}' built a {type(surrogate).__name__}, which does not "
            "subclass vgrpo_platform.protocols.SurrogateBase; subclass it (its optional hooks are no-ops)"
        )
    with torch.random.fork_rng(devices=[]):  # evaluation-only rewards leave training's random draws alone
        eval_rewards = build_rewards(resolved.eval_rewards)
    return Session(
        adapter=adapter,
        speed=speed,
        trainable=trainable,
        rewards=rewards,
        surrogate=surrogate,
        context=context,
        eval_rewards=eval_rewards,
    )


def fingerprint(recipe: Recipe) -> str:
    """What must match for a checkpoint's weights to fit this recipe's model."""
    t = recipe.train
    key: dict[str, Any] = {
        "adapter": recipe.adapter.model_dump(),
        "finetune": [t.finetune, t.lora_rank, t.lora_alpha, t.lora_targets],
    }
    if t.init_lora is not None:  # its rank and targets shape the weights (absent: older runs' hash unchanged)
        key["init_lora"] = t.init_lora
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
