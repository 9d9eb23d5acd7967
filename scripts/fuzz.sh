#!/usr/bin/env bash
# Fuzz the worker's HTTP API from its own OpenAPI document: schemathesis with every check, a random seed, and at least
# MIN_CASES test cases (default 10,000), against a real worker serving a tiny model on loopback. Prints the count.
#
#   scripts/fuzz.sh                    # EXAMPLES=5000 per operation, a random seed
#   SEED=123 EXAMPLES=800 MIN_CASES=0 scripts/fuzz.sh   # replay a seed, shorter
#   MODEL=qwen3-causal scripts/fuzz.sh # another tiny model (tests/support/tiny_models.py)
#
# The checks' configuration (and the one allowance it makes) is shared with CI: tests/fuzz/schemathesis.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
schemathesis="$(dirname "$python")/schemathesis"
examples="${EXAMPLES:-5000}"
min_cases="${MIN_CASES:-10000}"
seed="${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
model_name="${MODEL:-qwen3-cls3}"

workdir="$(mktemp -d)"
worker_pid=""
cleanup() {
  if [ -n "$worker_pid" ]; then kill "$worker_pid" 2>/dev/null || true; wait "$worker_pid" 2>/dev/null || true; fi
  rm -rf "$workdir"
}
trap cleanup EXIT

export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/worker:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
model="$("$python" -c "import sys, tiny_models; print(tiny_models.build(sys.argv[1], sys.argv[2]))" \
  "$model_name" "$workdir" 2>/dev/null)"
port="$("$python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
"$python" -m scorekeeper_worker.cli serve --model "$model" --port "$port" --max-items-per-request 64 \
  --log-level warning >"$workdir/worker.log" 2>&1 &
worker_pid=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
  kill -0 "$worker_pid" 2>/dev/null || { cat "$workdir/worker.log"; exit 1; }
  sleep 0.2
done

echo "fuzz: model $model_name, seed $seed, $examples examples per operation" >&2
status=0
"$schemathesis" --config-file tests/fuzz/schemathesis.toml run "http://127.0.0.1:$port/openapi.json" \
  --checks all --max-examples "$examples" --seed "$seed" --workers 1 --no-color | tee "$workdir/report" || status=$?

summary="$(grep -Eo '[0-9]+ generated, [^=]*' "$workdir/report" | tail -1)"
generated="$(echo "$summary" | grep -Eo '^[0-9]+')"
echo "fuzz: $generated cases (${summary}), seed $seed, schemathesis exit status $status"
if [ "$status" -ne 0 ]; then exit "$status"; fi
if [ "${generated:-0}" -lt "$min_cases" ]; then
  echo "fuzz: fewer than $min_cases cases; raise EXAMPLES" >&2
  exit 1
fi
