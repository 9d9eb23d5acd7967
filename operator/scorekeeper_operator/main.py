"""`scorekeeper-operator`: `kopf run` with our handlers, a liveness endpoint, and the namespaces from the env.

Runs standalone (no kopf peering): deploy exactly one replica with `strategy: Recreate`, as kopf recommends.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import kopf
import kubernetes

from scorekeeper_operator import metrics
from scorekeeper_operator.k8s import load_configuration
from scorekeeper_operator.spec.settings import OperatorSettings

NO_CLUSTER_EXIT_STATUS = 2


def run_options(settings: OperatorSettings) -> dict[str, Any]:
    """kopf.run() keyword arguments: all namespaces unless SCOREKEEPER_NAMESPACE names some."""
    return {
        "clusterwide": not settings.namespaces,
        "namespaces": list(settings.namespaces),
        "liveness_endpoint": settings.liveness_endpoint,
        "standalone": True,
    }


def no_cluster_reason() -> str | None:
    """Why no Kubernetes API can be reached from here (not in a pod, and no kubeconfig), or None. kopf would retry
    its login forever with a traceback a minute; a pod without a cluster cannot become one, so it should exit."""
    try:
        load_configuration()
    except kubernetes.config.ConfigException as error:
        in_cluster = ("no service account token in this pod" if "KUBERNETES_SERVICE_HOST" in os.environ
                      else "not in a pod (KUBERNETES_SERVICE_HOST is unset)")
        return (f"scorekeeper-operator: no Kubernetes cluster to talk to: {in_cluster}"
                f" and no usable kubeconfig (KUBECONFIG={os.environ.get('KUBECONFIG', '~/.kube/config')}: {error})")
    return None


def main() -> None:
    reason = no_cluster_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        sys.exit(NO_CLUSTER_EXIT_STATUS)
    settings = OperatorSettings.from_env()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    kopf.configure(verbose=os.environ.get("SCOREKEEPER_LOG_LEVEL", "").lower() == "debug")
    from scorekeeper_operator import handlers  # noqa: F401  (registers the handlers with kopf)

    kopf.run(**run_options(settings))


if __name__ == "__main__":
    main()
