"""Shared pieces of the conformance kit: the check runner, its report, the checks both kits use."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
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
    "denoiser_call",
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


def _open_run(
    kind: str,
    target: Any,
    attribute: str,
    config: Any,
    checks: Iterable[str] | None,
    known: Sequence[str],
    entry_module: str | None,
    label: str | None,
) -> tuple[_Run, Any, bool]:
    """Start a kit's run with the two checks every plugin gets: ``(run, config instance, is_factory)``.

    ``target`` is a factory or a built plugin (a built one has ``attribute``, e.g. ``"score"``); both
    kits open the same way, so the entry-module and config checks read the same for adapters and rewards.
    """
    config = _config_instance(config)
    is_factory = _is_factory(target, attribute)
    run = _Run(kind, label or _label(target), checks, known)
    module = _entry_module_of(target, entry_module) if is_factory else entry_module
    run("entry_module_cheap", lambda: _cheap(module))
    run("config_rejects_unknown_keys", lambda: _config_check(config))
    return run, config, is_factory


def _close(a: Any, b: Any, atol: float, what: str) -> None:
    import torch

    assert a.shape == b.shape, f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}"
    diff = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    scale = float(b.float().abs().max()) if b.numel() else 0.0
    assert diff <= atol + 1e-4 * scale or (atol == 0.0 and torch.equal(a, b)), (
        f"{what}: max abs difference {diff:.3g} (tolerance {atol + 1e-4 * scale:.3g})"
    )
