"""The operator's own Prometheus metrics (kopf has none), served on SCOREKEEPER_METRICS_PORT at /metrics.

Reconcile passes by outcome and their duration, configuration errors by reason, Hub revision resolutions, and the
ScoringModels waiting for a new default worker image. The chart's ServiceMonitor scrapes them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

import prometheus_client

from scorekeeper_operator.k8s import TransientApiError
from scorekeeper_operator.status.compute import ConfigError

P = ParamSpec("P")
S = TypeVar("S")

RECONCILES = prometheus_client.Counter(
    "scorekeeper_operator_reconciles", "Reconcile passes by result: ok, config_error, transient_error, error",
    ["result"])
RECONCILE_SECONDS = prometheus_client.Histogram(
    "scorekeeper_operator_reconcile_duration_seconds", "Duration of one reconcile pass (API calls included)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
CONFIG_ERRORS = prometheus_client.Counter(
    "scorekeeper_operator_config_errors", "Passes that ended with ConfigValid=False, by reason", ["reason"])
HUB_RESOLUTIONS = prometheus_client.Counter(
    "scorekeeper_operator_hub_resolutions", "hf:// revisions resolved to a commit, by result: resolved, refused"
    " (not found, no access), unavailable (retried)", ["result"])
UPGRADES_WAITING = prometheus_client.Gauge(
    "scorekeeper_operator_image_upgrades_waiting", "ScoringModels waiting for a slot to roll out the new default"
    " worker image")
for _result in ("ok", "config_error", "transient_error", "error"):
    RECONCILES.labels(_result)  # present at 0 from the start, so rate() and alerts see the series


def instrumented(reconcile: Callable[Concatenate[S, P], Awaitable[ConfigError | None]],
                 ) -> Callable[Concatenate[S, P], Awaitable[ConfigError | None]]:
    """Count and time every reconcile pass (Reconciler._pass, whoever asked for it: kopf, a watch event, a timer)."""

    @functools.wraps(reconcile)
    async def counted(self: S, *args: P.args, **kwargs: P.kwargs) -> ConfigError | None:
        started, result = time.perf_counter(), "error"
        try:
            error = await reconcile(self, *args, **kwargs)
            result = "ok" if error is None else "config_error"
            if error is not None:
                CONFIG_ERRORS.labels(error.reason).inc()
            return error
        except TransientApiError:
            result = "transient_error"
            raise
        finally:
            RECONCILES.labels(result).inc()
            RECONCILE_SECONDS.observe(time.perf_counter() - started)

    return counted


def serve(port: int) -> None:
    """Serve /metrics (this process's default registry, with process and platform metrics) on all interfaces."""
    prometheus_client.start_http_server(port, addr="0.0.0.0")
