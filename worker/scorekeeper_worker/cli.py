"""`scorekeeper-worker`: the command line. Flags may also come from `--config FILE` (YAML or JSON, keys are flag
names) or from `SCOREKEEPER_<FLAG>` environment variables; precedence is flag > environment > file > default."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from scorekeeper_worker.config import AttentionBackendName, Device, DType, PooledHiddenStates, WorkerConfig

ENV_PREFIX = "SCOREKEEPER_"
_FIELDS = WorkerConfig.model_fields


def _default_help(name: str) -> str:
    default = _FIELDS[name].default
    if isinstance(default, tuple):
        default = ",".join(str(v) for v in default)
    return f"(default: {default}; env {ENV_PREFIX}{name.upper()})"


def build_parser() -> argparse.ArgumentParser:
    """The real parser; the operator's contract test parses rendered args with it."""
    parser = argparse.ArgumentParser(prog="scorekeeper-worker", description="Transformer scoring worker.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve POST /v1/score for one model",
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    def add(flag: str, help_text: str, **kwargs: Any) -> None:
        name = flag.removeprefix("--").replace("-", "_")
        serve.add_argument(flag, dest=name, default=argparse.SUPPRESS,
                           help=f"{help_text} {_default_help(name) if name in _FIELDS else ''}".strip(), **kwargs)

    serve.add_argument("--config", type=Path, default=None,
                       help="YAML/JSON file whose keys are flag names (e.g. max_batch_tokens: 4096)")
    add("--model", "local Hugging Face model directory or .gguf file (required)", type=Path)
    add("--served-name", "model name reported by /v1/models (clients may send any name)")
    add("--dtype", "weights and activations dtype; auto: the checkpoint's dtype where the device runs it fast "
        "(float32 on CPUs without bfloat16 instructions, float16 on GPUs without bfloat16)",
        choices=[d.value for d in DType])
    add("--device", "where the model runs", choices=[d.value for d in Device])
    add("--host", "listen address")
    add("--port", "listen port", type=int)
    add("--max-batch-tokens", "token budget of one packed forward pass", type=int)
    add("--max-queue-tokens", "tokens admitted but not yet scored; beyond it requests get 429", type=int)
    add("--max-request-bytes", "largest accepted request body; beyond it 413", type=int)
    add("--max-items-per-request", "largest number of items in one request; beyond it 400", type=int)
    add("--pooled-hidden-states", "whether requests may ask for pooled hidden states",
        choices=[p.value for p in PooledHiddenStates])
    add("--multi-item-scoring", "score all items of a request in one packed sequence sharing the query "
        "(decoder models)", action=argparse.BooleanOptionalAction)
    add("--multi-item-scoring-delimiter", "token id placed between query and items (SGLang layout); implies "
        "--multi-item-scoring; no token attends to it", type=int)
    add("--cuda-graph", "capture CUDA graphs per token bucket (on CPU: run the same padded path, no capture)",
        action=argparse.BooleanOptionalAction)
    add("--cuda-graph-token-buckets", "comma-separated, strictly increasing total-token buckets")
    add("--cuda-graph-max-tokens", "batches above this many tokens run eager", type=int)
    add("--cuda-graph-max-seqs", "sequence slots captured per bucket", type=int)
    add("--attention-backend", "attention implementation", choices=[a.value for a in AttentionBackendName])
    add("--drain-timeout-seconds", "on SIGTERM, how long in-flight requests may take to finish", type=float)
    add("--self-check", "at start-up, score a fixed probe set through the engine and through plain transformers "
        "and refuse to start if they differ beyond the dtype's tolerance", action=argparse.BooleanOptionalAction)
    add("--termination-log", "file that gets a one-paragraph reason when the model fails to load or the self-check "
        "fails (Kubernetes terminationMessagePath)", type=Path)
    add("--log-level", "logging level", choices=["debug", "info", "warning", "error"])
    return parser


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _FIELDS:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = raw.lower() in {"1", "true", "yes"} if _FIELDS[name].annotation is bool else raw
    return values


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> WorkerConfig:
    """argv (without the program name, starting with `serve`) → validated WorkerConfig."""
    args = vars(build_parser().parse_args(list(argv)))
    args.pop("command")
    config_file: Path | None = args.pop("config", None)
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update({k.replace("-", "_"): v for k, v in (yaml.safe_load(config_file.read_text()) or {}).items()})
    values.update(_from_env(os.environ if environ is None else environ))
    values.update(args)
    return WorkerConfig.model_validate(values)


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = parse_config(argv)
    except ValidationError as error:
        build_parser().error(str(error))
    from scorekeeper_worker.server import run  # heavy imports (torch) only when serving

    run(config)


if __name__ == "__main__":
    main()
