"""The in-process rollout's metrics, recorded before the rollout backends existed, and how to re-make them.

``tests/data/in_process_metrics.json`` holds the metrics (timings left out) of two short runs made with
the code just before ``[rollout] backend`` was introduced (commit 96d7f19): the toy recipe and four
iterations of the quickstart (diagnostics, checkpoints and evaluations included). The code must reproduce
them to the bit on the machine that recorded them (tests/test_behaviour_record.py); another CPU's float
kernels follow another trajectory, so elsewhere that test compares the first iteration within a tolerance.

``python tests/in_process_records.py RUN_ROOT`` writes the record from runs that ``run`` made under
``RUN_ROOT`` (used once, on the old code).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).resolve().parent / "data" / "in_process_metrics.json"
RUNS = {
    "toy": ["recipes/toy.toml"],
    "quickstart": [
        "recipes/quickstart.toml",
        "--set",
        "train.iterations=4",
        "--set",
        "eval.every=2",
        "--set",
        "eval.max_prompts=6",
        "--set",
        "eval.samples_per_prompt=2",
        "--set",
        "log.diagnostics_every=2",
        "--set",
        "log.checkpoint_every=2",
    ],
}


def machine() -> dict[str, str]:
    """What decides the float kernels: the CPU, torch's version and its thread count."""
    model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line
        ]
        model = names[0] if names else model
    return {"cpu": model, "torch": torch.__version__, "threads": str(torch.get_num_threads())}


def run(name: str, out: Path, *extra: str) -> Path:
    """``vgrpo run`` of one recorded run (a process of its own, as a user runs it); its run folder."""
    args = [*RUNS[name], "--set", f"run.output_dir={out.as_posix()}", "--set", "log.progress=none", *extra]
    subprocess.run(
        [sys.executable, "-m", "vgrpo_platform", "run", *args], cwd=ROOT, check=True, capture_output=True
    )
    return out / name


def comparable(metrics_file: Path) -> list[dict]:
    """Every record of ``metrics.jsonl`` without its timings (what differs from run to run)."""
    records = []
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        records.append({k: v for k, v in record.items() if not k.startswith("time") and "seconds" not in k})
    return records


def write_record(run_root: Path) -> None:
    runs = {name: comparable(run_root / name / "metrics.jsonl") for name in RUNS}
    RECORD.write_text(
        json.dumps({"made_by": "96d7f19", "machine": machine(), "runs": runs}, separators=(",", ":"))
    )


if __name__ == "__main__":
    write_record(Path(sys.argv[1]))
