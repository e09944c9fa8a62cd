"""Real-size throughput of V-GRPO and Flow-GRPO on FLUX.1-dev, SD 3.5 Medium, Qwen-Image and Wan 2.1 1.3B.

    python -m benchmarks.throughput flux wan --device cuda --dtype bf16 --out benchmarks/results/t.md
    python -m benchmarks.throughput --tiny                    # every model at toy size on the CPU, seconds
    python -m benchmarks.throughput --merge rows/*.json --out table.md     # one table from row files

Each row builds the model's transformer from its published config with **random weights**; the text
encoders and the VAE are not built (random embeddings of their output shapes stand in, decoding is not
timed), so the figures are the transformer's alone (``throughput_models.py``). One row is one setting:
method (``vgrpo`` with N_MC 4, ``flow_grpo`` as ``benchmarks.compare`` runs it), LoRA or full
fine-tuning, gradient checkpointing, ``torch.compile`` (diffusers' regional compilation of the repeated
blocks where the model has them). The same batch, sampler steps and micro-batch for both methods.

What is timed, after one untimed warm-up iteration (which also compiles):

- **rollout**: the training rollout of the method: the adapter's Euler ODE sampler for V-GRPO
  (``adapter.sample``), the surrogate's own SDE rollout with log-probs for Flow-GRPO; samples / second.
  ``--rollout cached`` runs V-GRPO's through the ``cached`` rollout backend (diffusers' TaylorSeer cache
  with the options ``benchmarks.rollout_backends --probe`` chose), as a recipe's
  ``rollout.backend = "cached"`` does; Flow-GRPO samples its own SDE and has no cached row.
- **train**: ``surrogate.prepare`` (Flow-GRPO: the reference policy's forwards for its KL) plus one
  optimiser step over the batch in micro-batches, as ``Trainer.update`` does it: ``surrogate.loss``
  under autocast, ``backward``, gradient clipping at 1.0, AdamW. The loss code is the shipped surrogates'.
- **peak GB**: ``torch.cuda.max_memory_allocated`` during the rollout and during training.
- **MFU**: the FLOPs of the training phase's network calls over its seconds and the device's dense
  bf16 peak. FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` on a meta-device copy of
  the same model (LoRA included, no memory used): one forward, and one forward + backward, per sample,
  times the calls the phase made. Model FLOPs: checkpointing's recomputation is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import math
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import throughput_models as models

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' datasheets; matched as a
# substring of torch.cuda.get_device_name(), first match wins (so the PCIe / NVL variants come first).
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
]
NOT_BUILT = (
    "Random weights from the published configs; text encoders and VAE NOT built (random embeddings of "
    "their output shapes; no decoding): transformer-only figures."
)
METHODS = ("vgrpo", "flow_grpo")
ROLLOUTS = ("in_process", "cached")


def peak_tflops(device_name: str) -> float | None:
    """The device's dense bf16 peak, or ``None`` when the table does not know it (the CPU)."""
    for needle, tflops in PEAK_BF16_TFLOPS:
        if needle.lower() in device_name.lower():
            return tflops
    return None


@dataclass
class Setting:
    """One row's knobs."""

    model: str
    method: str
    finetune: str = "lora"  # "lora" | "full"
    checkpointing: bool = True
    compile: bool = False
    dtype: str = "bf16"
    batch: int = 4
    micro_batch: int = 1
    steps: int = 10
    lora_rank: int = 32
    size: dict[str, int] = field(default_factory=dict)
    rollout: str = "in_process"  # the rollout backend: "in_process" | "cached"


@dataclass
class Row:
    """One row of the table; numbers are ``None`` when the row failed."""

    setting: Setting
    status: str = "ok"
    shape: str = ""
    params_b: float | None = None
    trainable_m: float | None = None
    rollout_samples_s: float | None = None
    train_s: float | None = None
    iteration_s: float | None = None
    rollout_gb: float | None = None
    train_gb: float | None = None
    train_tflop: float | None = None
    train_calls: str = ""
    mfu: float | None = None
    rollout_mfu: float | None = None
    warmup_s: float | None = None
    device: str = ""


# ------------------------------------------------------------------------------------ the methods
def build_surrogate(method: str) -> Any:
    """The shipped surrogate with ``benchmarks.compare``'s options for the method."""
    from vgrpo_platform.algo.surrogates.configs import FlowGRPOConfig, VGRPOConfig

    if method == "vgrpo":
        from vgrpo_platform.algo.surrogates.vgrpo import VGRPOSurrogate

        surrogate = VGRPOSurrogate(VGRPOConfig(n_mc=4))
    elif method == "flow_grpo":
        from vgrpo_platform.algo.surrogates.flow_grpo import FlowGRPOSurrogate

        surrogate = FlowGRPOSurrogate(FlowGRPOConfig(kl_include_dt=False, train_last_step=False))
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    plan = getattr(surrogate, "plan_updates", None)
    if plan is not None:
        plan(1)  # one optimiser step per rollout, the trainer's default
    return surrogate


class CallLog:
    """Rows through every forward of ``adapter``'s denoiser, split by whether autograd is on: a forward
    pre-hook on the module (the core makes every call, so none goes around it)."""

    def __init__(self, adapter: Any) -> None:
        self.grad_rows = 0
        self.nograd_rows = 0
        self.handle = adapter.denoiser.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: Any, args: Any, kwargs: Any) -> None:
        import torch

        first = next(v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor))
        if torch.is_grad_enabled():
            self.grad_rows += int(first.shape[0])
        else:
            self.nograd_rows += int(first.shape[0])

    def close(self) -> None:
        self.handle.remove()


# --------------------------------------------------------------------------------- measuring a row
def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gb(device: Any, reset: bool = False) -> float | None:
    import torch

    if torch.device(device).type != "cuda":
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def make_trainable(adapter: Any, setting: Setting) -> list[Any]:
    """LoRA (the adapter's default targets, rank = alpha) or every weight, as the trainer does it."""
    from vgrpo_platform import finetune

    if setting.finetune == "lora":
        rank = setting.lora_rank
        return finetune.attach_lora(
            adapter.denoiser, rank=rank, alpha=rank, target_modules=list(adapter.lora_target_modules)
        )
    adapter.denoiser.requires_grad_(True)  # no CPU reference copy: the harness's Flow-GRPO KL uses
    return list(adapter.denoiser.parameters())  # reference_mode, which then sees the current weights


def count_flops(spec: models.ModelSpec, setting: Setting, tiny: bool) -> tuple[float, float]:
    """``(forward, forward + backward)`` FLOPs per sample, counted on a meta-device copy."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    dtype = _dtype(setting.dtype)
    adapter = models.build_adapter(spec, tiny=tiny, device="meta", dtype=dtype, size=setting.size)
    make_trainable(adapter, setting)
    cond = adapter.encode_prompts(["a prompt"])
    z = torch.randn(1, *adapter.latent_shape(), device="meta", dtype=dtype)
    t = torch.full((1,), 0.5, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as forward:
        adapter.predict(z, t, cond)
    with FlopCounterMode(display=False) as both:
        adapter.predict(z, t, cond).float().square().mean().backward()
    return float(forward.get_total_flops()), float(both.get_total_flops())


def cached_flops(
    spec: models.ModelSpec, setting: Setting, tiny: bool, cache: str | None
) -> tuple[float, float]:
    """``count_flops``, kept in a JSON file when ``cache`` names one: the count does not depend on the
    device, method, compilation or checkpointing, and on a real-size model it takes tens of seconds
    that a timed device run should not spend once per row."""
    key = json.dumps(
        [spec.key, tiny, setting.finetune, setting.lora_rank, setting.dtype, sorted(setting.size.items())]
    )
    path = Path(cache) if cache else None
    known = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    if key not in known:
        known[key] = count_flops(spec, setting, tiny)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(known, indent=1))
    forward, both = known[key]
    return float(forward), float(both)


def _dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def _compile(denoiser: Any) -> None:
    """Regional compilation (each repeated block once) where diffusers offers it, else the whole module."""
    import torch

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if getattr(denoiser, "_repeated_blocks", None) and hasattr(denoiser, "compile_repeated_blocks"):
        denoiser.compile_repeated_blocks()
    else:
        denoiser.compile()


def _autocast(device: Any, dtype_name: str) -> contextlib.AbstractContextManager[None]:
    import torch

    if dtype_name == "bf16" and torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)  # run.mixed_precision = "bf16"
    return contextlib.nullcontext()


def one_iteration(
    adapter: Any, surrogate: Any, optimizer: Any, params: list[Any], setting: Setting, seed: int
) -> dict[str, Any]:
    """Rollout, then ``prepare`` + one optimiser step; seconds, peaks and call counts of both phases."""
    import torch

    from vgrpo_platform.protocols import RolloutBatch, SamplerSpec

    device = adapter.device
    generator = torch.Generator().manual_seed(seed)
    b = setting.batch
    prompts = ["a benchmark prompt"] * b  # one group of b samples
    cond = adapter.encode_prompts(prompts)
    noise = torch.randn((b, *adapter.latent_shape()), generator=generator).to(device, adapter.dtype)
    sampler = SamplerSpec("euler", setting.steps)
    if surrogate.owns_rollout and setting.rollout != "in_process":
        raise ValueError(f"{setting.method} samples its own SDE rollout: no {setting.rollout!r} backend")
    log = CallLog(adapter)
    _sync(device)
    _peak_gb(device, reset=True)
    t0 = time.perf_counter()
    with _autocast(device, setting.dtype):
        if surrogate.owns_rollout:  # every SurrogateBase has rollout(); only these sample with it
            latents, state = surrogate.rollout(adapter, noise, cond, sampler, generator)
        else:
            latents, state = rollout_backend(adapter, setting).sample_chunk(noise, cond, sampler), None
    _sync(device)
    t1 = time.perf_counter()
    rollout_gb = _peak_gb(device)
    _peak_gb(device, reset=True)
    log.grad_rows = log.nograd_rows = 0
    batch = RolloutBatch(
        prompts=prompts,
        group_ids=torch.zeros(b, dtype=torch.long, device=device),
        cond=cond,
        latents=latents,
        rewards=torch.randn(b, generator=generator).to(device),
        advantages=torch.randn(b, generator=generator).to(device),
        state=state,
    )
    with _autocast(device, setting.dtype):
        with adapter.network.rows_at_most(setting.micro_batch):
            surrogate.prepare(batch, adapter, generator)
    optimizer.zero_grad(set_to_none=True)
    for micro in torch.arange(b).split(setting.micro_batch):
        part = batch.select(micro.to(device))
        with _autocast(device, setting.dtype):
            loss, _ = surrogate.loss(part, adapter)
        (loss * (len(micro) / b)).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    _sync(device)
    t2 = time.perf_counter()
    log.close()
    return {
        "rollout_s": t1 - t0,
        "train_s": t2 - t1,
        "rollout_gb": rollout_gb,
        "train_gb": _peak_gb(device),
        "grad_rows": log.grad_rows,
        "nograd_rows": log.nograd_rows,
    }


def rollout_backend(adapter: Any, setting: Setting) -> Any:
    """The shipped backend the recipe's ``rollout.backend`` names, started on ``adapter``: the cached
    one with the probed TaylorSeer setting (its ``DEFAULT_OPTIONS``), so the row times the recipe's code."""
    from vgrpo_platform.rollout_backends.cached import CachedBackend
    from vgrpo_platform.rollout_backends.in_process import InProcessBackend

    if setting.rollout not in ROLLOUTS:
        raise ValueError(f"unknown rollout backend {setting.rollout!r}; expected one of {ROLLOUTS}")
    backend = CachedBackend("taylorseer") if setting.rollout == "cached" else InProcessBackend()
    backend.start(adapter, {})
    return backend


def _shape(adapter: Any, spec: models.ModelSpec, setting: Setting) -> str:
    latent = "x".join(str(d) for d in adapter.latent_shape())
    return f"{setting.batch}/{setting.micro_batch}/{setting.steps} [{latent}]"


def measure(
    setting: Setting,
    *,
    tiny: bool,
    device: str,
    repeat: int = 1,
    peak: float | None = None,
    flops_cache: str | None = None,
) -> Row:
    """Build, warm up and time one row; an out-of-memory or other failure becomes the row's status."""
    import torch

    spec = models.SPECS[setting.model]
    row = Row(setting=setting)
    row.device = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"
    peak = peak if peak is not None else peak_tflops(row.device)
    adapter = optimizer = None
    try:
        fwd, fwd_bwd = cached_flops(spec, setting, tiny, flops_cache)
        adapter = models.build_adapter(
            spec, tiny=tiny, device=device, dtype=_dtype(setting.dtype), size=setting.size
        )
        row.shape = _shape(adapter, spec, setting)
        row.params_b = sum(p.numel() for p in adapter.denoiser.parameters()) / 1e9
        if setting.checkpointing:
            adapter.denoiser.enable_gradient_checkpointing()
        params = make_trainable(adapter, setting)
        adapter.denoiser.train()
        row.trainable_m = sum(p.numel() for p in params) / 1e6
        if setting.compile:
            _compile(adapter.denoiser)
        optimizer = torch.optim.AdamW(params, lr=1e-5)
        surrogate = build_surrogate(setting.method)
        t0 = time.perf_counter()
        one_iteration(adapter, surrogate, optimizer, params, setting, seed=0)
        row.warmup_s = time.perf_counter() - t0
        runs = [
            one_iteration(adapter, surrogate, optimizer, params, setting, seed=1 + i) for i in range(repeat)
        ]
    except torch.cuda.OutOfMemoryError:
        row.status = "OOM"
        return row
    except Exception as exc:
        row.status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        return row
    finally:
        del adapter, optimizer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        torch._dynamo.reset()
    rollout_s = statistics.median(r["rollout_s"] for r in runs)
    row.train_s = statistics.median(r["train_s"] for r in runs)
    row.rollout_samples_s = setting.batch / rollout_s
    row.iteration_s = rollout_s + row.train_s
    last = runs[-1]
    row.rollout_gb, row.train_gb = last["rollout_gb"], last["train_gb"]
    flops = last["grad_rows"] * fwd_bwd + last["nograd_rows"] * fwd
    row.train_tflop = flops / 1e12
    b = setting.batch
    row.train_calls = f"{last['grad_rows'] / b:g}+{last['nograd_rows'] / b:g}"
    if peak:
        row.mfu = flops / row.train_s / (peak * 1e12)
        row.rollout_mfu = setting.steps * b * fwd / rollout_s / (peak * 1e12)
    return row


# ------------------------------------------------------------------------------------------ output
COLUMNS = [
    ("model", lambda r: models.SPECS[r.setting.model].title),
    ("method", lambda r: r.setting.method),
    ("tune", lambda r: r.setting.finetune),
    ("ckpt", lambda r: "on" if r.setting.checkpointing else "off"),
    ("compile", lambda r: "on" if r.setting.compile else "off"),
    ("dtype", lambda r: r.setting.dtype),
    ("rollout", lambda r: r.setting.rollout),
    ("B/mb/steps [latent]", lambda r: r.shape),
    ("status", lambda r: r.status),
    ("rollout samp/s", lambda r: _f(r.rollout_samples_s, ".3g")),
    ("train s", lambda r: _f(r.train_s, ".3g")),
    ("iter s", lambda r: _f(r.iteration_s, ".3g")),
    ("rollout GB", lambda r: _f(r.rollout_gb, ".1f")),
    ("train GB", lambda r: _f(r.train_gb, ".1f")),
    ("train TFLOP", lambda r: _f(r.train_tflop, ".4g")),
    ("fwd/sample grad+nograd", lambda r: r.train_calls or "-"),
    ("MFU %", lambda r: _f(None if r.mfu is None else 100 * r.mfu, ".1f")),
    ("rollout MFU %", lambda r: _f(None if r.rollout_mfu is None else 100 * r.rollout_mfu, ".1f")),
    ("warmup s", lambda r: _f(r.warmup_s, ".3g")),
]


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def cells(rows: Sequence[Row]) -> list[list[str]]:
    return [[fn(r) for _, fn in COLUMNS] for r in rows]


def _header(rows: Sequence[Row]) -> str:
    devices = sorted({r.device for r in rows if r.device}) or ["?"]
    return f"Device: {', '.join(devices)}. {NOT_BUILT}"


def to_markdown(rows: Sequence[Row]) -> str:
    head = [name for name, _ in COLUMNS]
    lines = [_header(rows), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c) + " |" for c in cells(rows)]
    return "\n".join(lines) + "\n"


def to_json(rows: Sequence[Row]) -> str:
    return json.dumps({"note": NOT_BUILT, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"


def print_table(rows: Sequence[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="V-GRPO vs Flow-GRPO throughput", caption=_header(rows))
    for name, _ in COLUMNS:
        table.add_column(name, overflow="fold")
    for c in cells(rows):
        table.add_row(*c)
    Console(width=240).print(table)


def write(rows: Sequence[Row], paths: Sequence[str]) -> None:
    for path in paths:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(to_json(rows) if p.suffix == ".json" else to_markdown(rows))


def row_from(entry: dict[str, Any]) -> Row:
    """A row back from its ``asdict`` form (a record without the later ``rollout`` key is in-process)."""
    entry = dict(entry)
    return Row(setting=Setting(**entry.pop("setting")), **entry)


def load_rows(paths: Sequence[str]) -> list[Row]:
    """Rows back from ``--out x.json`` files (``--merge``); a file may hold any number of rows."""
    return [row_from(entry) for path in paths for entry in json.loads(Path(path).read_text())["rows"]]


# --------------------------------------------------------------------------------------------- CLI
def settings_from(args: argparse.Namespace) -> list[Setting]:
    models_ = args.models or (list(models.SPECS) if args.tiny else [])
    if not models_:
        raise SystemExit("name at least one MODEL (flux, sd3, qwen_image, wan) or pass --tiny")
    size = {k: v for k, v in (("resolution", args.resolution), ("frames", args.frames)) if v is not None}
    if args.height is not None:
        size["height"] = args.height
    if args.width is not None:
        size["width"] = args.width
    out = []
    for model, method, tune, ckpt, comp, rollout in itertools.product(
        models_, args.methods, args.finetune, args.checkpointing, args.compile, args.rollout
    ):
        out.append(
            Setting(
                model=model,
                method=method,
                finetune=tune,
                checkpointing=ckpt == "on",
                compile=comp == "on",
                dtype=args.dtype or ("fp32" if args.tiny else "bf16"),
                batch=args.batch,
                micro_batch=args.micro_batch or (2 if args.tiny else 1),
                steps=args.steps or (4 if args.tiny else 10),
                lora_rank=args.lora_rank or (4 if args.tiny else 32),
                size=dict(size),
                rollout=rollout,
            )
        )
    return out


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "models", nargs="*", choices=[[], *models.SPECS], metavar="MODEL", help=", ".join(models.SPECS)
    )
    p.add_argument(
        "--tiny", action="store_true", help="toy-size configs (CPU smoke run); all models by default"
    )
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 (fp32 with --tiny)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--finetune", nargs="+", choices=["lora", "full"], default=["lora"])
    p.add_argument("--checkpointing", nargs="+", choices=["on", "off"], default=["on"])
    p.add_argument("--compile", nargs="+", choices=["off", "on"], default=["off"])
    p.add_argument(
        "--rollout", nargs="+", choices=ROLLOUTS, default=["in_process"], help="V-GRPO's rollout backend"
    )
    p.add_argument("--batch", type=int, default=4, help="samples per rollout (one prompt group)")
    p.add_argument(
        "--micro-batch", type=int, default=None, help="rows per training forward (default 1; tiny 2)"
    )
    p.add_argument(
        "--steps", type=int, default=None, help="sampler steps for both methods (default 10; tiny 4)"
    )
    p.add_argument("--lora-rank", type=int, default=None, help="default 32 (tiny 4); alpha = rank")
    p.add_argument("--resolution", type=int, default=None, help="image side (default 512)")
    p.add_argument("--height", type=int, default=None, help="Wan frame height (default 480)")
    p.add_argument("--width", type=int, default=None, help="Wan frame width (default 832)")
    p.add_argument("--frames", type=int, default=None, help="Wan frames, 4k + 1 (default 33)")
    p.add_argument("--repeat", type=int, default=1, help="timed iterations per row (the median is reported)")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 peak for MFU")
    p.add_argument(
        "--flops-cache", default=None, metavar="JSON", help="keep the FLOP counts in this file (gpu_check.sh)"
    )
    p.add_argument("--out", nargs="+", default=[], help="write the table: *.md (Markdown) or *.json")
    p.add_argument(
        "--merge", nargs="+", default=None, metavar="JSON", help="only print/write rows from files"
    )
    p.add_argument(
        "--placeholder",
        default=None,
        metavar="STATUS",
        help="run nothing: the rows with this status (gpu_check.sh)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Run (or merge) the rows, print one table, write ``--out``; returns the rows."""
    args = parse(argv)
    if args.merge is not None:
        rows = load_rows(args.merge)
    elif args.placeholder is not None:
        rows = [Row(setting=setting, status=args.placeholder) for setting in settings_from(args)]
    else:
        import torch
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.set_verbosity_error()  # "modules to keep in float32" notes of from_config
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.utils.checkpoint")
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        print(NOT_BUILT, flush=True)
        rows = []
        for setting in settings_from(args):
            rows.append(
                measure(
                    setting,
                    tiny=args.tiny,
                    device=device,
                    repeat=args.repeat,
                    peak=args.peak_tflops,
                    flops_cache=args.flops_cache,
                )
            )
            r = rows[-1]
            print(
                f"{r.setting.model} {r.setting.method}: {r.status} train {_f(r.train_s, '.3g')} s", flush=True
            )
    print_table(rows)
    write(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
