"""ScoringModel spec → typed, validated config. Every default lives here (and, identically, in the CRD schema).

The CRD's schema and CEL rules reject most bad objects at the API; these models repeat those rules (objects created
before a rule existed, or with validation off, still arrive) and add what only the operator can check. A
`pydantic.ValidationError` from `ScoringModel.from_body` becomes `ConfigValid=False`, never a crash loop.
"""

from __future__ import annotations

import itertools
import re
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from scorekeeper_operator.spec.base import Spec
from scorekeeper_operator.spec.compile import Compile
from scorekeeper_operator.spec.pod import NetworkPolicy, PodOptions
from scorekeeper_operator.spec.quantity import QUANTITY_PATTERN, quantities_as_strings
from scorekeeper_operator.spec.worker_contract import BUILTIN_PROMPT_TEMPLATES, RESERVED_FLAGS

_URI = re.compile(r"^(?P<scheme>pvc|hf|file)://(?P<rest>.+)$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# hf://org/name, or hf://org/name/path/file.gguf for one GGUF file of a repository that holds several
_HF_PATH = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(/[^/].*\.gguf)?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_DOWNLOAD_SIZE_LIMIT = "20Gi"
INT8_ON_GPU_MESSAGE = ("scoring.quantization int8 runs the model on CPU: it needs resources.gpu.count 0 (on a GPU,"
                       " use model.dtype bfloat16 or float16)")
GPU_COUNT_MESSAGE = ("resources.gpu.count must be 0 or 1: a worker runs its model on one GPU, so every further GPU"
                     " would be reserved and idle; scale out with replicas (one GPU each) instead")


class InvalidSpec(ValueError):
    """The object cannot be served as written; the message names the field and becomes ConfigValid=False."""


class DType(StrEnum):
    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"  # GPUs without bfloat16 (T4, V100)


class RolloutStrategy(StrEnum):
    RECREATE = "Recreate"
    ROLLING_UPDATE = "RollingUpdate"


class SecretKeyRef(Spec):
    name: str = Field(min_length=1, max_length=253)
    key: str = Field("token", min_length=1, max_length=253)


class ModelCache(Spec):
    claim_name: str = Field(min_length=1, max_length=253)


class ApiKeySecretRef(Spec):
    name: str = Field(min_length=1, max_length=253)
    key: str = Field("keys", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class Auth(Spec):
    api_key_secret_ref: ApiKeySecretRef | None = None  # mounted read-only; the worker gets --api-key-file


class ModelSource(Spec):
    uri: str = Field(max_length=1024)
    revision: str | None = Field(None, max_length=128)
    served_name: str | None = Field(None, min_length=1, max_length=253)
    dtype: DType = DType.AUTO
    token_secret_ref: SecretKeyRef | None = None
    cache: ModelCache | None = None  # hf:// only: a PVC shared by pods and restarts, keyed by repository and commit
    download_size_limit: str | None = Field(None, pattern=QUANTITY_PATTERN)  # hf:// only; None: 20Gi

    @model_validator(mode="before")
    @classmethod
    def _size_as_string(cls, data: Any) -> Any:
        return quantities_as_strings(data, ("downloadSizeLimit",))

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def hf_repo(self) -> str:
        """org/name of an hf:// URI."""
        return "/".join(self.uri.removeprefix("hf://").split("/")[:2])

    @property
    def hf_file(self) -> str | None:
        """The one file of hf://org/name/file.gguf; None: the model directory (config, tokenizer, safetensors)."""
        rest = self.uri.removeprefix("hf://").split("/", 2)
        return rest[2] if len(rest) == 3 else None

    @property
    def pinned_commit(self) -> str | None:
        """A revision written as a 40-hex commit needs no resolving (and no Hub access from the operator)."""
        return self.revision if self.revision is not None and COMMIT.match(self.revision) else None

    @property
    def size_limit(self) -> str:
        return self.download_size_limit or DEFAULT_DOWNLOAD_SIZE_LIMIT

    @model_validator(mode="after")
    def _check_uri(self) -> Self:
        match = _URI.match(self.uri)
        if match is None:
            raise ValueError(f"model.uri {self.uri!r} must start with pvc://, hf:// or file:///")
        rest = match["rest"]
        if match["scheme"] == "file" and not rest.startswith("/"):
            raise ValueError("file:// URIs must be absolute: file:///path")
        if match["scheme"] == "hf" and not _HF_PATH.match(rest):
            raise ValueError("hf:// URIs must name a repository: hf://org/name (or hf://org/name/file.gguf)")
        hf_only = (self.revision, self.token_secret_ref, self.cache, self.download_size_limit)
        if match["scheme"] != "hf" and any(v is not None for v in hf_only):
            raise ValueError("model.revision, tokenSecretRef, cache and downloadSizeLimit apply only to hf:// models")
        return self


class MultiItem(Spec):
    enabled: bool = False
    delimiter_token_id: int | None = Field(None, ge=0, le=2**31 - 1)
    max_items_per_request: int = Field(4096, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _delimiter_needs_mis(self) -> Self:
        if self.delimiter_token_id is not None and not self.enabled:
            raise ValueError("scoring.multiItem.delimiterTokenId requires scoring.multiItem.enabled")
        return self


class PooledHiddenStates(StrEnum):
    ALLOWED = "allowed"
    FORBIDDEN = "forbidden"


class Quantization(StrEnum):
    NONE = "none"
    INT8 = "int8"  # CPU only; the worker starts only with an accuracy certificate against float32


class QuantizationCertificate(Spec):
    """The worker's certificate thresholds (--quantization-min-spearman, ...); unset: the worker's defaults."""

    min_spearman: float | None = Field(None, ge=-1, le=1)
    max_score_delta: float | None = Field(None, gt=0)
    min_top10: float | None = Field(None, ge=0, le=1)
    min_speedup: float | None = Field(None, ge=0)


class Decisions(Spec):
    # /v1/decisions: the prompt template text that replaces the worker's built-in one (written into the ConfigMap).
    template: str | None = Field(None, min_length=1, max_length=65536)


# Rendered into the worker's comma-separated --label-tokens, hence no commas (the CRD's pattern says the same).
LabelToken = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^,]+$")]


class Scoring(Spec):
    multi_item: MultiItem = MultiItem()
    max_batch_tokens: int = Field(8192, ge=16, le=16_777_216)
    max_queue_tokens: int = Field(262144, ge=16, le=1_073_741_824)
    max_request_tokens: int = Field(65536, ge=16, le=1_073_741_824)
    request_timeout_seconds: int | None = Field(None, ge=1, le=86400)
    return_pooled_hidden_states: PooledHiddenStates = PooledHiddenStates.ALLOWED
    # A built-in template's name, or the template text itself (written into the worker's ConfigMap).
    prompt_template: str | None = Field(None, min_length=1, max_length=65536)
    label_tokens: tuple[LabelToken, ...] | None = Field(None, min_length=1, max_length=64)
    quantization: Quantization = Quantization.NONE
    quantization_certificate: QuantizationCertificate | None = None
    decisions: Decisions = Decisions()

    @model_validator(mode="after")
    def _prompt(self) -> Self:
        if self.quantization_certificate is not None and self.quantization is not Quantization.INT8:
            raise ValueError("scoring.quantizationCertificate applies only to scoring.quantization int8")
        template = self.prompt_template
        if template is not None and template not in BUILTIN_PROMPT_TEMPLATES and \
                (template.count("{item}") != 1 or template.count("{query}") != 1):
            raise ValueError("scoring.promptTemplate must be a built-in template "
                             f"({', '.join(BUILTIN_PROMPT_TEMPLATES)}) or a template text with {{query}} and {{item}} "
                             "once each")
        labels = self.label_tokens or ()
        if len(set(labels)) != len(labels):
            raise ValueError(f"scoring.labelTokens must be distinct: {list(labels)}")
        return self


class CudaGraph(Spec):
    enabled: bool | None = None  # None: on exactly when the model has a GPU (resolved in ScoringModelSpec)
    token_buckets: tuple[int, ...] = Field((256, 512, 1024, 2048, 4096, 8192), min_length=1, max_length=32)
    max_tokens: int = Field(8192, ge=16, le=16_777_216)
    max_sequences: int = Field(256, ge=1, le=65536)

    @model_validator(mode="after")
    def _buckets(self) -> Self:
        buckets = self.token_buckets
        if any(b < 1 for b in buckets) or any(b <= a for a, b in itertools.pairwise(buckets)):
            raise ValueError("cudaGraph.tokenBuckets must be positive and strictly increasing")
        if buckets[-1] > self.max_tokens:
            raise ValueError("cudaGraph.tokenBuckets must not exceed cudaGraph.maxTokens")
        return self


class Gpu(Spec):
    count: int = Field(0, ge=0, le=16)
    resource_name: str = Field("nvidia.com/gpu", max_length=253)

    @model_validator(mode="after")
    def _one_device(self) -> Self:
        if self.count > 1:
            raise ValueError(GPU_COUNT_MESSAGE)
        return self


class Resources(Spec):
    gpu: Gpu = Gpu()
    cpu: str | None = Field(None, pattern=QUANTITY_PATTERN)
    memory: str | None = Field(None, pattern=QUANTITY_PATTERN)
    shm_size: str | None = Field(None, pattern=QUANTITY_PATTERN)  # None: derived (render/pod.py: shm_size)

    @model_validator(mode="before")
    @classmethod
    def _quantities_as_strings(cls, data: Any) -> Any:
        return quantities_as_strings(data, ("cpu", "memory", "shmSize"))


class AutoscalerProvider(StrEnum):
    HPA = "HPA"  # a HorizontalPodAutoscaler on the Pods metric (needs a Prometheus adapter)
    KEDA = "KEDA"  # a KEDA ScaledObject with a Prometheus trigger (needs KEDA)


class Autoscaling(Spec):
    enabled: bool = False
    min_replicas: int = Field(1, ge=1, le=1000)
    max_replicas: int = Field(4, ge=1, le=1000)
    metric: str = Field("queueDepth", pattern="^queueDepth$")
    target: int = Field(16, ge=1, le=1_000_000)
    provider: AutoscalerProvider = AutoscalerProvider.HPA
    prometheus_address: str | None = Field(None, max_length=512, pattern=r"^https?://")
    prometheus_query: str | None = Field(None, min_length=1, max_length=2048)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        keda = self.provider is AutoscalerProvider.KEDA
        if keda and self.prometheus_address is None:
            raise ValueError("autoscaling.provider KEDA needs autoscaling.prometheusAddress")
        if not keda and (self.prometheus_address is not None or self.prometheus_query is not None):
            raise ValueError("autoscaling.prometheusAddress and prometheusQuery apply only to provider KEDA")
        return self


class Rollout(Spec):
    strategy: RolloutStrategy | None = None  # None: resolved from GPU count and replicas
    max_startup_seconds: int = Field(1800, ge=30, le=86400)
    # An unplaceable pod (no node fits, none on its way) is a wait this long, then the model is Degraded.
    scheduling_deadline_seconds: int = Field(600, ge=30, le=86400)
    drain_seconds: int = Field(30, ge=0, le=3600)
    # preStop pause before SIGTERM: endpoints, kube-proxy and load balancers stop sending to the pod meanwhile.
    pre_stop_seconds: int = Field(5, ge=0, le=300)


class Scheduling(Spec):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] = Field(default_factory=dict)
    priority_class_name: str | None = None

    @model_validator(mode="after")
    def _affinity_kinds(self) -> Self:
        # The CRD passes affinity through unchecked (x-kubernetes-preserve-unknown-fields), so check its shape here.
        unknown = set(self.affinity) - {"nodeAffinity", "podAffinity", "podAntiAffinity"}
        if unknown:
            raise ValueError(f"scheduling.affinity has unknown keys {sorted(unknown)}")
        return self


class Monitoring(Spec):
    service_monitor: bool = True
    interval: str = Field("30s", pattern=r"^[0-9]+(ms|s|m|h)$")
    labels: dict[str, str] = Field(default_factory=dict)


class ScoringModelSpec(Spec):
    model: ModelSource
    scoring: Scoring = Scoring()
    cuda_graph: CudaGraph = CudaGraph()
    compile: Compile = Compile()
    resources: Resources = Resources()
    replicas: int = Field(1, ge=0, le=1000)
    autoscaling: Autoscaling = Autoscaling()
    rollout: Rollout = Rollout()
    scheduling: Scheduling = Scheduling()
    image: str = Field("", max_length=512)
    extra_args: tuple[str, ...] = Field((), max_length=32)
    monitoring: Monitoring = Monitoring()
    pod: PodOptions = PodOptions()
    network_policy: NetworkPolicy = NetworkPolicy()
    auth: Auth = Auth()

    @model_validator(mode="after")
    def _int8_on_cpu(self) -> Self:
        if self.scoring.quantization is Quantization.INT8 and self.uses_gpu:
            raise ValueError(INT8_ON_GPU_MESSAGE)
        return self

    @model_validator(mode="after")
    def _extra_args(self) -> Self:
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            # argparse accepts unambiguous prefixes (--served for --served-name), which CEL cannot see
            clash = [f for f in RESERVED_FLAGS if f.startswith(flag)] if flag.startswith("--") else []
            if clash:
                raise ValueError(f"extraArgs {arg!r} sets (or abbreviates) {clash[0]}, which the operator renders")
        return self

    @property
    def uses_gpu(self) -> bool:
        return self.resources.gpu.count > 0

    @property
    def cuda_graph_enabled(self) -> bool:
        return self.uses_gpu if self.cuda_graph.enabled is None else self.cuda_graph.enabled

    @property
    def startup_seconds(self) -> int:
        """Start-up time a pod may take before it counts as failed: the rollout's, plus the compile budget."""
        return self.rollout.max_startup_seconds + self.compile.allowance_seconds(self.uses_gpu)

    @property
    def rollout_strategy(self) -> RolloutStrategy:
        if self.rollout.strategy is not None:
            return self.rollout.strategy
        single = self.replicas <= 1 and not self.autoscaling.enabled
        return RolloutStrategy.RECREATE if self.uses_gpu and single else RolloutStrategy.ROLLING_UPDATE


class ScoringModel(BaseModel):
    """One ScoringModel object: identity (for names and owner references) plus the typed spec."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str
    generation: int
    spec: ScoringModelSpec
    # The commit an hf:// revision resolved to, as recorded in status.model (None: not resolved yet, or not hf://).
    resolved_revision: str | None = None

    @property
    def served_name(self) -> str:
        return self.spec.model.served_name or self.name

    @property
    def hf_commit(self) -> str | None:
        """The commit every replica of an hf:// model downloads: the pinned revision, else the resolved one."""
        return self.spec.model.pinned_commit or self.resolved_revision

    def model_status(self) -> dict[str, str] | None:
        """status.model: which revision was resolved to which commit (hf:// only, once known)."""
        source = self.spec.model
        if source.scheme != "hf" or self.hf_commit is None:
            return None
        revision = {"revision": source.revision} if source.revision is not None else {}
        return {"uri": source.uri, **revision, "resolvedRevision": self.hf_commit}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ScoringModel:
        """Raises InvalidSpec with a message naming the offending field."""
        meta = body.get("metadata", {})
        name = meta.get("name", "")
        if not (len(name) <= 63 and _DNS1035.match(name)):
            raise InvalidSpec(f"metadata.name {name!r} must be a DNS-1035 label because it names the Service")
        try:
            spec = ScoringModelSpec.model_validate(body.get("spec") or {})
        except ValidationError as error:
            raise InvalidSpec("; ".join(_describe(e) for e in error.errors())) from None
        # A resolution is kept only while uri and revision are the ones it was made for.
        recorded = (body.get("status") or {}).get("model") or {}
        same = (recorded.get("uri"), recorded.get("revision")) == (spec.model.uri, spec.model.revision)
        resolved = recorded.get("resolvedRevision") if same and COMMIT.match(recorded.get("resolvedRevision") or "") \
            else None
        return cls(name=name, namespace=meta.get("namespace", ""), uid=meta.get("uid", ""),
                   generation=int(meta.get("generation") or 0), spec=spec, resolved_revision=resolved)


def _describe(error: Any) -> str:
    where = ".".join(["spec", *(str(part) for part in error["loc"])])
    return f"{where}: {error['msg'].removeprefix('Value error, ')}"
