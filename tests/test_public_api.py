"""The plugin-author surface keeps its import paths: a plugin written against them must not break
when the core's internals move (docs/writing-a-reward.md, docs/writing-an-adapter.md)."""

from __future__ import annotations

import importlib

import pytest

PINNED = {
    "vgrpo_platform.protocols": [
        "Adapter", "BuildContext", "NoiseSchedule", "ReferencePolicy", "Reward", "RolloutBatch",
        "SamplerSpec", "Samples", "Surrogate", "SurrogateBase",
    ],
    "vgrpo_platform.hookspecs": [
        "hookimpl", "register_components", "register_commands",
        # the deprecated per-kind hooks, still called for one release
        "register_adapters", "register_rewards", "register_surrogates", "register_rollout_backends",
    ],
    "vgrpo_platform.registry": ["KINDS", "Component", "ComponentSpec", "PluginConfig", "lazy_factory"],
    "vgrpo_platform.schedules": ["RectifiedFlowSchedule", "expand_like"],
    "vgrpo_platform.sampling": ["make_scheduler", "solve_flow_ode"],
    "vgrpo_platform.errors": ["PluginError", "RecipeError", "RewardError", "VgrpoError"],
    "vgrpo_platform.testing": [
        "ADAPTER_CHECKS", "REWARD_CHECKS", "ConformanceReport", "check_adapter", "check_component",
        "check_entry_module_cheap", "check_reward", "example_samples", "fresh_venv", "pip_install_editable",
    ],
    # helpers the built-in plugins import (adapters/, rewards/): a third-party plugin may too
    "vgrpo_platform.finetune": ["attach_lora", "reference_mode", "uses_lora", "values_swapped_in"],
    "vgrpo_platform.retrying": ["TransientError", "with_retries"],
    "vgrpo_platform.media": ["read_audio", "read_video", "write_audio", "write_video"],
    "vgrpo_platform.reward_wire": [
        "PROTOCOL", "WireError", "decode_samples", "decode_scores", "encode_request", "encode_samples",
        "encode_scores",
    ],
    # old paths kept as re-exports of their new homes (host.collect, training.optimizer), deprecated
    "vgrpo_platform.plugins": ["ComponentRegistry", "default_registry"],
    "vgrpo_platform.host.plugins": ["ComponentRegistry", "build_plugin_manager", "collect_components"],
    "vgrpo_platform.lr_schedule": ["lr_factor"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PINNED))
def test_plugin_author_names_import_from_their_documented_module(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in PINNED[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}: plugins import these; re-export them there"


def test_importing_the_conformance_kit_loads_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, vgrpo_platform.testing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
