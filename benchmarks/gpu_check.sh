#!/usr/bin/env bash
# The real-size throughput rows on one GPU within 8 minutes (sized for one H100 / H200): FLUX.1-dev and
# Wan 2.1 1.3B (SD 3.5 Medium last, if time is left) in bf16 with LoRA r32 and gradient checkpointing:
# V-GRPO (N_MC 4) against Flow-GRPO at the same batch, micro-batch 1 / 2 / 4, torch.compile off / on,
# and the `cached` rollout backend. Random weights from the published configs; text encoders and VAE
# are not built (see benchmarks/throughput.py). The plan, in priority order, is benchmarks/gpu_check.py's.
#
#   bash benchmarks/gpu_check.sh                    # records in benchmarks/results/gpu/, then the docs table
#   bash benchmarks/gpu_check.sh --only ROW ...     # some rows (a later lease: the rows the budget skipped)
#   bash benchmarks/gpu_check.sh --tiny             # the same code at toy size on the CPU (no docs written)
#
# Each row is its own process under its own timeout, capped by what is left of the 8 minutes; a row that
# times out, runs out of memory or fails (a micro-batch an adapter does not support yet) writes a record
# that says so, and rows the budget leaves out are printed as skipped and write nothing. The table
# between the gpu-table markers of docs/benchmarks.md is regenerated from the records in git's folder.
# Then, if at least 75 s of the budget are left, the quickstart recipe trains 4 iterations on CUDA in
# bf16 through `vgrpo run` (the whole trainer, not the harness), its log in benchmarks/results/.
# Installs nothing: it needs the packages of `pip install -e .` (torch, diffusers, peft, rich...).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=benchmarks/results
BUDGET_S=${BUDGET_S:-480}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

if ! "$PY" -c "import torch, diffusers, peft, pydantic, pluggy, rich" 2>/dev/null; then
    echo "missing packages: run 'pip install -e .' in the repo first" >&2
    exit 2
fi
tiny=0
for arg in "$@"; do [[ "$arg" == "--tiny" ]] && tiny=1; done
if (( tiny )); then
    exec "$PY" -m benchmarks.gpu_check "$@"
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

start=$(date +%s)
"$PY" -m benchmarks.gpu_check --budget-s "$BUDGET_S" "$@" || exit $?
echo "rows and docs table done in $(( $(date +%s) - start )) s"

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
