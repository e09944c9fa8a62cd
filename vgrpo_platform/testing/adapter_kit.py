"""The adapter half of the conformance kit: ``check_adapter`` and its named checks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vgrpo_platform.conditions import encode_conditioned
from vgrpo_platform.testing.common import (
    ADAPTER_CHECKS,
    DEFAULT_PROMPTS,
    MODALITY_NDIM,
    MODALITY_RANGES,
    ConformanceReport,
    _close,
    _open_run,
)


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
    An adapter that takes condition images (``takes_condition_image``) is encoded through its
    ``encode_conditions``: give it ``prompts`` that carry images (``conditions.Prompt``).
    """
    import torch

    from vgrpo_platform.protocols import BuildContext, SamplerSpec

    context = context if context is not None else BuildContext()
    sampler = sampler if sampler is not None else SamplerSpec("euler", 2)
    run, config, is_factory = _open_run(
        "adapter", adapter, "denoiser", config, checks, ADAPTER_CHECKS, entry_module, label
    )
    state: dict[str, Any] = {}

    def build() -> Any:
        if not is_factory:
            return adapter
        assert config is not None, "pass config= (the factory's PluginConfig) with a factory"
        return adapter(config, context)

    def attributes() -> None:
        state["adapter"] = build()
        _adapter_attributes(state["adapter"], config)

    run("attributes", attributes)
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

    def latent_shape() -> None:
        _latent_shape(a)
        inputs()

    run("latent_shape", latent_shape, needs=["attributes"])
    run("schedule", lambda: _schedule(a, state, atol), needs=["latent_shape"])
    run("encode_prompts", lambda: _encode(a, prompts, group, state), needs=["attributes"])
    need_io = ["latent_shape", "schedule", "encode_prompts"]
    run("predict", lambda: _predict(a, state), needs=need_io)
    run("predict_deterministic", lambda: _predict_deterministic(a, state, atol), needs=["predict"])
    run("predict_batch_independent", lambda: _predict_batch(a, state, atol), needs=["predict"])
    run("denoiser_call", lambda: _denoiser_call(a, state, sampler), needs=["predict"])
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
        cond = encode_conditioned(adapter, list(prompts))
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
    one = encode_conditioned(adapter, list(prompts[:1]))
    for key, value in one.items():
        assert value.shape[0] == 1, f"encode_prompts of 1 prompt: [{key!r}] has batch {value.shape[0]}"
    _rows_stand_alone(adapter, prompts, cond)
    state["prompts"], state["group"] = list(prompts), group
    state["cond"] = _repeat(cond, group)  # [B, ...]


def _rows_stand_alone(adapter: Any, prompts: Sequence[str], cond: Mapping[str, Any]) -> None:
    """Each prompt encoded alone has its batch row's shape: the core joins rows encoded apart (the prompt
    cache, rollout chunks) and slices them into micro-batches, so a row padded to its batch-mates' longest
    would not fit (pad to a fixed length and carry a mask instead)."""
    import torch

    for prompt in prompts:
        with torch.no_grad():
            alone = encode_conditioned(adapter, [prompt])
        for key, value in alone.items():
            assert value.shape[1:] == cond[key].shape[1:], (
                f"encode_prompts([{prompt!r}])[{key!r}] has shape {tuple(value.shape)}, its row in a batch "
                f"{tuple(cond[key].shape[1:])}: a row's shape may not depend on its batch-mates"
            )


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
    """Micro-batching must not change results: row i of a batch equals predicting row i alone, with its
    slice of the batch's conditioning and with its prompt encoded alone (padding must be masked)."""
    import torch

    b = state["z_t"].shape[0]
    first_and_last = {0: state["prompts"][0], b - 1: state["prompts"][-1]}  # rows of the first/last prompt
    with torch.no_grad():
        full = adapter.predict(state["z_t"], state["t"], state["cond"])
        for i, prompt in first_and_last.items():
            row, t = state["z_t"][i : i + 1], state["t"][i : i + 1]
            sliced = adapter.predict(row, t, {k: v[i : i + 1] for k, v in state["cond"].items()})
            _close(full[i : i + 1], sliced, atol * 10, "predict of a batch vs. one sample at a time")
            alone = adapter.predict(row, t, encode_conditioned(adapter, [prompt]))
            _close(full[i : i + 1], alone, atol * 10, f"predict of a batch vs. {prompt!r} encoded alone")


def _denoiser_call(adapter: Any, state: dict[str, Any], sampler: Any) -> None:
    """The core makes every call of the denoiser (``adapter.network``), so its wrappers (data parallel,
    caches, rollout engines) reach every forward: count the module's forwards against the core's calls."""
    from contextlib import contextmanager

    import torch

    from vgrpo_platform.network import DenoiserCall

    call = getattr(adapter, "network", None)
    assert isinstance(call, DenoiserCall), (
        "adapter.network is not the core's DenoiserCall: subclass vgrpo_platform.network.CoreCalledAdapter "
        "and describe the call with denoiser_inputs() instead of calling the denoiser"
    )
    assert call.module is adapter.denoiser, "adapter.network calls another module than adapter.denoiser"
    counts = {"core": 0, "module": 0}

    @contextmanager
    def counted(module: Any, branch: str) -> Any:
        counts["core"] += 1
        yield

    def forward_seen(module: Any, args: Any, kwargs: Any) -> None:
        counts["module"] += 1

    handle = adapter.denoiser.register_forward_pre_hook(forward_seen, with_kwargs=True)
    try:
        with torch.no_grad(), call.hooked(counted):
            adapter.predict(state["z_t"], state["t"], state["cond"])
            adapter.sample(state["noise"], state["cond"], sampler)
    finally:
        handle.remove()
    assert counts["module"] > 0, "predict and sample never ran adapter.denoiser"
    assert counts["module"] == counts["core"], (
        f"adapter.denoiser ran {counts['module']} forwards in predict + sample, only {counts['core']} of "
        "them through adapter.network: call the network through the core (network_velocity), never the module"
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
        cond = _repeat(encode_conditioned(other, state["prompts"]), state["group"])
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
    audio = getattr(samples, "audio", None)
    if audio is not None:  # a video's soundtrack: what audio rewards will score
        assert audio.ndim == 3 and audio.shape[0] == data.shape[0], (
            f"Samples.audio must be [B, channels, samples] for the {data.shape[0]} samples, "
            f"got {tuple(audio.shape)}"
        )
        assert bool(torch.isfinite(audio).all()) and float(audio.abs().max()) <= 1 + 1e-6, (
            "Samples.audio must be finite and lie in [-1, 1]"
        )
        assert samples.sample_rate, "Samples with audio must set sample_rate"


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
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params), (
        "every LoRA gradient is zero"
    )
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
