"""Worker configuration: one typed object built from flags, environment and an optional config file."""

from __future__ import annotations

import itertools
import re
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class DType(StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    AUTO = "auto"


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class PooledHiddenStates(StrEnum):
    ALLOWED = "allowed"
    FORBIDDEN = "forbidden"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class CompileMode(StrEnum):
    AUTO = "auto"  # off until a GPU run proves the compiled trunk (docs/gpu.md); then on for CUDA
    ON = "on"
    OFF = "off"


class AttentionBackendName(StrEnum):
    AUTO = "auto"
    SDPA = "sdpa"
    FLEX = "flex"
    TRITON = "triton"


class Quantization(StrEnum):
    NONE = "none"
    INT8 = "int8"


class OpenMPRuntime(StrEnum):
    AUTO = "auto"  # intel on CPU where libiomp5 is installed, else gnu
    INTEL = "intel"  # Intel's libiomp5, preloaded by re-executing (serving/startup/openmp_env.py)
    GNU = "gnu"  # libgomp, which torch links


class WorkerConfig(BaseModel):
    """Everything `scorekeeper-worker serve` accepts; field names are the flag names with `_` for `-`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: Path
    served_name: str | None = None
    dtype: DType = DType.FLOAT32
    device: Device = Device.CPU
    host: str = "127.0.0.1"  # loopback unless asked: the operator and the image pass 0.0.0.0
    port: int = Field(8000, ge=1, le=65535)
    metrics_port: int | None = Field(None, ge=1, le=65535)
    api_key_file: Path | None = None
    max_batch_tokens: int = Field(8192, ge=16)
    onednn_linear: bool = True
    max_queue_tokens: int = Field(262144, ge=16)
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_request_tokens: int = Field(65536, ge=16)
    max_response_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_intermediate_bytes: int = Field(4 * 1024**3, ge=1024 * 1024)
    request_timeout_seconds: float | None = Field(None, gt=0)
    max_items_per_request: int = Field(4096, ge=1)
    pooled_hidden_states: PooledHiddenStates = PooledHiddenStates.ALLOWED
    prompt_template: str | None = Field(None, min_length=1)
    label_tokens: tuple[str, ...] | None = None
    multi_item_scoring: bool = False
    multi_item_scoring_delimiter: int | None = Field(None, ge=0)
    cuda_graph: bool = False
    cuda_graph_token_buckets: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    cuda_graph_max_tokens: int = Field(8192, ge=16)
    cuda_graph_max_seqs: int = Field(256, ge=1)
    attention_backend: AttentionBackendName = AttentionBackendName.AUTO
    compile: CompileMode = CompileMode.AUTO
    compile_budget_seconds: float = Field(600.0, gt=0)
    compile_cache_dir: Path | None = None
    pipeline_depth: int = Field(2, ge=1, le=2)
    simulate_device_ms: float | None = Field(None, gt=0)
    drain_timeout_seconds: float = Field(30.0, ge=0)
    http_header_timeout_seconds: float = Field(10.0, gt=0)
    http_body_timeout_seconds: float = Field(20.0, gt=0)
    http_idle_timeout_seconds: float = Field(5.0, gt=0)
    max_connections: int = Field(2048, ge=8)
    self_check: bool = True
    gc_freeze: bool = True
    termination_log: Path = Path("/dev/termination-log")
    log_level: LogLevel = LogLevel.INFO
    threads: int | Literal["auto"] = "auto"
    openmp_runtime: OpenMPRuntime = OpenMPRuntime.AUTO
    quantization: Quantization = Quantization.NONE
    quantization_min_spearman: float = Field(0.99, ge=-1, le=1)
    quantization_max_score_delta: float | None = Field(None, gt=0)
    quantization_min_top10: float | None = Field(None, ge=0, le=1)
    quantization_min_speedup: float = Field(1.0, ge=0)
    quantization_float32_modules: tuple[str, ...] | None = None  # None: the default (int8_trunk.ffn_output_modules)
    decision_template: Path | None = None

    @field_validator("threads", mode="before")
    @classmethod
    def _parse_threads(cls, value: object) -> object:
        if isinstance(value, str) and value.strip() != "auto":
            if not value.strip().isdigit() or int(value) < 1:
                raise ValueError(f"threads must be auto or a positive integer, not {value!r}")
            return int(value)
        return value.strip() if isinstance(value, str) else value

    @field_validator("cuda_graph_token_buckets", mode="before")
    @classmethod
    def _split_buckets(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(int(part) for part in value.split(",") if part.strip())
        return value

    @field_validator("quantization_float32_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        return tuple(part.strip() for part in value.split(",") if part.strip()) if isinstance(value, str) else value

    @field_validator("quantization_float32_modules")
    @classmethod
    def _check_modules(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for pattern in value or ():
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"quantization_float32_modules: {pattern!r} is not a regular expression: "
                                 f"{error}") from None
        return value

    @field_validator("label_tokens", mode="before")
    @classmethod
    def _split_labels(cls, value: object) -> object:
        # Comma-separated; spaces are kept: " yes" is the token for a space followed by "yes".
        return tuple(value.split(",")) if isinstance(value, str) else value

    @field_validator("label_tokens")
    @classmethod
    def _check_labels(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            if not value or any(label == "" for label in value):
                raise ValueError("label tokens must be non-empty strings, separated by commas (\" yes, no\")")
            if len(set(value)) != len(value):
                raise ValueError(f"label tokens must differ: {list(value)}")
            if len(value) == 1:  # relevance is softmax(logits[labels])[0]: 1.0 over one label
                raise ValueError(f"a single label token ({value[0]!r}) would make every /v1/rerank relevance 1.0 "
                                 "(a softmax over the label tokens); give it with its alternatives, e.g. \" yes, no\"")
        return value

    @model_validator(mode="after")
    def _check(self) -> WorkerConfig:
        buckets = self.cuda_graph_token_buckets
        if not buckets or any(b <= a for a, b in itertools.pairwise(buckets)):
            raise ValueError("cuda_graph_token_buckets must be non-empty and strictly increasing")
        if buckets[-1] > self.cuda_graph_max_tokens:
            raise ValueError("cuda_graph_token_buckets must not exceed cuda_graph_max_tokens")
        if self.metrics_port == self.port:
            raise ValueError("--metrics-port must differ from --port")
        if self.quantization == Quantization.INT8 and (self.device != Device.CPU or self.dtype not in (
                DType.FLOAT32, DType.AUTO)):
            raise ValueError("--quantization int8 runs on --device cpu and is quantized from float32 weights "
                             "(--dtype float32 or auto)")
        return self

    @property
    def mis_enabled(self) -> bool:
        """A delimiter implies multi-item scoring, as in SGLang."""
        return self.multi_item_scoring or self.multi_item_scoring_delimiter is not None

    @property
    def name(self) -> str:
        return self.served_name or self.model.name
