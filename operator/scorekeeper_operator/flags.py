"""The worker contract: spec → `scorekeeper-worker serve` flags and the matching `--config` file.

Flag names are the worker's (worker/scorekeeper_worker/cli.py); tests/operator parses what this module renders with
the worker's real parser, so a renamed flag fails CI, not a rollout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # spec.py imports RESERVED_FLAGS from here
    from scorekeeper_operator.spec import ScoringModel

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
# The worker's built-in templates (worker/scorekeeper_worker/prompt_template.py BUILTIN; a test keeps them equal).
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
)


def hf_snapshot_dir(repo: str, commit: str) -> str:
    """Where the init container puts one commit of a repository (in the cache PVC or the download emptyDir)."""
    return f"{MODEL_MOUNT}/{repo}/{commit}"


def model_path(uri: str, commit: str | None = None) -> str:
    """Where the worker finds the weights: pvc://claim/sub → /models/sub, hf://org/name → /models/org/name/COMMIT
    (downloaded there by the init container; hf://org/name/f.gguf → that file inside it), file:///path → /path."""
    scheme, rest = uri.split("://", 1)
    if scheme == "pvc":
        _claim, _, sub = rest.partition("/")
        return f"{MODEL_MOUNT}/{sub}".rstrip("/") if sub else MODEL_MOUNT
    if scheme == "hf":
        if commit is None:
            raise ValueError(f"{uri}: the revision is not resolved to a commit yet")
        org, name, *file = rest.split("/", 2)
        return "/".join([hf_snapshot_dir(f"{org}/{name}", commit), *file])
    return rest  # file:///path → "/path"


def worker_config(model: ScoringModel) -> dict[str, Any]:
    """The effective worker configuration, keyed by the worker's field names (flag names with `_`)."""
    spec = model.spec
    mis = spec.scoring.multi_item
    config: dict[str, Any] = {
        "model": model_path(spec.model.uri, model.hf_commit),
        "served_name": model.served_name,
        "dtype": spec.model.dtype.value,
        "device": "cuda" if spec.uses_gpu else "cpu",
        "host": "0.0.0.0",
        "port": WORKER_PORT,
        "max_batch_tokens": spec.scoring.max_batch_tokens,
        "max_queue_tokens": spec.scoring.max_queue_tokens,
        "max_request_tokens": spec.scoring.max_request_tokens,
        "max_items_per_request": mis.max_items_per_request,
        "pooled_hidden_states": spec.scoring.return_pooled_hidden_states.value,
        "multi_item_scoring": mis.enabled,
        "cuda_graph": spec.cuda_graph_enabled,
        "cuda_graph_token_buckets": list(spec.cuda_graph.token_buckets),
        "cuda_graph_max_tokens": spec.cuda_graph.max_tokens,
        "cuda_graph_max_seqs": spec.cuda_graph.max_sequences,
        "drain_timeout_seconds": spec.rollout.drain_seconds,
        "metrics_port": METRICS_PORT,
    }
    if mis.delimiter_token_id is not None:
        config["multi_item_scoring_delimiter"] = mis.delimiter_token_id
    if spec.auth.api_key_secret_ref is not None:
        config["api_key_file"] = API_KEY_PATH
    if spec.scoring.request_timeout_seconds is not None:
        config["request_timeout_seconds"] = spec.scoring.request_timeout_seconds
    template = spec.scoring.prompt_template
    if template is not None:
        config["prompt_template"] = template if template in BUILTIN_PROMPT_TEMPLATES else PROMPT_TEMPLATE_PATH
    if spec.scoring.label_tokens is not None:
        config["label_tokens"] = spec.scoring.label_tokens
    return config


def config_files(model: ScoringModel) -> dict[str, str]:
    """Files beside the config file in the worker's ConfigMap: a prompt template given as text, byte for byte."""
    template = model.spec.scoring.prompt_template
    return {PROMPT_TEMPLATE_FILE: template} if template is not None and template not in BUILTIN_PROMPT_TEMPLATES \
        else {}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def worker_args(model: ScoringModel) -> list[str]:
    """Container args after the `scorekeeper-worker` command.

    User extraArgs come first so that the rendered flags, parsed later, win even against an argparse abbreviation.
    """
    args = ["serve", *model.spec.extra_args, "--config", CONFIG_PATH]
    for name, value in worker_config(model).items():
        if isinstance(value, bool):
            args.append(_flag(name) if value else _flag("no_" + name))
        elif isinstance(value, list):
            args += [_flag(name), ",".join(str(v) for v in value)]
        else:
            args += [_flag(name), str(value)]
    return args
