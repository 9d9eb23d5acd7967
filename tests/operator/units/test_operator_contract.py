"""The operator ↔ worker contract: rendered container args (and the ConfigMap's config file) are parsed by the
worker's real argument parser and config loader, and mean what the spec says."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from harness import scoring_model
from scorekeeper_operator.render.manifests import render
from scorekeeper_operator.spec import flags, worker_contract
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings
from scorekeeper_worker.base.config import WorkerConfig
from scorekeeper_worker.cli import build_parser, parse_config
from scorekeeper_worker.model.templates.prompt_template import BUILTIN, load_template

# A template given as text, with what a YAML round trip or a file write could lose: braces, quotes, a tab, non-ASCII
# text and the trailing blank line the prompt ends with.
CUSTOM_TEMPLATE = '<|im_start|>user\n{instruct}\tQuery: "{query}" — {other}\nDocument: {item}<|im_end|>\n\n'
DECISION_TEMPLATE = "Context: {input}\n\tQuestion — «{question}»\nAnswer:\n\n"
SPECS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gpu-mis-graphs": {
        "model": {"uri": "pvc://models/qwen3", "servedName": "rerank", "dtype": "bfloat16"},
        "scoring": {"multiItem": {"enabled": True, "delimiterTokenId": 151643, "maxItemsPerRequest": 512},
                    "maxBatchTokens": 16384, "maxQueueTokens": 65536, "maxRequestTokens": 32768,
                    "requestTimeoutSeconds": 30, "returnPooledHiddenStates": "forbidden"},
        "cudaGraph": {"enabled": True, "tokenBuckets": [256, 512, 1024], "maxTokens": 2048, "maxSequences": 64},
        "resources": {"gpu": {"count": 1}}, "rollout": {"drainSeconds": 12}},
    "cpu-mis-without-delimiter": {"model": {"uri": "file:///opt/m", "dtype": "float32"},
                                  "scoring": {"multiItem": {"enabled": True}}, "cudaGraph": {"enabled": False}},
    "gpu-graphs-off-extra-args": {"resources": {"gpu": {"count": 1}}, "cudaGraph": {"enabled": False},
                                  "extraArgs": ["--attention-backend", "sdpa", "--log-level=debug"]},
    "hf": {"model": {"uri": "hf://org/name", "revision": "0123456789abcdef0123456789abcdef01234567"}},
    "hf-gguf": {"model": {"uri": "hf://org/name-GGUF/m.Q4_K_M.gguf", "revision": "a" * 40}},
    "gpu-without-bfloat16": {"model": {"uri": "pvc://models/qwen3", "dtype": "float16"},
                             "resources": {"gpu": {"count": 1}}},
    "api-keys": {"auth": {"apiKeySecretRef": {"name": "scorer-keys", "key": "keys"}}},
    "qwen3-reranker": {"scoring": {"promptTemplate": "qwen3-reranker", "multiItem": {"enabled": True}}},
    "own-template-and-labels": {"scoring": {"promptTemplate": CUSTOM_TEMPLATE, "labelTokens": [" Yes", " No"]}},
    "cpu-int8-decisions": {"resources": {"cpu": 3.5, "memory": "4Gi"}, "scoring": {
        "quantization": "int8", "quantizationCertificate": {"minSpearman": 0.995, "maxScoreDelta": 0.05},
        "decisions": {"template": DECISION_TEMPLATE}}},
    "int8-default-certificate": {"resources": {"cpu": "500m"}, "scoring": {"quantization": "int8"}},
    "gpu-compiled": {"resources": {"gpu": {"count": 1}},
                     "compile": {"mode": "on", "budgetSeconds": 300, "cacheDir": "/compile-cache"}},
}


def rendered_for(spec: dict[str, Any]) -> tuple[ScoringModel, list[str], str]:
    body = scoring_model("reranker", **spec)
    body["metadata"]["uid"] = "uid"
    model = ScoringModel.from_body(body)
    rendered = render(model, OperatorSettings(), service_monitor_api=False)
    deployment = rendered.get("Deployment")
    configmap = rendered.get("ConfigMap")
    assert deployment is not None and configmap is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["scorekeeper-worker"]
    return model, container["args"], configmap["data"][worker_contract.CONFIG_FILE]


def serve_help_flags() -> set[str]:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return set(re.findall(r"--[a-z][-a-z]*", serve.format_help()))


def with_config_file(args: list[str], config_text: str, tmp_path: Path) -> list[str]:
    """The pod mounts the ConfigMap at worker_contract.CONFIG_PATH; here the same text lives in a temporary file."""
    config = tmp_path / worker_contract.CONFIG_FILE
    config.write_text(config_text)
    return [str(config) if arg == worker_contract.CONFIG_PATH else arg for arg in args]


@pytest.mark.parametrize("name", SPECS)
def test_every_rendered_flag_exists_in_serve_help(name: str) -> None:
    _, args, _ = rendered_for(SPECS[name])
    assert args[0] == "serve"
    rendered = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    assert rendered - serve_help_flags() == set()


@pytest.mark.parametrize("name", SPECS)
def test_rendered_args_parse_to_the_intended_config(name: str, tmp_path: Path) -> None:
    model, args, config_text = rendered_for(SPECS[name])
    config = parse_config(with_config_file(args, config_text, tmp_path), environ={})
    spec = model.spec
    mis = spec.scoring.multi_item
    assert str(config.model) == flags.model_path(spec.model.uri, model.hf_commit)
    assert config.served_name == model.served_name
    assert config.dtype.value == spec.model.dtype.value
    assert config.device.value == ("cuda" if spec.resources.gpu.count else "cpu")
    assert config.port == worker_contract.WORKER_PORT
    assert config.max_batch_tokens == spec.scoring.max_batch_tokens
    assert config.max_queue_tokens == spec.scoring.max_queue_tokens
    assert config.max_request_tokens == spec.scoring.max_request_tokens
    assert config.request_timeout_seconds == spec.scoring.request_timeout_seconds
    assert config.max_items_per_request == mis.max_items_per_request
    assert config.pooled_hidden_states.value == spec.scoring.return_pooled_hidden_states.value
    assert config.multi_item_scoring == mis.enabled
    assert config.multi_item_scoring_delimiter == mis.delimiter_token_id
    assert config.cuda_graph == spec.cuda_graph_enabled == (spec.cuda_graph.enabled
                                                            if spec.cuda_graph.enabled is not None
                                                            else spec.resources.gpu.count > 0)
    assert config.cuda_graph_token_buckets == spec.cuda_graph.token_buckets
    assert config.cuda_graph_max_tokens == spec.cuda_graph.max_tokens
    assert config.cuda_graph_max_seqs == spec.cuda_graph.max_sequences
    assert config.drain_timeout_seconds == spec.rollout.drain_seconds
    assert config.host == "0.0.0.0"  # the worker's own default is loopback
    assert config.metrics_port == worker_contract.METRICS_PORT  # always: the Service's metrics port targets it
    assert config.api_key_file == (None if spec.auth.api_key_secret_ref is None else Path(worker_contract.API_KEY_PATH))
    template = spec.scoring.prompt_template
    rendered_template = template if template in (None, "qwen3-reranker") else worker_contract.PROMPT_TEMPLATE_PATH
    assert config.prompt_template == rendered_template
    labels = spec.scoring.label_tokens
    assert config.label_tokens == labels
    assert config.threads == pod_threads(model)
    assert config.quantization.value == spec.scoring.quantization.value
    certificate = spec.scoring.quantization_certificate
    worker_defaults = WorkerConfig.model_fields
    for name in ("min_spearman", "max_score_delta", "min_top10", "min_speedup"):
        wanted = getattr(certificate, name) if certificate is not None else None
        default = worker_defaults[f"quantization_{name}"].default
        assert getattr(config, f"quantization_{name}") == (default if wanted is None else wanted)
    decisions = spec.scoring.decisions.template
    assert config.decision_template == (None if decisions is None else Path(worker_contract.DECISION_TEMPLATE_PATH))


def pod_threads(model: ScoringModel) -> int | str:
    """What --threads should be, read off the rendered pod: its CPU limit, else its request, whole CPUs rounded down
    (at least 1); the worker's `auto` when the pod names neither."""
    deployment = render(model, OperatorSettings(), service_monitor_api=False).get("Deployment")
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]  # type: ignore[index]
    cpu = resources.get("limits", {}).get("cpu") or resources.get("requests", {}).get("cpu")
    if cpu is None:
        return "auto"
    text = str(cpu)  # CPU quantities in these cases: plain numbers or millicores
    return max(1, math.floor(Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)))


@pytest.mark.parametrize(("cpu", "threads"), [(None, "auto"), ("500m", 1), (1.5, 1), ("2", 2), ("2500m", 2),
                                              (16, 16), ("0.999", 1)])
def test_threads_follow_the_pods_cpus(cpu: Any, threads: int | str, tmp_path: Path) -> None:
    model, args, config_text = rendered_for({"resources": {} if cpu is None else {"cpu": cpu}})
    assert pod_threads(model) == threads
    assert parse_config(with_config_file(args, config_text, tmp_path), environ={}).threads == threads
    assert ("--threads" in args) is (cpu is not None)  # nothing rendered: the worker's own auto


def test_the_decision_template_reaches_the_pod_byte_for_byte(tmp_path: Path) -> None:
    model, args, _ = rendered_for(SPECS["cpu-int8-decisions"])
    configmap = render(model, OperatorSettings(), service_monitor_api=False).get("ConfigMap")
    assert configmap is not None
    assert configmap["data"][worker_contract.DECISION_TEMPLATE_FILE] == DECISION_TEMPLATE
    for file, text in configmap["data"].items():
        (tmp_path / file).write_bytes(text.encode())
    config = parse_config([a.replace(worker_contract.CONFIG_DIR, str(tmp_path)) for a in args], environ={})
    assert config.decision_template is not None and config.decision_template.read_text() == DECISION_TEMPLATE


@pytest.mark.parametrize("name", ["qwen3-reranker", "own-template-and-labels"])
def test_the_worker_loads_the_rendered_template(name: str, tmp_path: Path) -> None:
    """What the pod sees: the ConfigMap's files in worker_contract.CONFIG_DIR, read by the worker's template loader."""
    model, args, _ = rendered_for(SPECS[name])
    configmap = render(model, OperatorSettings(), service_monitor_api=False).get("ConfigMap")
    assert configmap is not None
    for file, text in configmap["data"].items():
        (tmp_path / file).write_text(text)
    config = parse_config([a.replace(worker_contract.CONFIG_DIR, str(tmp_path)) for a in args], environ={})
    assert config.prompt_template is not None
    template = load_template(config.prompt_template.replace(worker_contract.CONFIG_DIR, str(tmp_path)))
    if name == "qwen3-reranker":
        assert template is BUILTIN["qwen3-reranker"] and set(configmap["data"]) == {worker_contract.CONFIG_FILE}
    else:
        assert template.render("Q", "D", "I") == CUSTOM_TEMPLATE.replace("{instruct}", "I").replace(
            "{query}", "Q").replace("{item}", "D")


def test_the_operator_knows_the_worker_s_built_in_templates() -> None:
    assert set(worker_contract.BUILTIN_PROMPT_TEMPLATES) == set(BUILTIN)


@pytest.mark.parametrize("name", SPECS)
def test_flags_and_config_file_agree(name: str, tmp_path: Path) -> None:
    """The ConfigMap's file alone (no flags) gives the same worker config as the flags alone."""
    _, args, config_text = rendered_for(SPECS[name])
    without_file = [a for i, a in enumerate(args) if a != "--config" and (i == 0 or args[i - 1] != "--config")]
    from_flags = parse_config(without_file, environ={})
    config_file = tmp_path / worker_contract.CONFIG_FILE
    config_file.write_text(config_text)
    from_file = parse_config(["serve", "--config", str(config_file)], environ={})
    extra = {"attention_backend", "log_level"}  # set by extraArgs, which only the flags carry
    assert from_file.model_dump(exclude=extra) == from_flags.model_dump(exclude=extra)


def test_extra_args_cannot_override_rendered_flags(tmp_path: Path) -> None:
    """extraArgs come first, so even an abbreviation the API let through loses to the rendered flag."""
    model, _, _ = rendered_for({})
    spec = model.spec.model_copy(update={"extra_args": ("--served", "hijacked")})  # skips spec validation
    args = flags.worker_args(model.model_copy(update={"spec": spec}))
    config = parse_config(with_config_file(args, "{}", tmp_path), environ={})
    assert config.served_name == "reranker"


def test_rendered_flags_are_all_reserved() -> None:
    """Every flag the operator renders is one extraArgs may not set (spec validation and the CEL rule)."""
    for spec in SPECS.values():
        _, args, _ = rendered_for(spec)
        user = set(ScoringModel.from_body({**scoring_model(**spec), "metadata": {"name": "x"}}).spec.extra_args)
        rendered = {a for a in args if a.startswith("--") and a not in user and a.split("=")[0] not in user}
        assert rendered <= set(worker_contract.RESERVED_FLAGS)


def test_worker_config_keys_are_worker_fields() -> None:
    model, _, _ = rendered_for(SPECS["gpu-mis-graphs"])
    assert set(flags.worker_config(model)) <= set(WorkerConfig.model_fields)
