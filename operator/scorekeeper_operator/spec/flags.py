"""The worker contract: spec → `scorekeeper-worker serve` flags and the matching `--config` file.

Flag names are the worker's (worker/scorekeeper_worker/cli.py); tests/operator parses what this module renders with
the worker's real parser, so a renamed flag fails CI, not a rollout.
"""

from __future__ import annotations

import math
from typing import Any

from scorekeeper_operator.spec.model import Quantization, ScoringModel
from scorekeeper_operator.spec.quantity import parse_quantity
from scorekeeper_operator.spec.worker_contract import (
    API_KEY_PATH,
    BUILTIN_PROMPT_TEMPLATES,
    CONFIG_PATH,
    DECISION_TEMPLATE_FILE,
    DECISION_TEMPLATE_PATH,
    METRICS_PORT,
    MODEL_MOUNT,
    PROMPT_TEMPLATE_FILE,
    PROMPT_TEMPLATE_PATH,
    WORKER_PORT,
    hf_snapshot_dir,
)


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


def pod_cpu(model: ScoringModel) -> str | None:
    """The CPUs the worker pod may use: its CPU limit, else its request. The operator renders a request only (no CPU
    limit: throttling a tokenizer-bound worker adds latency), so this is resources.cpu."""
    return model.spec.resources.cpu


def cpu_threads(cpu: str | None) -> int | None:
    """--threads for a pod of `cpu` CPUs: whole CPUs, rounded down, at least 1; None (the worker's `auto`: the cgroup
    quota and the affinity mask) when the pod names none."""
    return None if cpu is None else max(1, math.floor(parse_quantity(cpu)))


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
        "compile": spec.compile.mode.value,
        "compile_budget_seconds": spec.compile.budget_seconds,
        "drain_timeout_seconds": spec.rollout.drain_seconds,
        "metrics_port": METRICS_PORT,
    }
    if spec.compile.cache_dir is not None:
        config["compile_cache_dir"] = spec.compile.cache_dir
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
        config["label_tokens"] = list(spec.scoring.label_tokens)
    if (threads := cpu_threads(pod_cpu(model))) is not None:
        config["threads"] = threads
    config["quantization"] = spec.scoring.quantization.value
    certificate = spec.scoring.quantization_certificate
    if spec.scoring.quantization is Quantization.INT8 and certificate is not None:
        config.update({f"quantization_{name}": value for name, value in certificate.model_dump().items()
                       if value is not None})
    if spec.scoring.decisions.template is not None:
        config["decision_template"] = DECISION_TEMPLATE_PATH
    return config


def config_files(model: ScoringModel) -> dict[str, str]:
    """Files beside the config file in the worker's ConfigMap: a prompt template and a decision template given as
    text, byte for byte."""
    files: dict[str, str] = {}
    template = model.spec.scoring.prompt_template
    if template is not None and template not in BUILTIN_PROMPT_TEMPLATES:
        files[PROMPT_TEMPLATE_FILE] = template
    if model.spec.scoring.decisions.template is not None:
        files[DECISION_TEMPLATE_FILE] = model.spec.scoring.decisions.template
    return files


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
