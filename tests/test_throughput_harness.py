"""python -m benchmarks.throughput at tiny size on the CPU: every model's V-GRPO and Flow-GRPO rows run
through the shipped adapters and surrogates, with positive figures; the counted FLOPs match the calls
made; the row files of benchmarks/gpu_check.sh merge back into one table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _harness():
    from benchmarks import throughput

    return throughput


def test_tiny_run_has_every_model_and_method_with_positive_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    harness = _harness()
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    rows = harness.main(["--tiny", "--peak-tflops", "1", "--out", str(md), str(js)])
    got = {(r.setting.model, r.setting.method) for r in rows}
    assert got == {(m, k) for m in ("flux", "sd3", "qwen_image", "wan") for k in ("vgrpo", "flow_grpo")}
    for r in rows:
        assert r.status == "ok", (r.setting, r.status)
        for value in (r.rollout_samples_s, r.train_s, r.iteration_s, r.train_tflop, r.mfu, r.rollout_mfu):
            assert value is not None and value > 0, (r.setting, r)
        assert r.iteration_s > r.train_s
        assert r.rollout_gb is None  # peak memory is a CUDA figure
    by = {(r.setting.model, r.setting.method): r for r in rows}
    # V-GRPO N_MC 4 trains 4 forwards per sample; Flow-GRPO trains its SDE steps but the last (3 of 4)
    # and runs the reference on the same steps for its KL, without gradient
    assert by["flux", "vgrpo"].train_calls == "4+0"
    assert by["flux", "flow_grpo"].train_calls == "3+3"
    text = md.read_text()
    assert "NOT built" in text and text.count("| ok |") == 8
    merged = harness.main(["--merge", str(js)])
    assert [(r.setting.model, r.setting.method, r.train_s) for r in merged] == [
        (r.setting.model, r.setting.method, r.train_s) for r in rows
    ]


def test_counted_flops_are_one_forward_plus_backward_per_trained_call(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    harness = _harness()
    setting = harness.Setting(
        model="sd3", method="vgrpo", dtype="fp32", batch=2, micro_batch=2, steps=2, lora_rank=4
    )
    forward, both = harness.count_flops(harness.models.SPECS["sd3"], setting, tiny=True)
    assert forward < both < 3 * forward  # LoRA: input gradients, no frozen-weight gradients
    full = harness.Setting(**{**setting.__dict__, "finetune": "full"})
    forward_full, both_full = harness.count_flops(harness.models.SPECS["sd3"], full, tiny=True)
    assert forward_full < forward  # LoRA adds its own small matmuls to the forward ...
    assert both_full > both  # ... full fine-tuning every weight's gradient to the backward
    row = harness.measure(setting, tiny=True, device="cpu")
    assert row.train_calls == "4+0"
    assert row.train_tflop * 1e12 == pytest.approx(4 * 2 * both)


def test_the_real_configs_have_the_published_sizes():
    harness = _harness()
    import torch

    sizes = {}
    for key, spec in harness.models.SPECS.items():
        model = harness.models.build_transformer(spec, tiny=False, device="meta", dtype=torch.bfloat16)
        sizes[key] = sum(p.numel() for p in model.parameters()) / 1e9
    assert sizes == pytest.approx({"flux": 11.90, "sd3": 2.243, "qwen_image": 20.43, "wan": 1.419}, abs=0.01)


def test_gpu_check_script_parses_and_a_placeholder_row_merges(tmp_path):
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], check=True)
    harness = _harness()
    out = tmp_path / "row.json"
    harness.main(["flux", "--methods", "vgrpo", "--placeholder", "timeout (90s)", "--out", str(out)])
    (row,) = harness.main(["--merge", str(out)])
    assert row.status == "timeout (90s)" and row.train_s is None and row.setting.model == "flux"


@pytest.mark.slow
def test_compiled_row_runs_at_tiny_size(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (row,) = _harness().main(["flux", "--tiny", "--methods", "vgrpo", "--compile", "on"])
    assert row.status == "ok" and row.train_s > 0 and row.setting.compile


@pytest.mark.slow  # ~10-30 s: the command line of what the tiny-run test above covers in-process
def test_the_script_runs_as_a_command(tmp_path):
    out = tmp_path / "t.md"
    cmd = [sys.executable, "-m", "benchmarks.throughput", "wan", "--tiny", "--methods", "vgrpo"]
    done = subprocess.run(
        [*cmd, "--out", str(out)],
        cwd=ROOT,  # as docs/benchmarks.md runs it: from the repository root
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NOT built" in done.stdout and "| Wan 2.1 T2V 1.3B | vgrpo |" in out.read_text()
