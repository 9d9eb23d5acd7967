"""`scorekeeper-operator`: `kopf run` with our handlers, a liveness endpoint, and the namespaces from the env.

Runs standalone (no kopf peering): deploy exactly one replica with `strategy: Recreate`, as kopf recommends.
"""

from __future__ import annotations

import os
from typing import Any

import kopf

from scorekeeper_operator import metrics
from scorekeeper_operator.spec.settings import OperatorSettings


def run_options(settings: OperatorSettings) -> dict[str, Any]:
    """kopf.run() keyword arguments: all namespaces unless SCOREKEEPER_NAMESPACE names some."""
    return {
        "clusterwide": not settings.namespaces,
        "namespaces": list(settings.namespaces),
        "liveness_endpoint": settings.liveness_endpoint,
        "standalone": True,
    }


def main() -> None:
    settings = OperatorSettings.from_env()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    kopf.configure(verbose=os.environ.get("SCOREKEEPER_LOG_LEVEL", "").lower() == "debug")
    from scorekeeper_operator import handlers  # noqa: F401  (registers the handlers with kopf)

    kopf.run(**run_options(settings))


if __name__ == "__main__":
    main()
