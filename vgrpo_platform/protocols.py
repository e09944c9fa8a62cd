"""The contracts between the core and its plugins, with the tensor shapes they exchange.

Shapes use ``B`` for the number of samples in a batch (prompts x group size), ``K`` for the number
of Monte-Carlo ``(t, eps)`` pairs (``n_mc``) and ``*L`` for one sample's latent shape as the adapter
declares it (``[C, H, W]`` for images, ``[C, F, H, W]`` for video, ``[C, T]`` for audio...).
Time ``t`` is always the continuous noise level in ``[0, 1]`` (0 = clean data, 1 = pure noise);
adapters convert it to whatever their network expects.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, TypeVar, runtime_checkable

if TYPE_CHECKING:  # the entry modules of plugins import this file: keep torch out of import time
    import torch

    from vgrpo_platform.parallel.data_parallel import RowsOf

Conditioning = dict[str, "torch.Tensor"]
"""Prompt conditioning: every tensor batch-first ``[B, ...]`` so the core can index and repeat it."""


@dataclass
class Samples:
    """Decoded outputs in their modality, what rewards see.

    image: ``data`` ``[B, 3, H, W]`` float in ``[0, 1]``; video: ``[B, F, 3, H, W]`` in ``[0, 1]``;
    audio: ``[B, channels, samples]`` in ``[-1, 1]`` with ``sample_rate`` set.

    A video may carry its soundtrack (a joint audio-video model such as LTX-2): ``audio``
    ``[B, channels, samples]`` in ``[-1, 1]`` at ``sample_rate``. Rewards of either modality score it
    (``for_modalities``): a video reward sees the clip (and may read ``audio``), an audio reward the
    soundtrack alone, as an audio ``Samples``.
    """

    modality: str
    data: torch.Tensor
    sample_rate: int | None = None
    fps: float | None = None
    audio: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.data.shape[0])

    @property
    def modalities(self) -> frozenset[str]:
        """What these samples can be scored as: their modality, and ``"audio"`` with a soundtrack."""
        return frozenset({self.modality} | ({"audio"} if self.audio is not None else set()))

    def for_modalities(self, accepted: frozenset[str] | set[str]) -> Samples | None:
        """These samples as a reward that scores ``accepted`` sees them: themselves when their own
        modality is accepted, their soundtrack as audio samples when only audio is, else None."""
        if self.modality in accepted:
            return self
        if self.audio is not None and "audio" in accepted:
            return Samples("audio", self.audio, sample_rate=self.sample_rate)
        return None

    def select(self, rows: Any) -> Samples:
        """The samples at ``rows`` (a slice or an index tensor), the soundtrack with them."""
        audio = None if self.audio is None else self.audio[rows]
        return dataclasses.replace(self, data=self.data[rows], audio=audio)

    @classmethod
    def concat(cls, parts: Sequence[Samples]) -> Samples:
        """One batch from chunks of the same kind, the soundtracks joined too."""
        import torch  # only once tensors exist: this module stays torch-free at import time

        first = parts[0]
        audio = None if first.audio is None else torch.cat([p.audio for p in parts if p.audio is not None])
        return dataclasses.replace(first, data=torch.cat([p.data for p in parts]), audio=audio)

    def map_tensors(self, fn: Any) -> Samples:
        """``fn`` applied to ``data`` and ``audio`` (a device move, a detach)."""
        return dataclasses.replace(
            self, data=fn(self.data), audio=None if self.audio is None else fn(self.audio)
        )


@dataclass(frozen=True)
class SamplerSpec:
    """Which ODE solver a rollout uses: any works, V-GRPO needs no per-step log-probs."""

    name: str = "euler"  # "euler" | "dpmsolver++" | "unipc"
    steps: int = 10


@runtime_checkable
class NoiseSchedule(Protocol):
    """The forward process ``z_t = a(t) x + b(t) eps`` and the model's parameterisation."""

    def noise(self, x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``z_t`` from clean ``x0`` ``[B, *L]``, noise ``eps`` ``[B, *L]`` and ``t`` ``[B]``."""
        ...

    def predict_x0(self, z_t: torch.Tensor, model_output: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The network's estimate of the clean sample (x-space), same shape as ``z_t``."""
        ...

    def warp(self, u: torch.Tensor) -> torch.Tensor:
        """Map uniform ``u`` in ``[0, 1]`` to the model's (shifted) timestep grid."""
        ...


@runtime_checkable
class Adapter(Protocol):
    """A generator the core can roll out and train, whatever its modality or family.

    Optional: ``export_trained(out_dir: pathlib.Path) -> None``. When present, the core calls it at
    the end of a run to write the trained weights in the model family's own format (for example a
    LoRA that diffusers' ``pipe.load_lora_weights()`` accepts) into ``RUN_DIR/final``; without it the
    core writes its own (``finetune.export_trainable``). Either way the core adds the model card.
    """

    modality: str
    denoiser: torch.nn.Module
    """The network whose weights are trained (LoRA is attached to it by the core)."""
    lora_target_modules: Sequence[str]
    """Default module names (or regex) LoRA wraps when the recipe names none."""
    schedule: NoiseSchedule

    def latent_shape(self) -> tuple[int, ...]:
        """``*L``: the shape of one sample in the space the surrogate works in."""
        ...

    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Conditioning for ``len(prompts)`` prompts, batch-first; no gradient."""
        ...

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Model output at ``z_t`` ``[B, *L]``, ``t`` ``[B]``; same shape as ``z_t``.

        Differentiable with respect to ``denoiser``'s trainable parameters.
        """
        ...

    def sample(self, noise: torch.Tensor, cond: Conditioning, sampler: SamplerSpec) -> torch.Tensor:
        """Integrate from pure noise ``[B, *L]`` (t=1) to clean latents ``[B, *L]`` (t=0)."""
        ...

    def decode(self, latents: torch.Tensor) -> Samples:
        """Turn clean latents ``[B, *L]`` into the modality's samples (the reward's input)."""
        ...


@runtime_checkable
class Reward(Protocol):
    """A batched scorer. Higher is better.

    ``score`` returns ``[B]`` floats, or a mapping whose ``"score"`` entry is that tensor and whose
    other entries are ``[B]`` diagnostics (per-criterion scores) that are logged but not optimised.

    Optional: ``groups = True`` declares a group reward, one whose scores depend on a prompt's whole
    group (a diversity bonus): the core then calls ``score`` once per prompt group, ``B`` = the group's
    size, every prompt the same, rows in any order (docs/writing-a-reward.md, "Group rewards").
    """

    modalities: frozenset[str]

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor | Mapping[str, torch.Tensor]: ...


@dataclass
class BatchState:
    """What a surrogate's ``prepare`` (or its own ``rollout``) hands to its ``loss``: subclass it as a
    dataclass whose fields are batch-first tensors ``[B, ...]`` (or None where a field is off), so the
    core can slice micro-batches and join rollout chunks without knowing the fields, and the loss reads
    typed attributes instead of string keys. Override ``select``/``concat`` for any other field."""

    def select(self, index: torch.Tensor) -> Self:
        """The rows at ``index`` of every tensor field (a micro-batch); None stays None."""
        return dataclasses.replace(self, **{name: value[index] for name, value in self._tensors().items()})

    @classmethod
    def concat(cls, parts: Sequence[Self]) -> Self:
        """One state from chunks of rows (a rollout made chunk by chunk), fields joined along dim 0."""
        import torch  # only once tensors exist: this module stays torch-free at import time

        first = parts[0]
        joined = {name: torch.cat([getattr(p, name) for p in parts]) for name in first._tensors()}
        return dataclasses.replace(first, **joined)

    def _tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields by name; a field that is neither a tensor nor None is refused."""
        import torch  # see ``concat``

        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value
            elif value is not None:
                raise TypeError(
                    f"{type(self).__name__}.{f.name} is a {type(value).__name__}, not a batch-first tensor "
                    "or None: override select() and concat() to slice it"
                )
        return out


StateT = TypeVar("StateT", bound=BatchState)


class DeprecatedExtras(dict[str, "torch.Tensor"]):
    """``RolloutBatch.extras``, kept one release for third-party surrogates: a surrogate's write or read
    warns (use a ``BatchState`` in ``batch.state``); the core's slicing and copying do not."""

    def _warn(self) -> None:
        warnings.warn(
            "batch.extras is deprecated and will be removed in the next release: declare a BatchState "
            "dataclass and store it in batch.state (docs/hooks.md)",
            DeprecationWarning,
            stacklevel=3,
        )

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self._warn()
        super().__setitem__(key, value)

    def __getitem__(self, key: str) -> torch.Tensor:
        self._warn()
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._warn()
        return super().get(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._warn()
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._warn()
        return super().setdefault(key, default)


@dataclass
class RolloutBatch:
    """One iteration's rollouts, everything the update needs. All tensors batch-first ``[B, ...]``."""

    prompts: list[str]
    group_ids: torch.Tensor  # [B] long: samples of the same prompt share an id
    cond: Conditioning  # [B, ...]
    latents: torch.Tensor  # [B, *L] final clean samples o_i
    rewards: torch.Tensor  # [B] weighted sum of the reward terms
    reward_terms: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B] raw scores
    advantages: torch.Tensor | None = None  # [B]
    extras: dict[str, torch.Tensor] = field(default_factory=DeprecatedExtras)  # deprecated: use state
    rows: RowsOf | None = None  # a data-parallel rank's place in the global batch (None: the whole batch)
    state: BatchState | None = None  # the surrogate's own, from its prepare() (or rollout()); [B, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.extras, DeprecatedExtras):
            self.extras = DeprecatedExtras(self.extras)

    def __len__(self) -> int:
        return int(self.latents.shape[0])

    def select(self, index: torch.Tensor) -> RolloutBatch:
        """The sub-batch at ``index`` (a micro-batch), tensors indexed along dim 0."""
        idx = index.tolist()
        return RolloutBatch(
            prompts=[self.prompts[i] for i in idx],
            group_ids=self.group_ids[index],
            cond={k: v[index] for k, v in self.cond.items()},
            latents=self.latents[index],
            rewards=self.rewards[index],
            reward_terms={k: v[index] for k, v in self.reward_terms.items()},
            advantages=None if self.advantages is None else self.advantages[index],
            extras={k: v[index] for k, v in self.extras.items()},
            state=None if self.state is None else self.state.select(index),
        )

    def state_as(self, kind: type[StateT], needed_by: str, written_by: str = "prepare()") -> StateT:
        """``self.state`` as the ``kind`` its surrogate declared; a one-line error if it is missing (the
        loss was called before ``written_by``) or of another type (another surrogate prepared it)."""
        if self.state is None:
            raise ValueError(f"{needed_by} needs the {kind.__name__} written by {written_by}; call it first")
        if not isinstance(self.state, kind):
            raise TypeError(
                f"{needed_by} needs batch.state to be a {kind.__name__}, got {type(self.state).__name__} "
                "(was the batch prepared by another surrogate?)"
            )
        return self.state


@runtime_checkable
class Surrogate(Protocol):
    """A stand-in for ``log pi_theta(o | c)`` and the policy loss built on it.

    Implement it by subclassing ``SurrogateBase``, which gives the optional hooks the loop calls on
    every surrogate (``begin_iteration``, ``plan_updates``, ``after_step``, ``rollout``) as no-ops.
    """

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        """At rollout time, without gradient: draw what the loss needs and store it, with the old
        policy's statistics, as the surrogate's own ``BatchState`` in ``batch.state`` (batch-first, so
        micro-batching slices it)."""
        ...

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss to minimise, the mean over the (micro-)batch's samples, and metrics."""
        ...


class SurrogateBase:
    """The base of every surrogate: ``prepare`` and ``loss`` to write, and the loop's optional hooks
    as no-ops to override where a method needs them (the MDP and EMA baselines do). The loop calls
    each hook on every surrogate, so none is looked up by name."""

    initial_noise: Literal["sample", "group"] = "sample"
    """``"group"``: one initial noise per prompt group in training rollouts (DanceGRPO, Flow-GRPO-Fast)."""
    owns_rollout: bool = False
    """True: training rollouts come from ``rollout`` instead of ``adapter.sample`` (never evaluations)."""
    rollout_block: int = 1
    """Rows one ``rollout`` call must see together (a tree rollout's leaves, the prompt group): the loop
    rounds its rollout chunks up to a multiple of it."""
    gradient_steps: int = 0
    """Optimiser steps each batch gets, as told by ``plan_updates`` (0 = unknown)."""
    needs_exact_rollouts: bool = False
    """True: the ratio is the sampler's own log-probability (the MDP family), so training samples must
    come from the exact in-process sampler; a lossy or overlapped rollout backend is refused."""
    samples_on_policy: bool = True
    """Set by the loop each iteration: False when the batch was generated by older weights (an
    overlapped backend); ``prepare`` then runs under those weights, and must not take the old policy
    from the loss's own forward."""

    def prepare(self, batch: RolloutBatch, adapter: Adapter, generator: torch.Generator) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement prepare()")

    def loss(self, batch: RolloutBatch, adapter: Adapter) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError(f"{type(self).__name__} must implement loss()")

    def begin_iteration(self, iteration: int) -> None:
        """Before each training rollout (1-based), e.g. to place MixGRPO's sliding SDE window."""

    def plan_updates(self, gradient_steps: int) -> None:
        """Told before training (and by diagnostics) how many optimiser steps each batch gets. With 1,
        ``loss`` runs on the old policy itself, so ``prepare`` may leave the old policy's forward to it."""
        self.gradient_steps = gradient_steps

    def after_step(self, adapter: Adapter) -> None:
        """After each optimiser step, e.g. to move an EMA old policy."""

    def score_steps(
        self, batch: RolloutBatch, adapter: Adapter, score: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """After the rewards and before ``prepare``: ``score`` maps clean latents ``[B, *L]`` (the batch's
        rows, in order) to their total reward ``[B]``, for rewards of intermediate steps (DenseGRPO)."""

    def rollout(
        self,
        adapter: Adapter,
        noise: torch.Tensor,
        cond: Conditioning,
        sampler: SamplerSpec,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, BatchState]:
        """With ``owns_rollout``: ``noise [B, *L]`` -> ``(clean latents [B, *L], state)``, e.g. an SDE
        recording its trajectory ``[B, T+1, *L]``, timesteps ``[B, T+1]`` and old log-probs ``[B, T]``;
        the chunks' states are joined (``BatchState.concat``) into ``batch.state``, which ``prepare``
        completes. A dict of tensors still works (it starts the deprecated ``batch.extras``) and warns."""
        raise NotImplementedError(f"{type(self).__name__} samples with the adapter (owns_rollout = False)")


class ReferencePolicy(Protocol):
    """How the core evaluates the frozen reference: a context in which ``adapter.predict`` is the
    base model (LoRA disabled, or a frozen copy for full fine-tuning)."""

    def __call__(self) -> AbstractContextManager[None]: ...


@dataclass
class BuildContext:
    """What a plugin factory may need from the host besides its own config."""

    device: Any = "cpu"  # torch.device or str
    dtype: Any = None  # torch.dtype for weights; None = float32
    seed: int = 0
    run_dir: Any = None  # pathlib.Path of the run, or None
    recipe_dir: Any = None  # pathlib.Path of the recipe file, to resolve relative paths
    extra: dict[str, Any] = field(default_factory=dict)
