"""The worker's fixed names the operator relies on: its command, ports, mount paths and the flags the operator owns.

Kept apart from spec/flags.py (which renders a spec into flags) so that spec validation can read the reserved flags and
built-in templates without importing the renderer.
"""

from __future__ import annotations

WORKER_COMMAND = "scorekeeper-worker"
WORKER_PORT = 8000
METRICS_PORT = 9090  # the worker's --metrics-port: /metrics alone, so scrapes need no API key
API_KEY_DIR = "/etc/scorekeeper-auth"  # spec.auth.apiKeySecretRef, mounted read-only (a directory: updates propagate)
API_KEY_FILE = "keys"
API_KEY_PATH = f"{API_KEY_DIR}/{API_KEY_FILE}"
MODEL_MOUNT = "/models"
CONFIG_DIR = "/etc/scorekeeper"
CONFIG_FILE = "worker.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
# spec.scoring.promptTemplate given as text: written into the same ConfigMap, so the pod reads it at this path.
PROMPT_TEMPLATE_FILE = "prompt-template.txt"
PROMPT_TEMPLATE_PATH = f"{CONFIG_DIR}/{PROMPT_TEMPLATE_FILE}"
# spec.scoring.decisions.template: written into the same ConfigMap, passed as --decision-template.
DECISION_TEMPLATE_FILE = "decision-template.txt"
DECISION_TEMPLATE_PATH = f"{CONFIG_DIR}/{DECISION_TEMPLATE_FILE}"
# The worker's built-in templates (worker/scorekeeper_worker/model/prompt_template.py BUILTIN; a test keeps them equal).
BUILTIN_PROMPT_TEMPLATES = ("qwen3-reranker",)

# Every flag the operator renders from the spec (plus the negations argparse accepts for boolean flags).
# spec.extraArgs may not set them; the CRD's CEL rule on extraArgs lists the same flags (a test keeps them equal).
RESERVED_FLAGS: tuple[str, ...] = (
    "--config", "--model", "--served-name", "--dtype", "--device", "--host", "--port",
    "--max-batch-tokens", "--max-queue-tokens", "--max-request-tokens", "--request-timeout-seconds",
    "--max-items-per-request", "--pooled-hidden-states", "--prompt-template", "--label-tokens",
    "--multi-item-scoring", "--no-multi-item-scoring", "--multi-item-scoring-delimiter",
    "--cuda-graph", "--no-cuda-graph", "--cuda-graph-token-buckets", "--cuda-graph-max-tokens",
    "--cuda-graph-max-seqs", "--drain-timeout-seconds", "--metrics-port", "--api-key-file",
    "--threads", "--quantization", "--quantization-min-spearman", "--quantization-max-score-delta",
    "--quantization-min-top10", "--decision-template", "--compile", "--compile-budget-seconds", "--compile-cache-dir",
)


def hf_snapshot_dir(repo: str, commit: str) -> str:
    """Where the init container puts one commit of a repository (in the cache PVC or the download emptyDir)."""
    return f"{MODEL_MOUNT}/{repo}/{commit}"
