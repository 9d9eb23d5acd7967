"""Thin kopf wiring: which events run a reconcile pass, and how its outcome maps onto kopf's error semantics.

No timers or daemons on ScoringModels: kopf would add a finalizer for them, and a finalizer blocks `kubectl delete`
whenever the operator is down. Drift and status are driven by watching the children, and timed passes (retries,
re-checks of conflicts, deadlines, resync) run in the reconciler's own per-model worker (schedule.py).

Footprint: the children and pods are watched with a server-side label selector (managed-by), and kopf lists in
pages, so the API server never sends the operator the rest of the cluster, and kopf never remembers it.

What the watches deliver goes into the reconciler's cache (cache.py) through kopf *index* handlers: kopf holds every
other handler, the `resume` passes included, until each indexed kind has been listed once, so a pass never reads a
cache that is still filling. The index handlers store nothing in kopf's own indices (they return None).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from scorekeeper_operator.k8s import LIST_PAGE_SIZE, KubeApi, load_configuration
from scorekeeper_operator.reconcile import Reconciler
from scorekeeper_operator.render.manifests import MANAGED_SELECTOR
from scorekeeper_operator.spec.settings import OperatorSettings

SCORING_MODEL = ("scorekeeper.dev", "v1alpha1", "scoringmodels")
INSTANCE_LABEL = "app.kubernetes.io/instance"
# Children (drift, deletion) and the worker pods (crash loops, OOM, scheduling) all carry render.MANAGED_SELECTOR's
# label and app.kubernetes.io/instance=<the ScoringModel's name>.
WATCHED_CHILDREN = (
    ("", "v1", "configmaps"), ("", "v1", "services"), ("apps", "v1", "deployments"),
    ("policy", "v1", "poddisruptionbudgets"), ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("monitoring.coreos.com", "v1", "servicemonitors"), ("networking.k8s.io", "v1", "networkpolicies"),
    ("keda.sh", "v1alpha1", "scaledobjects"), ("", "v1", "pods"),
)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's connection from the same credentials as our own client (in-cluster, else KUBECONFIG)."""
    config = load_configuration()
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=config.host, ca_path=config.ssl_ca_cert, insecure=not config.verify_ssl,
        scheme=scheme or None, token=token or None, certificate_path=config.cert_file,
        private_key_path=config.key_file, username=config.username or None, password=config.password or None)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations under our own prefix; status belongs to the documented schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="scorekeeper.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="scorekeeper.dev", key="last-handled-configuration")
    # Events only for problems: our own warnings (reconcile_model), never one per successful handler run.
    settings.posting.level = logging.WARNING
    # Without a server-side timeout a watch can stall silently behind some load balancers (kopf#698).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    # Server-side filtering (labelSelector on LIST and WATCH), not a handler's client-side `labels=` filter: kopf
    # would otherwise receive, and keep a memory entry for, every pod and ConfigMap in the cluster.
    for group, version, plural in WATCHED_CHILDREN:
        settings.watching.label_selectors[group, version, plural] = MANAGED_SELECTOR
    settings.watching.chunk_size = LIST_PAGE_SIZE
    operator_settings = OperatorSettings.from_env()
    memo.reconciler = Reconciler(KubeApi.from_environment(operator_settings.request_timeout_seconds),
                                 operator_settings)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    await memo.reconciler.close()


@kopf.on.probe(id="reconciler")
def probe(memo: kopf.Memo, **_: Any) -> str:
    return "ready" if "reconciler" in memo else "starting"


@kopf.on.update(*SCORING_MODEL, field="spec")
async def edit_model(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """A spec change: debounced (SCOREKEEPER_DEBOUNCE_SECONDS), so a burst of edits is rendered once; never waits."""
    memo.reconciler.edited(namespace, name)


@kopf.on.resume(*SCORING_MODEL)
@kopf.on.create(*SCORING_MODEL)
async def reconcile_model(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """A pass that reads everything fresh. Its outcome is the reconciler's business: a configuration error is in
    status (ConfigValid=False) with a Warning Event, and every retry or re-check runs in the reconciler's worker (one
    retry loop, not kopf's too), so this handler always succeeds."""
    reconciler: Reconciler = memo.reconciler
    try:
        await reconciler.reconcile(namespace, name)
    except Exception:  # already logged; the reconciler's worker retries with backoff
        return


@kopf.on.event(*SCORING_MODEL)
async def on_model_event(event: kopf.RawEvent, name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    # Deleted: a pass finds it gone and drops its timed passes now rather than at the next resync. (A pass, not a
    # plain drop: a ScoringModel of the same name may already exist again.)
    if event.get("type") == "DELETED":
        memo.reconciler.trigger(namespace, name)


async def cache_child(body: kopf.Body, resource: kopf.Resource, memo: kopf.Memo, **_: Any) -> None:
    """Every listed, added or modified child and worker pod, into the reconciler's cache (before any handler)."""
    memo.reconciler.observe(resource.plural, None, {key: body[key] for key in body})


async def on_child_event(event: kopf.RawEvent, resource: kopf.Resource, namespace: str | None, labels: kopf.Labels,
                         memo: kopf.Memo, **_: Any) -> None:
    if event.get("type") == "DELETED":  # index handlers do not see deletions
        memo.reconciler.observe(resource.plural, "DELETED", event["object"])
    owner = labels.get(INSTANCE_LABEL)
    if namespace and owner:
        memo.reconciler.trigger(namespace, owner)


for _group, _version, _plural in WATCHED_CHILDREN:
    kopf.index(_group, _version, _plural, id=f"cache-{_plural}")(cache_child)
    kopf.on.event(_group, _version, _plural, id=f"child-{_plural}")(on_child_event)
