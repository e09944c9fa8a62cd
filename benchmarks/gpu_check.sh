#!/usr/bin/env bash
# The real-size throughput rows that say the most, on one GPU, within 8 minutes (sized for one H200):
# FLUX.1-dev and Wan 2.1 1.3B in bf16 with LoRA r32 and gradient checkpointing, V-GRPO (N_MC 4) against
# Flow-GRPO at the same batch, and torch.compile on for FLUX's V-GRPO row. Random weights from the
# published configs; text encoders and VAE are not built (see benchmarks/throughput.py).
#
#   bash benchmarks/gpu_check.sh            # writes benchmarks/results/gpu_check.md and .json
#
# Then, if at least 75 s of the budget are left, the quickstart recipe trains 4 iterations on CUDA in
# bf16 through `vgrpo run` (the whole trainer, not the harness), its log in benchmarks/results/.
#
# Each row is its own process under a timeout; a row that times out or fails is a row of the table
# with that status, and rows still waiting when the 8-minute budget is spent are marked skipped.
# Installs nothing: it needs the packages of `pip install -e .` (torch, diffusers, peft, rich...).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=benchmarks/results
ROWS=$OUT/gpu_check_rows
BUDGET_S=${BUDGET_S:-480}
FLOPS=$OUT/gpu_check_flops.json  # FLOP counts (device-independent, tens of seconds each) shared by rows
mkdir -p "$ROWS"
rm -f "$ROWS"/*.json "$FLOPS"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

if ! "$PY" -c "import torch, diffusers, peft, pydantic, pluggy, rich" 2>/dev/null; then
    echo "missing packages: run 'pip install -e .' in the repo first" >&2
    exit 2
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

FLUX="flux --batch 4 --micro-batch 1 --steps 8 --resolution 512"
WAN="wan --batch 2 --micro-batch 1 --steps 8 --height 480 --width 832 --frames 33"
COMMON="--device cuda --dtype bf16 --finetune lora --checkpointing on"
# name | per-row timeout (s) | harness arguments
ROW_SPECS=(
    "flux_vgrpo|110|$FLUX --methods vgrpo --compile off"
    "flux_flow_grpo|100|$FLUX --methods flow_grpo --compile off"
    "wan_vgrpo|80|$WAN --methods vgrpo --compile off"
    "wan_flow_grpo|80|$WAN --methods flow_grpo --compile off"
    "flux_vgrpo_compiled|150|$FLUX --methods vgrpo --compile on"
)

start=$(date +%s)
for spec in "${ROW_SPECS[@]}"; do
    IFS='|' read -r name limit args <<<"$spec"
    elapsed=$(( $(date +%s) - start ))
    if (( elapsed + limit > BUDGET_S )); then
        status="skipped (8-minute budget)"
    else
        echo "== $name (timeout ${limit}s, ${elapsed}s elapsed)"
        # shellcheck disable=SC2086
        timeout --kill-after=10 "$limit" "$PY" -m benchmarks.throughput $args $COMMON --flops-cache "$FLOPS" --out "$ROWS/$name.json"
        rc=$?
        [[ -f "$ROWS/$name.json" ]] && continue
        if (( rc == 124 || rc == 137 )); then status="timeout (${limit}s)"; else status="failed (exit $rc)"; fi
    fi
    "$PY" -m benchmarks.throughput --placeholder "$status" $args $COMMON --out "$ROWS/$name.json" >/dev/null
done
"$PY" -m benchmarks.throughput --merge "$ROWS"/*.json --out "$OUT/gpu_check.md" "$OUT/gpu_check.json"
echo "wrote $OUT/gpu_check.md and $OUT/gpu_check.json in $(( $(date +%s) - start )) s"

left=$(( BUDGET_S - ($(date +%s) - start) ))
if (( left >= 75 )) && command -v vgrpo >/dev/null; then
    echo "== quickstart on CUDA, bf16, 4 iterations (timeout $(( left - 5 ))s)"
    timeout --kill-after=10 $(( left - 5 )) vgrpo run recipes/quickstart.toml --set run.device=cuda \
        --set run.mixed_precision=bf16 --set train.iterations=4 --set eval.every=0 --set eval.max_prompts=32 \
        --set log.diagnostics_every=0 --set log.progress=plain --set run.output_dir="$OUT/cuda_run" \
        >"$OUT/cuda_quickstart.log" 2>&1
    echo "exit $? (log: $OUT/cuda_quickstart.log)"
    cp "$OUT/cuda_run/quickstart/metrics.jsonl" "$OUT/cuda_quickstart_metrics.jsonl" 2>/dev/null || true
else
    echo "quickstart on CUDA skipped (${left}s left, or vgrpo is not installed)"
fi
