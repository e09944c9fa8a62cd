"""The recipe's tables as pydantic models: every key a user can write, with its default.

Platform tables forbid unknown keys. ``[adapter.options]``, ``[surrogate.options]`` and each
``[[rewards]].options`` are free-form here and validated by the owning plugin's own ``Config``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunSection(Section):
    name: str = "run"
    output_dir: str = "runs"  # the run directory is output_dir/name (relative to the working dir)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        """The run directory is ``output_dir/name``: a path in ``name`` would write outside ``output_dir``."""
        if not name.strip() or name in (".", "..") or any(c in name for c in "/\\\0"):
            raise ValueError(
                f"run.name = {name!r} is not a plain folder name (no '/', '\\', '..', absolute path or "
                "empty name); name the run e.g. 'my_run' and put its parent folder in run.output_dir"
            )
        return name


class ComponentRef(Section):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class RewardRef(ComponentRef):
    weight: float = 1.0


class SurrogateRef(ComponentRef):
    name: str = "vgrpo"


class PromptsSection(Section):
    train: list[str] = Field(default_factory=list)  # inline prompts
    train_file: str | None = None  # .txt (one per line) or .jsonl ({"prompt": ...}); relative to the recipe
    eval: list[str] = Field(default_factory=list)  # held-out prompts; empty = first train prompts
    eval_file: str | None = None
    shuffle: bool = True
    # follow a prompt file's symlinks out of the recipe's folder (refused by default: config.recipe.confined)
    allow_outside: bool = False


class RolloutSection(Section):
    group_size: int = Field(8, ge=2)  # G samples per prompt
    prompts_per_iteration: int = Field(4, ge=1)
    sampler: Literal["euler", "dpmsolver++", "unipc"] = "euler"
    steps: int = Field(10, ge=1)
    # where training rollouts' final latents come from (vgrpo_platform.rollout_backends): "in_process"
    # (exact), "cached" (a diffusers step cache), "worker" (another process), or a third-party backend
    backend: str = "in_process"
    backend_options: dict[str, Any] = Field(default_factory=dict)  # validated by the backend's own Config
    # generate iteration i+1's rollout while iteration i updates (a backend that overlaps: worker):
    # every rollout after the first is one update old; the ratio is taken against the weights that made it
    overlap: bool = False
    # a backend that is not exact: every N iterations the first mismatch_samples rows are generated again
    # with the exact in-process sampler from the same noise and weights, and the gap is logged
    # (rollout_mismatch_*); None = every 10 iterations for such a backend, 0 = never
    mismatch_every: int | None = Field(None, ge=0)
    mismatch_samples: int = Field(4, ge=1)


class GRPOSection(Section):
    std: Literal["group", "global", "none"] = "group"  # which std normalises advantages
    eps: float = 1e-4
    reward_aggregation: Literal["normalize_then_sum", "weighted_sum"] = "normalize_then_sum"
    soft_clip_eta: float | None = None  # A <- eta * tanh(A / eta); None = off


class DataAnchorSection(Section):
    """``[train.data_anchor]``: a flow-matching loss on real data added to the surrogate's (DDRL), so the
    policy cannot drift off the data while it chases the reward (``training.iteration.data_anchor``)."""

    weight: float = Field(0.0, ge=0)  # 0 = off (nothing is loaded or drawn)
    # a .safetensors file (relative to the recipe): tensor "latents" [N, *L] and metadata "prompts", a JSON
    # list of N strings; `vgrpo shapes-anchor-data` writes one from the shapes world's renderer
    source: str | None = None
    batch_size: int = Field(8, ge=1)  # data rows per optimiser step, over all processes together
    seed: int = 0  # the anchor's own stream: rows, t and eps depend on (seed, optimiser step) only

    @model_validator(mode="after")
    def _weight_needs_source(self) -> DataAnchorSection:
        if self.weight > 0 and not self.source:
            raise ValueError(
                "train.data_anchor.weight > 0 needs train.data_anchor.source (a .safetensors file)"
            )
        return self


class TrainSection(Section):
    iterations: int = Field(100, ge=1)
    gradient_steps_per_iteration: int = Field(1, ge=1)  # >1 re-uses a rollout (off-policy, ratio clip)
    micro_batch_size: int = Field(8, ge=1)
    lr: float = 1e-4
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_steps: int = Field(0, ge=0)
    # after warm-up: "constant", or "cosine" from lr down to lr * lr_final_ratio at the last optimiser step
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_final_ratio: float = Field(0.1, ge=0, le=1)
    grad_clip: float | None = 1.0
    # moving average of the weights (per optimiser step) that evaluations, grids and the exported model
    # use; the optimiser keeps the raw weights. None or 0 = off; 0.95 averages over ~20 steps
    ema_decay: float | None = Field(None, ge=0, lt=1)
    finetune: Literal["lora", "full"] = "lora"
    lora_rank: int = Field(8, ge=1)
    lora_alpha: float = 16.0
    lora_targets: list[str] | None = None  # None = the adapter's defaults
    # start from an existing diffusers-format LoRA (a folder such as a run's final/, a .safetensors file,
    # or a Hub repo id): its own rank, alpha and targets replace the three keys above (finetune.py)
    init_lora: str | None = None
    gradient_checkpointing: bool = False
    # speed switches of the denoiser itself (vgrpo_platform/kernels.py), for rollouts and training alike:
    # "blocks" = torch.compile on each repeated transformer block (diffusers' regional compilation)
    compile: Literal["off", "blocks"] = "off"
    # a diffusers attention backend ("native", "flash", ...) from the installed list; None = its default
    attention_backend: str | None = None
    # a reward that raises or returns NaN/inf, a NaN loss, out of memory in a rollout (faults.py):
    # "stop" saves a checkpoint and exits with the error; "skip" drops the iteration and goes on
    on_fault: Literal["stop", "skip"] = "stop"
    max_consecutive_skips: int = Field(3, ge=1)  # "skip" still stops after this many faults in a row
    offload_rewards: bool = False  # reward models in host memory except while scoring: frees their GPU memory
    # seconds a collective (gather, barrier, gradient all-reduce) waits for every process before it fails:
    # a paused or hung rank stops the others after this long, not gloo's 30 minutes; longer than
    # scoring.timeout_s plus a worker's restart, so a rank replacing a hung reward worker is waited for;
    # None = torch's default
    collective_timeout_s: float | None = Field(900.0, gt=0)
    data_anchor: DataAnchorSection = Field(default_factory=DataAnchorSection)

    @field_validator("attention_backend")
    @classmethod
    def _known_attention_backend(cls, name: str | None) -> str | None:
        from vgrpo_platform.kernels import check_attention_backend  # diffusers' own list, as installed

        return None if name is None else check_attention_backend(name)

    @model_validator(mode="after")
    def _init_lora_is_a_lora(self) -> TrainSection:
        if self.init_lora is not None and self.finetune != "lora":
            raise ValueError("train.init_lora starts a LoRA: set train.finetune = 'lora' or remove init_lora")
        return self


class ScoringSection(Section):
    """Where rewards run (``training.iteration.reward_workers``): in the training process or in a worker
    process, and whether the rollout's chunks are scored while later chunks are generated."""

    isolation: Literal["inline", "process"] = "inline"  # "process": a crash takes only the worker down
    # score each chunk of whole prompt groups while the next is generated; every iteration stays on-policy
    overlap: bool = False
    device: str | None = None  # the worker's device (e.g. "cuda:1"); None = run.device; "process" only
    max_restarts: int = Field(
        1, ge=0
    )  # worker deaths survived per run before the RewardError (train.on_fault)
    worker_threads: int | None = Field(None, ge=1)  # torch threads in the worker; None = torch's default
    # seconds one batch may wait for the worker's scores before the worker counts as dead (killed, restarted
    # under max_restarts); None = wait forever. "process" only: a thread cannot be stopped
    timeout_s: float | None = Field(600.0, gt=0)


class ParallelSection(Section):
    """How processes share work beyond data parallelism (``vgrpo_platform/parallel/context_parallel.py``)."""

    # processes that share each sample's tokens (diffusers' context parallelism; video): the launch's
    # processes form groups of this many, each group one data-parallel rank; 1 = off
    context: int = Field(1, ge=1)
    # how a group splits attention: "ulysses" (heads exchanged all-to-all; heads % context == 0) or
    # "ring" (key/value blocks passed round; needs an attention backend that returns the log-sum-exp)
    context_split: Literal["ulysses", "ring"] = "ulysses"


# The metric names an evaluation adds for [eval.monitor] to watch (written by training/observe/evaluation.py):
DIVERSITY = "monitor/diversity"  # each prompt's sample diversity, averaged over the prompts
EVAL_ONLY_TOTAL = "monitor/reward"  # the weighted sum of the [[eval.rewards]]


class MonitorSection(Section):
    """The reward-hacking stop rule (``training.monitor``): the run stops with a checkpoint when
    ``rising`` is above its value at a watched metric's best evaluation while that metric is more than
    ``margin`` below its best, at ``patience`` evaluations in a row."""

    stop_when_falls: list[str] = Field(default_factory=list)  # eval-record keys; empty = the rule is off
    margin: float = Field(0.02, ge=0)  # in the watched metric's own units
    patience: int = Field(2, ge=1)  # consecutive evaluations
    rising: str = "reward"  # the evaluation's key that stands for the training reward


class EvalSection(Section):
    every: int = Field(10, ge=0)  # iterations between evaluations; 0 = only before and after
    samples_per_prompt: int = Field(2, ge=1)
    max_prompts: int = Field(16, ge=1)
    seed: int = 1234
    sampler: Literal["euler", "dpmsolver++", "unipc"] | None = None  # None = the rollout's
    steps: int | None = None
    # scored at every evaluation (and by `vgrpo eval`) as their own keys, never trained on
    rewards: list[RewardRef] = Field(default_factory=list)
    monitor: MonitorSection = Field(default_factory=MonitorSection)


class LogSection(Section):
    progress: Literal["auto", "rich", "plain", "none"] = "auto"
    # experiment trackers through accelerate's tracking API (training.observe.tracking); [] = none
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=list)
    project: str = "vgrpo"  # the tracker's project (W&B project, MLflow experiment, TensorBoard folder)
    checkpoint_every: int = Field(10, ge=0)  # iterations; 0 = only at the end
    keep_last: int = Field(3, ge=1)
    save_grids: bool = True
    diagnostics_every: int = Field(10, ge=0)  # iterations between surrogate diagnostics (diag/*); 0 = off


class Recipe(Section):
    """A whole experiment."""

    run: RunSection = Field(default_factory=RunSection)
    adapter: ComponentRef
    rewards: list[RewardRef] = Field(min_length=1)
    surrogate: SurrogateRef = Field(default_factory=SurrogateRef)
    prompts: PromptsSection = Field(default_factory=PromptsSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    scoring: ScoringSection = Field(default_factory=ScoringSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    log: LogSection = Field(default_factory=LogSection)
