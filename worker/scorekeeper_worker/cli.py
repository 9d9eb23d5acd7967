"""`scorekeeper-worker`: the command line. Flags may also come from `--config FILE` (YAML or JSON, keys are flag
names) or from `SCOREKEEPER_<FLAG>` environment variables; precedence is flag > environment > file > default.

A setting that cannot be used is one line on stderr naming where it came from (the flag, the variable, or the file
and key) and exit status 2, before anything heavy is imported."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from types import NoneType
from typing import Any, NoReturn, get_args

import yaml
from pydantic import ValidationError

from scorekeeper_worker.base.config import Quantization, WorkerConfig
from scorekeeper_worker.base.errors import DeviceUnavailable, ModelRefused, PortUnavailable, StartupRefused
from scorekeeper_worker.serving.startup import openmp_env  # no torch there

PROG = "scorekeeper-worker"
# oneDNN caches one compiled primitive per tensor shape, 1024 by default: with batches of every size that is memory
# growing for thousands of requests (docs/benchmarks.md). Read when oneDNN first runs, so set before torch loads.
PRIMITIVE_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
PRIMITIVE_CACHE_CAPACITY = 64
# ideep, torch's layer over oneDNN, keeps its own cache of operators keyed by shape (`LRU_CACHE_CAPACITY`, 1024 by
# default), each entry holding its primitive (about 300 KiB for a MiniLM linear layer): the oneDNN bound above does
# not free them. It was the +400 MB over 3,000 mixed-shape requests (issue 37; docs/benchmarks.md), on AVX2 and
# AVX-512 alike. 128 entries (about 25 token counts of a BERT layer's four linear shapes) bound it near 40 MB.
CACHE_BOUNDS = {PRIMITIVE_CACHE_VARIABLE: PRIMITIVE_CACHE_CAPACITY, "LRU_CACHE_CAPACITY": 128}
ENV_PREFIX = "SCOREKEEPER_"
_FIELDS = WorkerConfig.model_fields
TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y", "t"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", "n", "f"})


class ConfigError(ValueError):
    """A setting that cannot be used; the message names where it came from."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        self.exit(2, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def _default_help(name: str, help_text: str) -> str:
    """The suffix of a flag's help: its default (unless the text says it in its own words) and its variable."""
    env = f"env {ENV_PREFIX}{name.upper()}"
    field = _FIELDS[name]
    if field.is_required():
        return f"(required; {env})"
    if "(default" in help_text:
        return f"({env})"
    default = field.default
    if isinstance(default, tuple):
        default = ",".join(str(v) for v in default)
    return f"(default: {'none' if default is None else getattr(default, 'value', default)}; {env})"


def _reading(name: str) -> dict[str, Any]:
    """How argparse reads a setting's flag, from its WorkerConfig type: a boolean as --flag/--no-flag, a choice among
    an enum's values, a number or a path converted; anything else as text, for WorkerConfig to parse."""
    kinds = [kind for kind in get_args(_FIELDS[name].annotation) or (_FIELDS[name].annotation,) if kind is not NoneType]
    kind = kinds[0] if len(kinds) == 1 else None
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        return {"choices": [member.value for member in kind]}
    return {"type": kind} if kind in (int, float, Path) else {}


def build_parser() -> argparse.ArgumentParser:
    """The real parser; the operator's contract test parses rendered args with it."""
    parser = _Parser(prog=PROG, description="Transformer scoring worker.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve POST /v1/score for one model",
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    def add(flag: str, help_text: str) -> None:
        name = flag.removeprefix("--").replace("-", "_")
        serve.add_argument(flag, dest=name, default=argparse.SUPPRESS,
                           help=f"{help_text} {_default_help(name, help_text)}",
                           **_reading(name))

    serve.add_argument("--config", type=Path, default=None,
                       help="YAML/JSON file whose keys are flag names (e.g. max_batch_tokens: 4096)")
    add("--model", "local Hugging Face model directory or .gguf file")
    add("--served-name", "the model's name: listed by /v1/models, and in the response to a request that names no "
        "model (a request may name any)")
    add("--dtype", "weights and activations dtype; auto: the checkpoint's dtype where the device runs it fast "
        "(float32 on CPUs without bfloat16 instructions, float16 on GPUs without bfloat16), and bfloat16 for a "
        "float32 checkpoint on CPUs with AMX")
    add("--device", "where the model runs")
    add("--host", "listen address (0.0.0.0: every interface, as in a container)")
    add("--port", "listen port of the API (and of /metrics without --metrics-port)")
    add("--metrics-port", "serve /metrics on this port alone, and no longer on --port")
    add("--api-key-file", "file of API keys, one per line (re-read when it changes): /v1/* then need "
        "Authorization: Bearer KEY")
    add("--max-batch-tokens", "token budget of one packed forward pass")
    add("--onednn-linear", "on CPU in float32, run linear layers through oneDNN on weights prepacked at load, with "
        "the bias and a following GELU fused (--no-onednn-linear: torch's nn.Linear)")
    add("--max-queue-tokens", "tokens admitted but not yet scored; beyond it requests get 429")
    add("--max-request-bytes", "largest accepted request body; beyond it 413")
    add("--max-request-tokens", "most tokens one request may run through the model once planned (multi-item "
        "chunks repeat the query); beyond it 413")
    add("--max-response-bytes", "largest response a request may ask for (pooled hidden states, label scores); "
        "beyond it 400 before any work")
    add("--max-intermediate-bytes", "largest tensor one request may make the worker hold at once (score rows, "
        "label rows of the output embedding, pooled rows, its longest sequence's activations: docs/api.md); "
        "beyond it 400 before any forward")
    add("--request-timeout-seconds", "answer 504 and drop a request's remaining work after this long "
        "(default: no timeout)")
    add("--max-items-per-request", "largest number of items in one request; beyond it 400")
    add("--pooled-hidden-states", "whether requests may ask for pooled hidden states")
    add("--prompt-template", "LLM rerankers: wrap every (query, item) pair of a decoder model in this prompt: a "
        "built-in name (qwen3-reranker) or a text file with {instruct}, {query} and {item} (used byte for byte); "
        "the text before {item} is shared by all items of a request (default: none)")
    add("--label-tokens", "comma-separated label tokens as text, spaces kept (\" yes, no\"); at least two, each "
        "one token of the model's tokenizer; the default label_token_ids of a causal LM, the first one's softmax "
        "over them /v1/rerank's relevance (default: none, or the built-in template's)")
    add("--multi-item-scoring", "score all items of a request in one packed sequence sharing the query "
        "(decoder models)")
    add("--multi-item-scoring-delimiter", "token id placed between query and items (SGLang layout); implies "
        "--multi-item-scoring; no token attends to it")
    add("--cuda-graph", "capture CUDA graphs per token bucket (on CPU: run the same padded path, no capture)")
    add("--cuda-graph-token-buckets", "comma-separated, strictly increasing total-token buckets")
    add("--cuda-graph-max-tokens", "batches above this many tokens run eager")
    add("--cuda-graph-max-seqs", "sequence slots captured per bucket")
    add("--attention-backend", "attention implementation")
    add("--compile", "torch.compile each trunk layer (one code object for all layers) in the graph buckets and for "
        "eager batches; auto: off until proven on a GPU (docs/gpu.md)")
    add("--compile-budget-seconds", "start-up compile time after which buckets not yet compiled run plain layers")
    add("--compile-cache-dir", "directory for Inductor's and Triton's caches and torch.compile's cache artifacts "
        "(mount a volume there so a restart skips most of the compile)")
    add("--pipeline-depth", "forward batches in flight on a GPU: 2 packs and enqueues the next batch while one runs, "
        "so the device never waits for the host; 1 finishes each batch before forming the next")
    add("--simulate-device-ms", "benchmarks only: after the start-up self-check, replace every forward by a "
        "simulated device that takes this many milliseconds per 8,192 tokens and computes nothing (scores are "
        "meaningless), to measure the host's side of the pipeline (docs/gpu.md; default: off)")
    add("--drain-timeout-seconds", "on SIGTERM, how long in-flight requests may take to finish")
    add("--http-header-timeout-seconds", "a connection must deliver a request's head (request line and headers) "
        "within this long of opening, or of the request's first byte on a kept-alive connection; else 408 and "
        "closed (both ports)")
    add("--http-body-timeout-seconds", "a request's body must arrive within this long of its head; else 408 and "
        "closed")
    add("--http-idle-timeout-seconds", "a kept-alive connection with no new request for this long is closed")
    add("--max-connections", "open connections per port (API, metrics); beyond it the oldest connection still "
        "waiting for a request head is closed, or, if none waits, the new one gets 503 (clamped to what the "
        "process's file-descriptor limit allows)")
    add("--self-check", "at start-up, score a fixed probe set through the engine and through plain transformers "
        "and refuse to start if they differ beyond the dtype's tolerance")
    add("--gc-freeze", "once the model is loaded, collect garbage and move every surviving object to Python's "
        "permanent generation, so full collections no longer walk them (docs/operations.md)")
    add("--termination-log", "file that gets a one-paragraph reason when the model fails to load or the self-check "
        "fails (Kubernetes terminationMessagePath)")
    add("--log-level", "logging level")
    add("--threads", "CPU threads for the model (torch intra-op; inter-op matches): auto = the smaller of the "
        "cgroup CPU quota and the CPU affinity mask, or a positive number")
    add("--openmp-runtime", "OpenMP runtime of torch's CPU threads: intel = Intel's libiomp5 (pip install "
        "intel-openmp) and TCMalloc where installed (not with --quantization int8), preloaded by re-executing the "
        "worker once, with KMP_BLOCKTIME=1 unless the environment sets OpenMP's wait itself; gnu = torch's own "
        "libgomp; auto = intel on CPU where libiomp5 is installed, else gnu (docs/operations.md)")
    add("--quantization", "int8: run the model quantized to int8 on CPU (encoder cross-encoders and embedding "
        "models), only after it passes an accuracy certificate against float32 (docs/operations.md)")
    add("--quantization-min-spearman", "certificate: refuse to become ready below this Spearman correlation of "
        "int8 scores with float32 scores on the fixed probe set")
    add("--quantization-max-score-delta", "certificate: refuse to become ready above this largest |int8 - float32| "
        "score difference (default: no bound)")
    add("--quantization-min-top10", "certificate: refuse to become ready below this share of top-10 agreement "
        "between int8 and float32 rankings (default: no bound)")
    add("--quantization-min-speedup", "certificate: refuse to become ready when int8 scores the probe set at less "
        "than this multiple of float32's speed (default 1: int8 must be faster; 0: no bound)")
    add("--quantization-float32-modules", "int8: comma-separated regular expressions of trunk module paths whose "
        "linear layers stay float32, for accuracy (e.g. encoder.layer.[0-2].output.dense), replacing the default: "
        "the feed-forward output projections of the first three layers, found by their shape in any encoder; "
        "an empty value quantizes every linear layer")
    add("--decision-template", "/v1/decisions and /v1/systemone (causal LMs): a Jinja file in the chat-template "
        "language that renders a conversation ending in one question into the prompt, replacing the built-in one "
        "(the model's own chat template; docs/decisions.md)")
    return parser


def _boolean(variable: str, raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise ConfigError(f"{variable}={raw!r} is not a boolean: use true/false, yes/no, on/off or 1/0")


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, field in _FIELDS.items():
        variable = ENV_PREFIX + name.upper()
        raw = environ.get(variable)
        if raw is not None:
            values[name] = _boolean(variable, raw) if field.annotation is bool else raw
    return values


def _from_file(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"--config {path}: {' '.join(str(error).split())}") from None
    if not isinstance(loaded, dict | None):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values")
    return {str(k).replace("-", "_"): v for k, v in (loaded or {}).items()}


def _describe(error: ValidationError, sources: Mapping[str, str]) -> str:
    parts = []
    for detail in error.errors():
        message = str(detail["msg"]).removeprefix("Value error, ")
        if not detail["loc"]:  # a rule across settings: its message names them
            parts.append(message)
            continue
        name = str(detail["loc"][0])
        source = sources.get(name, "--" + name.replace("_", "-"))
        given = detail.get("input")
        shown = f"{source}={given!r}" if isinstance(given, str | int | float) else source
        parts.append(f"{shown}: {message}")
    return "; ".join(parts)


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> WorkerConfig:
    """argv (without the program name, starting with `serve`) → validated WorkerConfig; ConfigError otherwise."""
    args = vars(build_parser().parse_args(list(argv)))
    args.pop("command")
    config_file: Path | None = args.pop("config", None)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is not None:
        values.update(_from_file(config_file))
        sources.update({name: f"--config {config_file}: {name}" for name in values})
    from_env = _from_env(os.environ if environ is None else environ)
    values.update(from_env)
    sources.update({name: ENV_PREFIX + name.upper() for name in from_env})
    values.update(args)
    sources.update({name: "--" + name.replace("_", "-") for name in args})
    try:
        return WorkerConfig.model_validate(values)
    except ValidationError as error:
        raise ConfigError(_describe(error, sources)) from None


def bound_primitive_cache(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """The worker's bounds on oneDNN's primitive cache and ideep's operator cache, unless the environment sets
    them."""
    for variable, capacity in CACHE_BOUNDS.items():
        environ.setdefault(variable, str(capacity))


def main(argv: Sequence[str] | None = None) -> None:
    given, argv = argv, sys.argv[1:] if argv is None else argv
    try:
        config = parse_config(argv)
        libiomp = openmp_env.find_libiomp()
        try:
            runtime = openmp_env.resolve_runtime(config.openmp_runtime, config.device, libiomp)
        except openmp_env.RuntimeMissing as error:
            raise ConfigError(str(error)) from None
        if config.api_key_file is not None:
            from scorekeeper_worker.api.middleware.auth import ApiKeys, KeyFileError

            try:
                ApiKeys(config.api_key_file)  # refuse a missing or empty key file before loading anything
            except KeyFileError as error:
                raise ConfigError(str(error)) from None
        if config.prompt_template is not None:
            from scorekeeper_worker.model.templates.prompt_template import TemplateError, load_template

            try:
                load_template(config.prompt_template)  # a missing file or a broken template: before loading
            except TemplateError as error:
                raise ConfigError(str(error)) from None
        if config.decision_template is not None:
            from scorekeeper_worker.model.templates.decision_template import (
                DecisionTemplateError,
                load_decision_template,
            )

            try:
                load_decision_template(config.decision_template)  # the same, for the decision template
            except DecisionTemplateError as error:
                raise ConfigError(str(error)) from None
    except ConfigError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        sys.exit(2)  # argparse's status for a usage error
    # Both before anything imports torch: the loader reads LD_PRELOAD at exec, libgomp its variables when it loads.
    openmp_env.reexec(runtime, libiomp, given, tcmalloc=config.quantization == Quantization.NONE)
    os.environ.update(openmp_env.openmp_defaults())
    bound_primitive_cache()
    from scorekeeper_worker.api import termination
    from scorekeeper_worker.api.server import run  # heavy imports (torch) only when serving

    try:
        run(config)
    except StartupRefused as refused:  # expected: one line and the status of its kind, never a traceback
        termination.write_termination_message(config.termination_log, str(refused))
        print(f"{PROG}: error: {refused}", file=sys.stderr)
        sys.exit({ModelRefused: termination.EXIT_LOAD_FAILED, PortUnavailable: termination.EXIT_PORT_UNAVAILABLE,
                  DeviceUnavailable: termination.EXIT_DEVICE_UNAVAILABLE}[type(refused)])


if __name__ == "__main__":
    main()
