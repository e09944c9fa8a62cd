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

The kit is split by job (``common``: the runner and shared checks; ``adapter_kit``;
``reward_kit``; ``components``: by installed name; ``environments``: fresh venvs); this package
re-exports all of it, so ``vgrpo_platform.testing`` stays the import path plugin authors use.
"""

from __future__ import annotations

from vgrpo_platform.testing.adapter_kit import check_adapter, check_samples
from vgrpo_platform.testing.common import (
    ADAPTER_CHECKS,
    DEFAULT_PROMPTS,
    HEAVY_MODULES,
    MODALITY_NDIM,
    MODALITY_RANGES,
    REWARD_CHECKS,
    ConformanceReport,
    check_config_rejects_unknown_keys,
    check_entry_module_cheap,
)
from vgrpo_platform.testing.components import check_component
from vgrpo_platform.testing.environments import fresh_venv, pip_install_editable
from vgrpo_platform.testing.reward_kit import check_reward, example_samples

__all__ = [
    "check_adapter",
    "check_samples",
    "HEAVY_MODULES",
    "ADAPTER_CHECKS",
    "REWARD_CHECKS",
    "DEFAULT_PROMPTS",
    "MODALITY_RANGES",
    "MODALITY_NDIM",
    "ConformanceReport",
    "check_entry_module_cheap",
    "check_config_rejects_unknown_keys",
    "check_component",
    "fresh_venv",
    "pip_install_editable",
    "example_samples",
    "check_reward",
]
