"""The conformance kit: pytest helpers that tell a plugin author whether an adapter or reward keeps the
contract of ``vgrpo_platform.protocols``.

Call them from your plugin's own tests::

    from vgrpo_platform.testing import check_adapter, check_reward

    def test_my_adapter_conforms():
        check_adapter(build, config=Config(), entry_module="my_plugin")

Each function runs a list of named checks (``ADAPTER_CHECKS``, ``REWARD_CHECKS``), keeps going after a
failure, and raises one ``AssertionError`` naming every failed check and why. On success it returns a
``ConformanceReport`` (which checks passed, which were skipped and why). The checks run on tiny
batches on ``context.device``; build your component tiny for them (a small config, random weights).

Why each check exists: the core indexes conditioning batch-first, compares predictions of the same
weights across rollout and update (so ``predict`` must be deterministic and batch-independent),
trains only what LoRA or the denoiser exposes, evaluates the frozen reference by switching LoRA off,
stores old-policy statistics once per iteration, and lists plugins without importing torch.

This module imports torch lazily, so importing it costs nothing; ``fresh_venv`` (an environment to
``pip install -e`` a plugin into) needs no torch at all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import traceback
import venv
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEAVY_MODULES = ("torch", "diffusers", "transformers")
"""What an entry module must not import: ``vgrpo plugins`` and ``vgrpo check`` stay fast without them."""

ADAPTER_CHECKS = (
    "entry_module_cheap",
    "config_rejects_unknown_keys",
    "attributes",
    "latent_shape",
    "schedule",
    "encode_prompts",
    "predict",
    "predict_deterministic",
    "predict_batch_independent",
    "build_deterministic",
    "sample",
    "sample_deterministic",
    "decode",
    "gradients_full",
    "gradients_lora",
    "reference_frozen",
    "old_policy_frozen",
)
REWARD_CHECKS = (
    "entry_module_cheap",
    "config_rejects_unknown_keys",
    "attributes",
    "score",
    "score_deterministic",
    "batch_consistent",
    "responds_to_input",
    "input_unchanged",
)

DEFAULT_PROMPTS = ("a red circle", "a blue square", "a green triangle")
"""Plain prompts (also valid in the built-in shapes world); pass ``prompts=`` for other grammars."""

MODALITY_RANGES = {"image": (0.0, 1.0), "video": (0.0, 1.0), "audio": (-1.0, 1.0)}
"""The value ranges ``protocols.Samples`` documents for the modalities the core knows."""

MODALITY_NDIM = {"image": 4, "video": 5, "audio": 3}  # [B, 3, H, W], [B, F, 3, H, W], [B, C, S]


@dataclass
class ConformanceReport:
    """What a conformance run did: checks that passed and checks skipped (name -> reason)."""

    kind: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class _Run:
    """Runs named checks in order, records failures and lets later checks see what earlier ones built."""

    def __init__(self, kind: str, label: str, only: Iterable[str] | None, known: Sequence[str]) -> None:
        self.kind, self.label = kind, label
        self.only = None if only is None else set(only)
        if self.only is not None and (unknown := self.only - set(known)):
            raise ValueError(f"unknown {kind} check(s) {sorted(unknown)}; known: {', '.join(known)}")
        self.report = ConformanceReport(kind)
        self.failures: dict[str, str] = {}

    def __call__(self, name: str, fn: Callable[[], str | None], *, needs: Sequence[str] = ()) -> None:
        if self.only is not None and name not in self.only:
            return
        blocked = [n for n in needs if n in self.failures]
        if blocked:
            self.failures[name] = f"not run: needs {', '.join(blocked)}"
            return
        try:
            skip = fn()
        except AssertionError as exc:
            self.failures[name] = str(exc) or "assertion failed"
            return
        except Exception as exc:  # the plugin raised: report where, not just that
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
            self.failures[name] = f"raised {type(exc).__name__}: {exc}{where}"
            return
        if skip:
            self.report.skipped[name] = skip
        else:
            self.report.passed.append(name)

    def finish(self) -> ConformanceReport:
        if self.failures:
            lines = [f"{self.kind} {self.label} failed {len(self.failures)} conformance check(s):"]
            lines += [f"  [{name}] {why}" for name, why in self.failures.items()]
            if self.report.passed:
                lines.append(f"  passed: {', '.join(self.report.passed)}")
            raise AssertionError("\n".join(lines))
        return self.report


# ------------------------------------------------------------------------------------------ shared checks


def check_entry_module_cheap(module: str, heavy: Sequence[str] = HEAVY_MODULES) -> None:
    """Import ``module`` in a fresh interpreter and assert none of ``heavy`` got imported with it."""
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps([m for m in {list(heavy)!r} if m in sys.modules]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"importing {module} failed: {proc.stderr.strip().splitlines()[-1:]}"
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not loaded, (
        f"importing the entry module {module} imports {', '.join(loaded)}; import heavy libraries inside the "
        "factory (e.g. `from .impl import Thing` in the function body), not at module level"
    )


def check_config_rejects_unknown_keys(config: Any) -> None:
    """``config`` (a ``PluginConfig`` class or instance) refuses a misspelt key instead of ignoring it."""
    from pydantic import ValidationError

    from vgrpo_platform.registry import PluginConfig

    cls = config if isinstance(config, type) else type(config)
    assert issubclass(cls, PluginConfig), (
        f"{cls.__name__} must derive from vgrpo_platform.registry.PluginConfig (it forbids unknown keys)"
    )
    base = config.model_dump() if not isinstance(config, type) else {}
    key = "vgrpo_conformance_unknown_key"
    try:
        cls.model_validate({**base, key: 1})
    except ValidationError as exc:
        kinds = {(e["type"], tuple(e["loc"])) for e in exc.errors()}
        assert ("extra_forbidden", (key,)) in kinds, (
            f"{cls.__name__} failed to validate for another reason than the unknown key: {exc}"
        )
        return
    raise AssertionError(f"{cls.__name__} accepted the unknown key {key!r}; keep model_config extra='forbid'")


def _entry_module_of(factory: Any, entry_module: str | None) -> str | None:
    if entry_module is not None:
        return entry_module
    module = getattr(factory, "__module__", None)
    return module if isinstance(module, str) and not module.endswith(".impl") else None


def _config_instance(config: Any) -> Any:
    """A config instance from an instance, a class (its defaults) or None."""
    if config is None or not isinstance(config, type):
        return config
    return config()


def _is_factory(target: Any, attribute: str) -> bool:
    return callable(target) and not hasattr(target, attribute)


# ------------------------------------------------------------------------------------------ adapters


def check_adapter(
    adapter: Any,
    config: Any = None,
    context: Any = None,
    *,
    entry_module: str | None = None,
    prompts: Sequence[str] = DEFAULT_PROMPTS[:2],
    sampler: Any = None,
    checks: Iterable[str] | None = None,
    atol: float = 1e-5,
    label: str | None = None,
) -> ConformanceReport:
    """Check an adapter against ``protocols.Adapter``; raise ``AssertionError`` listing what fails.

    ``adapter`` is a factory ``factory(config, context)`` (preferred: the kit builds fresh instances and
    can check that building is deterministic) or a built adapter. The adapter is modified: LoRA is
    attached to its denoiser. ``config`` is the factory's ``PluginConfig`` instance (or class, for its
    defaults); ``context`` a ``protocols.BuildContext`` (default: CPU, float32, seed 0).
    ``entry_module`` is the module your entry point names; default: the factory's module. ``checks``
    restricts the run to some names of ``ADAPTER_CHECKS``; ``atol`` is the tolerance of equalities.
    """
    import torch

    from vgrpo_platform.protocols import BuildContext, SamplerSpec

    context = context if context is not None else BuildContext()
    sampler = sampler if sampler is not None else SamplerSpec("euler", 2)
    config = _config_instance(config)
    is_factory = _is_factory(adapter, "denoiser")
    run = _Run("adapter", label or _label(adapter), checks, ADAPTER_CHECKS)
    state: dict[str, Any] = {}
    module = _entry_module_of(adapter, entry_module) if is_factory else entry_module

    run("entry_module_cheap", lambda: _cheap(module))
    run("config_rejects_unknown_keys", lambda: _config_check(config))

    def build() -> Any:
        if not is_factory:
            return adapter
        assert config is not None, "pass config= (the factory's PluginConfig) with a factory"
        return adapter(config, context)

    def first() -> None:
        state["adapter"] = build()

    run("attributes", lambda: (first(), _adapter_attributes(state["adapter"], config))[1])
    a = state.get("adapter")
    if a is None:  # nothing else can run
        return run.finish()
    device = torch.device(context.device) if context.device is not None else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(context.seed)
    group = 2  # the core repeats each prompt's conditioning group_size times
    batch = len(prompts) * group

    def inputs() -> None:
        shape = tuple(a.latent_shape())
        state["shape"] = shape
        state["noise"] = torch.randn((batch, *shape), generator=gen).to(device)  # [B, *L]
        state["x0"] = torch.randn((batch, *shape), generator=gen).clamp(-1, 1).to(device)  # [B, *L]
        state["t"] = torch.rand(batch, generator=gen).mul(0.9).add(0.05).to(device)  # [B] in (0, 1)

    run("latent_shape", lambda: (_latent_shape(a), inputs())[1], needs=["attributes"])
    run("schedule", lambda: _schedule(a, state, atol), needs=["latent_shape"])
    run("encode_prompts", lambda: _encode(a, prompts, group, state), needs=["attributes"])
    need_io = ["latent_shape", "schedule", "encode_prompts"]
    run("predict", lambda: _predict(a, state), needs=need_io)
    run("predict_deterministic", lambda: _predict_deterministic(a, state, atol), needs=["predict"])
    run("predict_batch_independent", lambda: _predict_batch(a, state, atol), needs=["predict"])
    run(
        "build_deterministic",
        lambda: _build_deterministic(build, a, state, atol, is_factory),
        needs=["predict"],
    )
    run("sample", lambda: _sample(a, state, sampler), needs=need_io)
    run("sample_deterministic", lambda: _sample_deterministic(a, state, sampler, atol), needs=["sample"])
    run("decode", lambda: _decode(a, state), needs=["sample"])
    run("gradients_full", lambda: _gradients_full(a, state), needs=["predict"])
    run("gradients_lora", lambda: _gradients_lora(a, state), needs=["predict"])
    run("reference_frozen", lambda: _reference(a, state, atol), needs=["gradients_lora"])
    run("old_policy_frozen", lambda: _old_policy(a, state, atol), needs=["gradients_lora"])
    return run.finish()


def _label(target: Any) -> str:
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return repr(name)


def _cheap(module: str | None) -> str | None:
    if module is None:
        return "no entry module known: pass entry_module='your_package'"
    check_entry_module_cheap(module)
    return None


def _config_check(config: Any) -> str | None:
    if config is None:
        return "no config given: pass config=YourConfig()"
    check_config_rejects_unknown_keys(config)
    return None


def _modules_of(adapter: Any) -> list[Any]:
    """Every ``nn.Module`` an adapter holds in its attributes, or in a pipeline's ``components``."""
    import torch

    found: list[Any] = []

    def visit(value: Any) -> None:
        if isinstance(value, torch.nn.Module):
            found.append(value)
        elif isinstance(value, Mapping):
            for v in value.values():
                visit(v)
        elif isinstance(value, list | tuple):
            for v in value:
                visit(v)
        elif hasattr(value, "components") and isinstance(value.components, Mapping):  # DiffusionPipeline
            for v in value.components.values():
                visit(v)

    for value in vars(adapter).values():
        visit(value)
    return found


def _frozen_parameters(adapter: Any) -> dict[str, Any]:
    """Parameters the adapter holds outside ``denoiser`` (text encoders, VAEs...): never trained."""
    inside = {id(p) for p in adapter.denoiser.parameters()}
    out: dict[str, Any] = {}
    for module in _modules_of(adapter):
        for name, p in module.named_parameters():
            if id(p) not in inside:
                out.setdefault(f"{type(module).__name__}.{name}", p)
    return out


def _adapter_attributes(adapter: Any, config: Any) -> None:
    import torch

    from vgrpo_platform.protocols import Adapter, NoiseSchedule

    missing = [
        n for n in ("modality", "denoiser", "lora_target_modules", "schedule") if not hasattr(adapter, n)
    ]
    assert not missing, f"the adapter lacks the attribute(s) {', '.join(missing)} of protocols.Adapter"
    assert isinstance(adapter, Adapter), "the adapter lacks a method of protocols.Adapter"
    assert isinstance(adapter.modality, str) and adapter.modality, "modality must be a non-empty string"
    declared = getattr(config, "modality", None)
    assert declared is None or declared == adapter.modality, (
        f"the Config declares modality {declared!r} but the adapter makes {adapter.modality!r}"
    )
    assert isinstance(adapter.denoiser, torch.nn.Module), "denoiser must be a torch.nn.Module"
    targets = adapter.lora_target_modules
    assert not isinstance(targets, str) and all(isinstance(t, str) for t in targets), (
        f"lora_target_modules must be a sequence of module names, got {targets!r}"
    )
    assert isinstance(adapter.schedule, NoiseSchedule), "schedule lacks noise / predict_x0 / warp"


def _latent_shape(adapter: Any) -> None:
    shape = adapter.latent_shape()
    assert isinstance(shape, tuple) and shape, f"latent_shape() must return a non-empty tuple, got {shape!r}"
    assert all(isinstance(d, int) and d > 0 for d in shape), f"latent_shape() must be positive ints: {shape}"


def _schedule(adapter: Any, state: dict[str, Any], atol: float) -> None:
    import torch

    s, x0, eps = adapter.schedule, state["x0"], state["noise"]
    b = x0.shape[0]
    at0 = s.noise(x0, eps, torch.zeros(b, device=x0.device))
    assert at0.shape == x0.shape, f"schedule.noise returned {tuple(at0.shape)} for x0 {tuple(x0.shape)}"
    assert torch.allclose(at0, x0, atol=1e-4), "schedule.noise at t=0 must return the clean sample x0"
    at1 = s.noise(x0, eps, torch.ones(b, device=x0.device))
    assert (at1 - eps).norm() < (at1 - x0).norm(), "schedule.noise at t=1 must be (close to) pure noise"
    u = torch.linspace(0, 1, 11)
    w = s.warp(u)
    assert w.shape == u.shape, f"schedule.warp changed the shape {tuple(u.shape)} -> {tuple(w.shape)}"
    assert abs(float(w[0])) < 1e-6 and abs(float(w[-1]) - 1) < 1e-6, "schedule.warp must fix 0 and 1"
    assert bool((w[1:] >= w[:-1]).all()), "schedule.warp must be monotone"
    x_hat = s.predict_x0(state["noise"], torch.zeros_like(x0), state["t"])
    assert x_hat.shape == x0.shape, f"schedule.predict_x0 returned {tuple(x_hat.shape)}"


def _encode(adapter: Any, prompts: Sequence[str], group: int, state: dict[str, Any]) -> None:
    import torch

    with torch.enable_grad():  # the protocol says "no gradient": the adapter must ensure it
        cond = adapter.encode_prompts(list(prompts))
    assert isinstance(cond, Mapping) and cond, "encode_prompts must return a non-empty dict of tensors"
    for key, value in cond.items():
        assert isinstance(value, torch.Tensor), (
            f"encode_prompts()[{key!r}] is {type(value).__name__}, not a tensor"
        )
        assert value.ndim >= 1 and value.shape[0] == len(prompts), (
            f"encode_prompts()[{key!r}] has shape {tuple(value.shape)}: it must be batch-first "
            f"[{len(prompts)}, ...] for {len(prompts)} prompts"
        )
        assert not value.requires_grad, (
            f"encode_prompts()[{key!r}] requires grad: encode under torch.no_grad()"
        )
    one = adapter.encode_prompts(list(prompts[:1]))
    for key, value in one.items():
        assert value.shape[0] == 1, f"encode_prompts of 1 prompt: [{key!r}] has batch {value.shape[0]}"
    state["prompts"], state["group"] = list(prompts), group
    state["cond"] = _repeat(cond, group)  # [B, ...]


def _repeat(cond: Mapping[str, Any], group: int) -> dict[str, Any]:
    """Each prompt's conditioning ``group`` times in a row, as the core builds a rollout batch."""
    return {k: v.repeat_interleave(group, dim=0) for k, v in cond.items()}


def _predict(adapter: Any, state: dict[str, Any]) -> None:
    import torch

    z_t = adapter.schedule.noise(state["x0"], state["noise"], state["t"])  # [B, *L]
    state["z_t"] = z_t
    with torch.no_grad():
        out = adapter.predict(z_t, state["t"], state["cond"])
    assert isinstance(out, torch.Tensor), f"predict returned {type(out).__name__}, not a tensor"
    assert out.shape == z_t.shape, f"predict returned {tuple(out.shape)} for z_t {tuple(z_t.shape)}"
    assert out.dtype == z_t.dtype, f"predict returned {out.dtype} for z_t of {z_t.dtype}"
    assert bool(torch.isfinite(out).all()), "predict returned non-finite values"
    state["pred"] = out


def _predict_deterministic(adapter: Any, state: dict[str, Any], atol: float) -> None:
    """The core compares old and new predictions of the same weights: they must agree in train mode."""
    import torch

    adapter.denoiser.train()
    with torch.no_grad():
        a = adapter.predict(state["z_t"], state["t"], state["cond"])
        b = adapter.predict(state["z_t"], state["t"], state["cond"])
    _close(a, b, atol, "predict called twice on the same input (train mode: dropout must be off)")


def _predict_batch(adapter: Any, state: dict[str, Any], atol: float) -> None:
    """Micro-batching must not change results: row i of a batch equals predicting row i alone."""
    import torch

    b = state["z_t"].shape[0]
    with torch.no_grad():
        full = adapter.predict(state["z_t"], state["t"], state["cond"])
        rows = [
            adapter.predict(
                state["z_t"][i : i + 1],
                state["t"][i : i + 1],
                {k: v[i : i + 1] for k, v in state["cond"].items()},
            )
            for i in (0, b - 1)
        ]
    _close(
        torch.cat([full[:1], full[-1:]]),
        torch.cat(rows),
        atol * 10,
        "predict of a batch vs. one sample at a time",
    )


def _build_deterministic(
    build: Callable[[], Any], adapter: Any, state: dict[str, Any], atol: float, is_factory: bool
) -> str | None:
    import torch

    if not is_factory:
        return "pass the factory instead of a built adapter to check it"
    other = build()
    with torch.no_grad():
        a = adapter.predict(state["z_t"], state["t"], state["cond"])
        cond = _repeat(other.encode_prompts(state["prompts"]), state["group"])
        b = other.predict(state["z_t"], state["t"], cond)
    del other
    _close(a, b, atol, "two adapters built from the same config and context.seed")
    return None


def _sample(adapter: Any, state: dict[str, Any], sampler: Any) -> None:
    import torch

    with torch.enable_grad():  # sample must not build a graph: rollouts are gradient-free
        out = adapter.sample(state["noise"], state["cond"], sampler)
    assert isinstance(out, torch.Tensor), f"sample returned {type(out).__name__}, not a tensor"
    assert out.shape == state["noise"].shape, (
        f"sample returned {tuple(out.shape)} for noise {tuple(state['noise'].shape)}"
    )
    assert not out.requires_grad, (
        "sample returned a tensor that requires grad: run the solver under torch.no_grad()"
    )
    assert bool(torch.isfinite(out).all()), "sample returned non-finite values"
    state["latents"] = out


def _sample_deterministic(adapter: Any, state: dict[str, Any], sampler: Any, atol: float) -> None:
    import torch

    again = adapter.sample(state["noise"].clone(), state["cond"], sampler)
    _close(state["latents"], again, atol * 10, "sample twice from the same noise")
    other = adapter.sample(torch.randn_like(state["noise"]), state["cond"], sampler)
    assert (other - state["latents"]).abs().max() > 1e-6, (
        "sample ignores its noise: different noise, same output"
    )


def _decode(adapter: Any, state: dict[str, Any]) -> None:

    from vgrpo_platform.protocols import Samples

    out = adapter.decode(state["latents"])
    assert isinstance(out, Samples), f"decode returned {type(out).__name__}, not protocols.Samples"
    assert out.modality == adapter.modality, (
        f"decode made {out.modality!r} samples, the adapter declares {adapter.modality!r}"
    )
    check_samples(out, batch=state["latents"].shape[0])


def check_samples(samples: Any, batch: int | None = None) -> None:
    """``samples`` is a ``protocols.Samples`` with the layout and value range its modality documents."""
    import torch

    data = samples.data
    assert isinstance(data, torch.Tensor), f"Samples.data is {type(data).__name__}, not a tensor"
    assert batch is None or data.shape[0] == batch, (
        f"Samples.data has batch {data.shape[0]}, expected {batch}"
    )
    assert data.is_floating_point(), f"Samples.data must be floating point, got {data.dtype}"
    assert bool(torch.isfinite(data).all()), "Samples.data has non-finite values"
    m = samples.modality
    if m in MODALITY_NDIM:
        layout = {"image": "[B, 3, H, W]", "video": "[B, F, 3, H, W]", "audio": "[B, channels, samples]"}[m]
        assert data.ndim == MODALITY_NDIM[m], f"{m} samples must be {layout}, got {tuple(data.shape)}"
        if m in ("image", "video"):
            assert data.shape[-3] == 3, (
                f"{m} samples must be {layout} (3 colour channels), got {tuple(data.shape)}"
            )
        lo, hi = MODALITY_RANGES[m]
        assert float(data.min()) >= lo - 1e-6 and float(data.max()) <= hi + 1e-6, (
            f"{m} samples must lie in [{lo}, {hi}], got [{float(data.min()):.4g}, {float(data.max()):.4g}]"
        )
    if m == "audio":
        assert samples.sample_rate, "audio samples must set sample_rate"
    if m == "video":
        assert samples.fps is None or samples.fps > 0, f"video fps must be positive, got {samples.fps}"


def _loss(adapter: Any, state: dict[str, Any]) -> Any:
    """A scalar of predict with random weights, so no symmetry can cancel a gradient."""
    import torch

    with torch.enable_grad():
        out = adapter.predict(state["z_t"], state["t"], state["cond"])
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        return (out * w).sum()


def _clear_grads(adapter: Any) -> None:
    for module in [adapter.denoiser, *_modules_of(adapter)]:
        for p in module.parameters():
            p.grad = None


def _frozen_leaks(adapter: Any) -> list[str]:
    return [n for n, p in _frozen_parameters(adapter).items() if p.grad is not None]


def _gradients_full(adapter: Any, state: dict[str, Any]) -> None:
    """Full fine-tuning: the denoiser's weights get gradients, nothing outside it does."""
    den = adapter.denoiser
    flags = {p: p.requires_grad for p in den.parameters()}
    den.requires_grad_(True)
    _clear_grads(adapter)
    try:
        _loss(adapter, state).backward()
        reached = [p for p in den.parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)]
        assert reached, (
            "no denoiser parameter gets a gradient from predict: is predict under no_grad or detached?"
        )
        leaks = _frozen_leaks(adapter)
        assert not leaks, (
            f"parameters outside the denoiser got gradients: {', '.join(leaks[:5])}"
            f"{' ...' if len(leaks) > 5 else ''}; freeze them (requires_grad_(False)), encode under no_grad"
        )
    finally:
        _clear_grads(adapter)
        for p, flag in flags.items():
            p.requires_grad_(flag)


def _gradients_lora(adapter: Any, state: dict[str, Any]) -> None:
    """LoRA on ``lora_target_modules``: its weights get gradients, the base and frozen parts none."""
    import torch

    from vgrpo_platform.finetune import attach_lora

    with torch.no_grad():
        state["base_pred"] = adapter.predict(state["z_t"], state["t"], state["cond"])
    params = attach_lora(adapter.denoiser, rank=2, alpha=4.0, target_modules=adapter.lora_target_modules)
    state["lora"] = {n: p for n, p in adapter.denoiser.named_parameters() if "lora_" in n}
    adapter.denoiser.train()
    with torch.no_grad():
        start = adapter.predict(state["z_t"], state["t"], state["cond"])
    _close(start, state["base_pred"], 1e-5, "predict right after attaching LoRA (B = 0) vs. the base model")
    _clear_grads(adapter)
    _loss(adapter, state).backward()
    unreached = [n for n, p in state["lora"].items() if p.grad is None]
    assert not unreached, (
        f"LoRA layers predict never uses (no gradient): {', '.join(unreached[:5])}; drop them from "
        "lora_target_modules"
    )
    assert any(bool(p.grad.abs().sum() > 0) for p in params), "every LoRA gradient is zero"
    base = [n for n, p in adapter.denoiser.named_parameters() if "lora_" not in n and p.grad is not None]
    assert not base, f"frozen base weights of the denoiser got gradients: {', '.join(base[:5])}"
    leaks = _frozen_leaks(adapter)
    assert not leaks, f"parameters outside the denoiser got gradients with LoRA: {', '.join(leaks[:5])}"
    _clear_grads(adapter)


def _perturb_lora(state: dict[str, Any], seed: int) -> None:
    """What an optimiser step does: change every LoRA weight in place."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in state["lora"].values():
            p.add_(torch.randn(p.shape, generator=g).to(p) * 0.1)


def _reference(adapter: Any, state: dict[str, Any], atol: float) -> None:
    """``finetune.reference_mode`` must give the base model back after LoRA has moved."""
    import torch

    from vgrpo_platform.finetune import reference_mode

    _perturb_lora(state, 2)
    z_t, t, cond = state["z_t"], state["t"], state["cond"]
    with torch.no_grad():
        moved = adapter.predict(z_t, t, cond)
        assert (moved - state["base_pred"]).abs().max() > 1e-6, (
            "changing the LoRA weights does not change predict"
        )
        with reference_mode(adapter):
            ref = adapter.predict(z_t, t, cond)
        after = adapter.predict(z_t, t, cond)
    _close(
        ref, state["base_pred"], atol * 10, "predict under reference_mode vs. the base model before training"
    )
    _close(after, moved, atol, "predict after leaving reference_mode vs. the trained policy")


def _old_policy(adapter: Any, state: dict[str, Any], atol: float) -> None:
    """Old-policy statistics are stored at rollout time: a later update must not change them."""
    import torch

    with torch.no_grad():
        old = adapter.predict(state["z_t"], state["t"], state["cond"])
    assert not old.requires_grad, "predict under torch.no_grad() returned a tensor that requires grad"
    kept = old.clone()
    _perturb_lora(state, 3)
    with torch.no_grad():
        new = adapter.predict(state["z_t"], state["t"], state["cond"])
    _close(old, kept, 0.0, "a stored old-policy prediction after an update (it aliases the weights)")
    assert (new - kept).abs().max() > 1e-6, "an update of the LoRA weights does not change predict"


def _close(a: Any, b: Any, atol: float, what: str) -> None:
    import torch

    assert a.shape == b.shape, f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}"
    diff = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    scale = float(b.float().abs().max()) if b.numel() else 0.0
    assert diff <= atol + 1e-4 * scale or (atol == 0.0 and torch.equal(a, b)), (
        f"{what}: max abs difference {diff:.3g} (tolerance {atol + 1e-4 * scale:.3g})"
    )


# ------------------------------------------------------------------------------------------ rewards


def example_samples(modality: str, batch: int = 6, seed: int = 0) -> Any:
    """Varied ``protocols.Samples`` of a known modality (flat colours, noise, halves), or None.

    Audio clips last 0.5 s (BS.1770 loudness needs one 0.4 s gating block) and every third one falls
    silent halfway, so level-based rewards (loudness, silence ratio) see different inputs too."""
    import torch

    from vgrpo_platform.protocols import Samples

    g = torch.Generator().manual_seed(seed)
    if modality in ("image", "video"):
        side = 32
        colours = torch.tensor(
            [[0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 1], [0, 1, 0], [1, 1, 0]], dtype=torch.float32
        )
        images = []
        for i in range(batch):
            kind = i % 8
            if kind < 4:  # flat colour
                img = colours[i % len(colours)].reshape(3, 1, 1).expand(3, side, side).clone()
            elif kind < 6:  # noise
                img = torch.rand((3, side, side), generator=g)
            else:  # two halves of different colours
                img = colours[2].reshape(3, 1, 1).expand(3, side, side).clone()
                img[:, :, side // 2 :] = colours[3 + (kind - 6)].reshape(3, 1)
            images.append(img)
        data = torch.stack(images)  # [B, 3, H, W]
        if modality == "image":
            return Samples("image", data)
        frames = torch.stack([data.roll(f, dims=-1) for f in range(4)], dim=1)  # [B, F, 3, H, W]
        return Samples("video", frames, fps=8.0)
    if modality == "audio":
        rate, n = 16000, 8000
        time = torch.arange(n) / rate
        rows = [
            torch.sin(2 * torch.pi * 110 * (i + 1) * time) * (0.2 + 0.1 * i)
            if i % 3
            else 0.5 * torch.randn(n, generator=g).clamp(-2, 2) / 2
            for i in range(batch)
        ]
        for i in range(2, batch, 3):  # a sound that stops halfway
            rows[i] = torch.cat([rows[i][: n // 2], torch.zeros(n - n // 2)])
        return Samples("audio", torch.stack(rows).unsqueeze(1), sample_rate=rate)  # [B, 1, S]
    return None


def _score(
    reward: Any, samples: Any, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
) -> tuple[Any, dict[str, Any]]:
    """``(score [B], diagnostics)`` from either return form of ``Reward.score``."""
    out = reward.score(samples, list(prompts), list(metadata))
    if isinstance(out, Mapping):
        assert "score" in out, f"score returned a mapping without a 'score' entry (keys {sorted(out)})"
        return out["score"], {k: v for k, v in out.items() if k != "score"}
    return out, {}


def _slice(samples: Any, index: slice) -> Any:
    import dataclasses

    return dataclasses.replace(samples, data=samples.data[index])


def check_reward(
    reward: Any,
    config: Any = None,
    context: Any = None,
    *,
    entry_module: str | None = None,
    samples: Any = None,
    prompts: Sequence[str] | None = None,
    metadata: Sequence[Mapping[str, Any]] | None = None,
    checks: Iterable[str] | None = None,
    atol: float = 1e-4,
    label: str | None = None,
) -> ConformanceReport:
    """Check a reward against ``protocols.Reward``; raise ``AssertionError`` listing what fails.

    ``reward`` is a factory ``factory(config, context)`` or a built reward. ``samples`` (a
    ``protocols.Samples``, at least 2 different items) is scored; default: varied samples of each
    declared modality the kit can make (image, video, audio); pass your own for other modalities.
    ``prompts`` (cycled to one per sample; default ``DEFAULT_PROMPTS``) and ``metadata`` (one per
    sample) go to ``score``.
    """
    from vgrpo_platform.protocols import BuildContext

    context = context if context is not None else BuildContext()
    config = _config_instance(config)
    is_factory = _is_factory(reward, "score")
    run = _Run("reward", label or _label(reward), checks, REWARD_CHECKS)
    module = _entry_module_of(reward, entry_module) if is_factory else entry_module
    run("entry_module_cheap", lambda: _cheap(module))
    run("config_rejects_unknown_keys", lambda: _config_check(config))
    state: dict[str, Any] = {}

    def attributes() -> None:
        if is_factory:
            assert config is not None, "pass config= (the factory's PluginConfig) with a factory"
            state["reward"] = reward(config, context)
        else:
            state["reward"] = reward
        _reward_attributes(state["reward"], config)

    run("attributes", attributes)
    r = state.get("reward")
    if r is None or "attributes" in run.failures:
        return run.finish()
    suites = [samples] if samples is not None else [example_samples(m) for m in sorted(r.modalities)]
    suites = [s for s in suites if s is not None]
    if not suites:
        for name in REWARD_CHECKS[3:]:
            run(name, lambda: f"pass samples= for modality {'/'.join(sorted(r.modalities))}")
        return run.finish()
    for s in suites:
        assert len(s) >= 2, "pass at least 2 samples"
    args = []
    for s in suites:
        pool = list(prompts) if prompts is not None else list(DEFAULT_PROMPTS)
        p = [pool[i % len(pool)] for i in range(len(s))]  # cycled to one prompt per sample
        m = list(metadata) if metadata is not None else [{} for _ in range(len(s))]
        assert len(m) == len(s), f"{len(s)} samples need {len(s)} metadata entries, got {len(m)}"
        args.append((s, p, m))
    run("score", lambda: _each(args, lambda s, p, m: _reward_score(r, s, p, m, state)))
    run(
        "score_deterministic",
        lambda: _each(args, lambda s, p, m: _reward_deterministic(r, s, p, m, atol)),
        needs=["score"],
    )
    run(
        "batch_consistent",
        lambda: _each(args, lambda s, p, m: _reward_batch(r, s, p, m, atol)),
        needs=["score"],
    )
    run(
        "responds_to_input",
        lambda: _each(args, lambda s, p, m: _reward_responds(r, s, p, m)),
        needs=["score"],
    )
    run("input_unchanged", lambda: _each(args, lambda s, p, m: _reward_pure(r, s, p, m)), needs=["score"])
    return run.finish()


def _each(args: list[tuple[Any, list[str], list[Any]]], fn: Callable[..., None]) -> None:
    for s, p, m in args:
        try:
            fn(s, p, m)
        except AssertionError as exc:
            raise AssertionError(f"{s.modality}: {exc}") from None


def _reward_attributes(reward: Any, config: Any) -> None:
    from vgrpo_platform.protocols import Reward

    assert isinstance(reward, Reward), "the reward lacks `modalities` or `score` of protocols.Reward"
    mods = reward.modalities
    assert isinstance(mods, frozenset) and mods and all(isinstance(m, str) for m in mods), (
        f"modalities must be a non-empty frozenset of strings, got {mods!r}"
    )
    declared = getattr(config, "modalities", None)
    assert declared is None or set(declared) == set(mods), (
        f"the Config declares modalities {sorted(declared)} but the reward scores {sorted(mods)}"
    )


def _reward_score(
    reward: Any, samples: Any, prompts: list[str], metadata: list[Any], state: dict[str, Any]
) -> None:
    import torch

    score, details = _score(reward, samples, prompts, metadata)
    b = len(samples)
    assert isinstance(score, torch.Tensor), f"score is {type(score).__name__}, not a tensor"
    assert score.shape == (b,), f"score has shape {tuple(score.shape)}, expected ({b},)"
    assert score.is_floating_point(), f"score must be floating point, got {score.dtype}"
    assert bool(torch.isfinite(score).all()), f"score has non-finite values: {score.tolist()}"
    for key, value in details.items():
        value = torch.as_tensor(value)
        assert value.shape == (b,), f"diagnostic {key!r} has shape {tuple(value.shape)}, expected ({b},)"


def _reward_deterministic(
    reward: Any, samples: Any, prompts: list[str], metadata: list[Any], atol: float
) -> None:
    a, _ = _score(reward, samples, prompts, metadata)
    b, _ = _score(reward, samples, prompts, metadata)
    _close(a, b, atol, "scoring the same batch twice")


def _reward_batch(reward: Any, samples: Any, prompts: list[str], metadata: list[Any], atol: float) -> None:
    import torch

    full, _ = _score(reward, samples, prompts, metadata)
    one = [
        _score(reward, _slice(samples, slice(i, i + 1)), prompts[i : i + 1], metadata[i : i + 1])[0]
        for i in range(len(samples))
    ]
    _close(
        full.reshape(-1),
        torch.cat([o.reshape(-1) for o in one]),
        atol,
        "a batch's scores vs. scoring items one by one",
    )


def _reward_responds(reward: Any, samples: Any, prompts: list[str], metadata: list[Any]) -> None:
    score, _ = _score(reward, samples, prompts, metadata)
    spread = float(score.max() - score.min())
    assert spread > 1e-6, (
        f"every sample gets the same score {float(score[0]):.4g}: the reward ignores its input"
    )


def _reward_pure(reward: Any, samples: Any, prompts: list[str], metadata: list[Any]) -> None:
    before = samples.data.clone()
    _score(reward, samples, prompts, metadata)
    assert bool((samples.data == before).all()), (
        "score modified samples.data in place; other rewards see it next"
    )


# ------------------------------------------------------------------------------------------ by name


def check_component(
    kind: str,
    name: str,
    options: Mapping[str, Any] | None = None,
    context: Any = None,
    *,
    registry: Any = None,
    **kwargs: Any,
) -> ConformanceReport:
    """Run ``check_adapter`` / ``check_reward`` on an installed component, found by ``name``.

    ``options`` are its recipe options (validated by its ``Config``); ``registry`` defaults to every
    installed plugin. Extra keyword arguments go to the check function.
    """
    from vgrpo_platform.plugins import default_registry

    registry = registry if registry is not None else default_registry()
    spec = registry.get(kind, name)
    config = registry.validate_options(kind, name, dict(options or {}))
    label = f"'{name}' ({spec.distribution})"
    if kind == "adapter":
        return check_adapter(spec.factory, config, context, label=label, **kwargs)
    if kind == "reward":
        return check_reward(spec.factory, config, context, label=label, **kwargs)
    raise ValueError(f"the conformance kit checks adapters and rewards, not {kind}s")


# ------------------------------------------------------------------------------------------ environments


def fresh_venv(path: str | Path) -> Path:
    """A new virtual environment at ``path`` that also sees this interpreter's installed packages.

    For testing that a plugin package installs: ``<path>/bin/pip install --no-deps
    --no-build-isolation -e my-plugin`` then ``<path>/bin/python -m vgrpo_platform plugins``. Plain
    ``--system-site-packages`` would expose the *base* interpreter's packages, not those of the
    virtual environment we run in, so a ``.pth`` file adds our site directories (processing their
    own ``.pth`` files, which editable installs need). Returns the new environment's ``python``.
    """
    path = Path(path)
    # our pip (seen through the .pth below) installs into the new environment: no ensurepip needed
    venv.EnvBuilder(with_pip=importlib.util.find_spec("pip") is None, clear=True).create(path)
    python = (
        path / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    )
    ours = [p for p in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])]
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({p!r})" for p in ours]
    (Path(target) / "_vgrpo_parent_env.pth").write_text("\n".join(lines) + "\n")
    return python


def _offline_build_backend() -> bool:
    """Whether setuptools here can build an editable wheel by itself (>= 70.1, or with ``wheel``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(x) for x in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def pip_install_editable(python: str | Path, project: str | Path) -> subprocess.CompletedProcess[str]:
    """``pip install --no-deps -e project`` into the environment of ``python`` (from ``fresh_venv``).

    Builds with this environment's setuptools (no download) when it can; otherwise pip fetches the
    build backend from the package index. Raises ``AssertionError`` with pip's output on failure.
    """
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check"]
    if _offline_build_backend():
        cmd.append("--no-build-isolation")
    proc = subprocess.run([*cmd, "-e", str(project)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip install -e {project} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc
