"""What a run prints: the progress display names the method and, in plain logs, the elapsed time and an
ETA; a CPU run starts without DeepSpeed's GPU-detection warning."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from vgrpo_platform.training.observe.metrics import Progress, clock_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_name_the_method_and_carry_elapsed_time_and_eta(capsys):
    clock = FakeClock()
    progress = Progress("plain", total=10, start=0, label="flow_grpo", clock=clock)
    clock.now += 30.0  # 2 iterations in 30 s: 15 s each, 8 to go
    progress.update(2, {"reward": 0.5})
    clock.now += 3600.0 * 25
    progress.update(10, {"reward": 0.75})
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "flow_grpo [2/10] reward 0.5  | elapsed 0:00:30  ETA 0:02:00",
        "flow_grpo [10/10] reward 0.75  | elapsed 1 day, 1:00:30  ETA 0:00:00",
    ]


def test_a_resumed_runs_eta_uses_this_processs_pace_only():
    clock = FakeClock()
    progress = Progress("none", total=100, start=90, clock=clock)
    clock.now += 20.0  # 2 iterations since the resume: 10 s each, 8 to go
    assert progress.timing(92) == "elapsed 0:00:20  ETA 0:01:20"
    assert Progress("none", total=100, start=90, clock=clock).timing(90) == "elapsed 0:00:00"
    assert clock_text(59.6) == "0:01:00" and clock_text(-1) == "0:00:00"


def test_the_rich_bar_names_the_method_not_a_fixed_one():
    progress = Progress("rich", total=3, label="diffusion_nft [x]")
    try:
        first = progress._bar.columns[0]  # the label column
        assert first.text_format == "[bold]diffusion_nft \\[x]"  # the name, its markup escaped
        names = [type(c).__name__ for c in progress._bar.columns]
        assert "TimeElapsedColumn" in names and "TimeRemainingColumn" in names
    finally:
        progress.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed finds the GPU and does not warn")
def test_a_cpu_run_tells_deepspeed_its_device_so_it_does_not_warn_at_start():
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    warning = "Setting accelerator to CPU"

    def output_of(code: str) -> str:  # DeepSpeed's logger writes to stdout
        args = [sys.executable, "-c", code]
        done = subprocess.run(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-2000:]
        return done.stdout

    assert warning in output_of("import deepspeed")  # the warning this guards against
    told = (
        "from vgrpo_platform.training.session import resolve_device; resolve_device('cpu'); import deepspeed"
    )
    assert warning not in output_of(told)


def test_the_device_is_told_to_deepspeed_only_where_the_user_did_not_choose(monkeypatch):
    from vgrpo_platform.training.session import resolve_device

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    resolve_device("cpu")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    monkeypatch.setenv("DS_ACCELERATOR", "xpu")
    resolve_device("cpu")
    assert os.environ["DS_ACCELERATOR"] == "xpu"
