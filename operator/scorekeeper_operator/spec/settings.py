"""Operator-wide settings, read once from the environment (the Helm chart sets them on the operator Deployment)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_WORKER_IMAGE = "ghcr.io/scorekeeper/scorekeeper-worker:0.1.0"
DEFAULT_LIVENESS_ENDPOINT = "http://0.0.0.0:8080/healthz"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"


class OperatorSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    worker_image: str = Field(DEFAULT_WORKER_IMAGE, min_length=1)
    # Empty: watch all namespaces. Otherwise a comma-separated list (kopf's --namespace, repeated).
    namespaces: tuple[str, ...] = ()
    liveness_endpoint: str = DEFAULT_LIVENESS_ENDPOINT
    # Transient API errors are retried after base * 2**attempt seconds, capped.
    retry_base_seconds: float = Field(2.0, gt=0)
    retry_max_seconds: float = Field(300.0, gt=0)
    # Air-gapped clusters set this to false: hf:// models then need a pinned commit and a model.cache PVC that
    # already holds it (the init container only checks the cache); anything else gets ConfigValid=False.
    allow_hf_download: bool = True
    request_timeout_seconds: float = Field(30.0, gt=0)
    # The Hub (or an in-house mirror) the operator resolves revisions with and the init containers download from.
    hf_endpoint: str = Field(DEFAULT_HF_ENDPOINT, pattern=r"^https?://")
    # The operator's own token for resolving revisions of private or gated repositories (never given to pods).
    hf_token: str | None = Field(None, repr=False)
    # A new default worker image rolls out to this many ScoringModels at a time (each until its pods are ready).
    max_concurrent_upgrades: int = Field(1, ge=1, le=1000)
    # Port of the operator's Prometheus /metrics; 0: not served.
    metrics_port: int = Field(0, ge=0, le=65535)
    # Every model gets a full pass at least this often, whatever the watches delivered (or lost).
    resync_seconds: float = Field(600.0, gt=0)
    # While a pod is on its way (scheduling, mounting, loading), its Events are read again this often.
    poll_seconds: float = Field(30.0, gt=0)
    # Spec edits within this window of each other are rendered once (the first at once, the rest when they stop).
    debounce_seconds: float = Field(2.0, ge=0, le=60)

    def retry_delay(self, attempt: int) -> float:
        return float(min(self.retry_max_seconds, self.retry_base_seconds * 2 ** min(attempt, 20)))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        if image := env.get("SCOREKEEPER_WORKER_IMAGE"):
            values["worker_image"] = image
        if namespaces := env.get("SCOREKEEPER_NAMESPACE", "").strip():
            values["namespaces"] = tuple(ns.strip() for ns in namespaces.split(",") if ns.strip())
        if liveness := env.get("SCOREKEEPER_LIVENESS_ENDPOINT"):
            values["liveness_endpoint"] = liveness
        if base := env.get("SCOREKEEPER_RETRY_BASE_SECONDS"):
            values["retry_base_seconds"] = float(base)
        if cap := env.get("SCOREKEEPER_RETRY_MAX_SECONDS"):
            values["retry_max_seconds"] = float(cap)
        if resync := env.get("SCOREKEEPER_RESYNC_SECONDS"):
            values["resync_seconds"] = float(resync)
        if poll := env.get("SCOREKEEPER_POLL_SECONDS"):
            values["poll_seconds"] = float(poll)
        if debounce := env.get("SCOREKEEPER_DEBOUNCE_SECONDS"):
            values["debounce_seconds"] = float(debounce)
        if allow := env.get("SCOREKEEPER_ALLOW_HF_DOWNLOAD"):
            values["allow_hf_download"] = allow.strip().lower() in {"1", "true", "yes"}
        if endpoint := env.get("SCOREKEEPER_HF_ENDPOINT"):
            values["hf_endpoint"] = endpoint.rstrip("/")
        if token := env.get("SCOREKEEPER_HF_TOKEN", "").strip():
            values["hf_token"] = token
        if upgrades := env.get("SCOREKEEPER_MAX_CONCURRENT_UPGRADES"):
            values["max_concurrent_upgrades"] = int(upgrades)
        if metrics := env.get("SCOREKEEPER_METRICS_PORT"):
            values["metrics_port"] = int(metrics)
        return cls.model_validate(values)
