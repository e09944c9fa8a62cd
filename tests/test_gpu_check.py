"""benchmarks/gpu_check: the GPU rows' plan runs at toy size on the CPU through the same script and
code (``bash benchmarks/gpu_check.sh --tiny``), each row a compact JSON record; a row that times out or
is left out by the budget says so; the docs' GPU table is exactly what the committed records render."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_run_of_the_script_writes_records_and_the_table(tmp_path):
    rows = ["flux_vgrpo_mb2", "wan_vgrpo_cached"]
    table = tmp_path / "table.md"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    cmd = ["bash", "benchmarks/gpu_check.sh", "--tiny", "--only", *rows, "--records", str(tmp_path)]
    done = subprocess.run(
        [*cmd, "--table", str(table)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name in rows:
        text = (tmp_path / f"{name}.json").read_text()
        assert text.count("\n") == 1 and ", " not in text  # one line of compact JSON
        record = json.loads(text)
        row = record["row"]
        assert record["name"] == name and record["gpus"] == 1 and record["env"]["torch"]
        assert row["status"] == "ok", row["status"]
        for key in ("iteration_s", "train_s", "rollout_samples_s", "mfu"):
            assert row[key] is not None and row[key] > 0, (name, key)
    records = gpu_check.load_records(tmp_path)
    assert records["flux_vgrpo_mb2"]["row"]["setting"]["micro_batch"] == 2
    assert records["wan_vgrpo_cached"]["row"]["setting"]["rollout"] == "cached"
    lines = [ln for ln in table.read_text().splitlines() if ln.startswith("| ")][1:]
    assert len(lines) == len(gpu_check.PLAN)
    assert sum("| ok | cpu," in ln for ln in lines) == 2
    assert sum("| not run |" in ln for ln in lines) == len(gpu_check.PLAN) - 2
    assert "not a GPU figure" in table.read_text()
    assert not (ROOT / "docs" / "benchmarks.md").read_text().count("| ok | cpu,")  # --tiny never writes docs


def test_a_row_out_of_time_writes_its_status(tmp_path):
    planned = gpu_check.BY_NAME["flux_vgrpo"]
    status = gpu_check.run_row(planned, tiny=True, folder=tmp_path, timeout_s=1)
    assert status == "timeout (1 s)"
    record = gpu_check.load_records(tmp_path)["flux_vgrpo"]
    assert record["row"]["status"] == status and record["row"]["iteration_s"] is None
    line = gpu_check.table_line(planned, record)
    assert "timeout (1 s)" in line and line[6] == "-"


def test_rows_past_the_budget_are_skipped_and_write_nothing(tmp_path):
    statuses = gpu_check.run_plan(gpu_check.PLAN[:3], tiny=True, folder=tmp_path, budget_s=5)
    assert all(s.startswith("skipped") for s in statuses.values()) and len(statuses) == 3
    assert gpu_check.load_records(tmp_path) == {}


def test_the_plan_covers_the_issue_and_fits_the_lease():
    names = set(gpu_check.BY_NAME)
    for model in ("flux", "wan"):
        assert {
            f"{model}_vgrpo",
            f"{model}_flow_grpo",
            f"{model}_vgrpo_cached",
            f"{model}_vgrpo_compiled",
        } <= names
    assert {"flux_vgrpo_mb2", "flux_vgrpo_mb4"} <= names
    assert gpu_check.BUDGET_S == 480 and all(p.timeout_s <= 150 for p in gpu_check.PLAN)
    assert len(names) == len(gpu_check.PLAN)


@pytest.mark.parametrize("doc", gpu_check.DOCS)
def test_the_docs_table_is_the_committed_records_rendered(doc):
    text = (ROOT / doc).read_text()
    block = text.split(gpu_check.DOC_BEGIN + "\n", 1)[1].split(gpu_check.DOC_END, 1)[0]
    assert block == gpu_check.markdown(gpu_check.load_records(gpu_check.RECORDS))
