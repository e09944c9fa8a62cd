"""The plugin-author surface keeps its import paths: a plugin written against them must not break
when the core's internals move (docs/writing-a-reward.md, docs/writing-an-adapter.md)."""

from __future__ import annotations

import importlib

import pytest

PINNED = {
    "vgrpo_platform.protocols": [
        "Adapter", "BatchState", "BuildContext", "NoiseSchedule", "ReferencePolicy", "Reward", "RolloutBatch",
        "SamplerSpec", "Samples", "Surrogate", "SurrogateBase",
    ],
    "vgrpo_platform.hookspecs": [
        "hookimpl", "register_components", "register_commands",
        # the deprecated per-kind hooks, still called for one release
        "register_adapters", "register_rewards", "register_surrogates", "register_rollout_backends",
    ],
    "vgrpo_platform.registry": ["KINDS", "Component", "ComponentSpec", "PluginConfig", "lazy_factory"],
    "vgrpo_platform.noise_schedules": ["RectifiedFlowSchedule", "expand_like"],
    "vgrpo_platform.ode_solvers": ["make_scheduler", "solve_flow_ode"],
    "vgrpo_platform.errors": ["PluginError", "RecipeError", "RewardError", "VgrpoError"],
    "vgrpo_platform.testing": [
        "ADAPTER_CHECKS", "REWARD_CHECKS", "ConformanceReport", "check_adapter", "check_component",
        "check_entry_module_cheap", "check_reward", "example_samples", "fresh_venv", "pip_install_editable",
    ],
    # helpers the built-in plugins import (adapters/, rewards/): a third-party plugin may too
    "vgrpo_platform.finetune": ["attach_lora", "reference_mode", "uses_lora", "values_swapped_in"],
    "vgrpo_platform.retrying": ["TransientError", "with_retries"],
    "vgrpo_platform.media": ["read_audio", "read_video", "write_audio", "write_video"],
    "vgrpo_platform.conditions": [
        "Prompt", "condition_images", "encode_conditioned", "reward_metadata", "takes_condition_image",
    ],
    "vgrpo_platform.reward_wire": [
        "FRAME_TYPE", "JSON_TYPE", "PROTOCOL", "PROTOCOLS", "Frame", "ScoreRequest", "WireError",
        "decode_request", "decode_samples", "decode_scores", "encode_frame", "encode_request",
        "encode_samples", "encode_scores", "read_frame",
    ],
}  # fmt: skip

DEPRECATED = {  # old paths, re-exports of their new homes for one release; each warns on import
    "vgrpo_platform.plugins": ["ComponentRegistry", "default_registry"],
    "vgrpo_platform.host.plugins": ["ComponentRegistry", "build_plugin_manager", "collect_components"],
    "vgrpo_platform.lr_schedule": ["lr_factor"],
    "vgrpo_platform.sampling": ["make_scheduler", "solve_flow_ode"],
    "vgrpo_platform.schedules": ["RectifiedFlowSchedule", "expand_like"],
    "vgrpo_platform.algo.surrogates.plugin": ["build_vgrpo", "register_components"],
    "vgrpo_platform.rollout_backends.plugin": ["CachedConfig", "WorkerConfig", "register_components"],
}


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


@pytest.mark.parametrize("module", sorted(DEPRECATED))
def test_an_old_path_still_imports_and_says_where_to_go(module: str) -> None:
    import subprocess
    import sys

    names = ", ".join(DEPRECATED[module])
    code = (  # one fresh interpreter: the import succeeds, and it warned (a cached module would not)
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    from {module} import {names}\n"
        "for w in seen:\n"
        "    print(w.category.__name__, '|', w.message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    warned = [line for line in out.stdout.splitlines() if line.startswith("DeprecationWarning |")]
    assert warned, out.stdout + out.stderr
    assert all("import" in line for line in warned)  # the warning names the new path


def test_no_project_code_imports_an_old_path() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    used = []
    for folder in ("vgrpo_platform", "adapters", "rewards", "examples", "benchmarks"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            used += [
                f"{path.relative_to(root)}: {m}"
                for m in DEPRECATED
                if f"import {m}" in text or f"from {m} " in text
            ]
    assert used == []
