"""Pure rendering of the worker pod template: container, probes, resources, security, shutdown, scheduling, knobs.

Every pod meets the Pod Security "restricted" profile (tests/operator/support/pod_security.py checks each rule):
non-root numeric user, RuntimeDefault seccomp, all capabilities dropped, no privilege escalation, only
restricted-profile volume types. Beyond the profile: a read-only root filesystem (tmp and caches are emptyDirs), no
service-account token (the worker never calls the Kubernetes API), and no GPU for a container that asks for none.
"""

from __future__ import annotations

import math
from typing import Any

from scorekeeper_operator.render.download import (
    download_init_container,
    downloads_to_empty_dir,
    mebibytes,
    model_volume,
)
from scorekeeper_operator.spec import flags, pod_layout, worker_contract
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.quantity import quantity_bytes
from scorekeeper_operator.spec.settings import OperatorSettings

STARTUP_PROBE_PERIOD_SECONDS = 10
# After the drain: time for the process to exit and the kubelet to notice, before SIGKILL.
SHUTDOWN_MARGIN_SECONDS = 10


def termination_grace_seconds(model: ScoringModel) -> int:
    """preStop pause (endpoints stop routing) + drain (in-flight requests finish) + margin (exit)."""
    rollout = model.spec.rollout
    return rollout.pre_stop_seconds + rollout.drain_seconds + SHUTDOWN_MARGIN_SECONDS


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def ephemeral_storage_bytes(model: ScoringModel) -> int:
    """What the pod's disk-backed emptyDirs may hold: tmp, caches, and the hf:// download without a cache PVC."""
    sizes = [pod_layout.TMP_SIZE_LIMIT, pod_layout.CACHE_SIZE_LIMIT]
    if downloads_to_empty_dir(model):
        sizes.append(model.spec.model.size_limit)
    return sum(quantity_bytes(size) for size in sizes)


def _resources(model: ScoringModel, *, gpus: bool = True) -> dict[str, Any]:
    res = model.spec.resources
    # Requested, so the scheduler places the pod where its emptyDirs fit (no eviction for disk pressure).
    requests: dict[str, str] = {"ephemeral-storage": mebibytes(ephemeral_storage_bytes(model))}
    limits: dict[str, str] = {}
    if res.cpu is not None:
        requests["cpu"] = res.cpu  # no CPU limit: throttling a tokenizer-bound worker only adds latency
    if res.memory is not None:
        requests["memory"] = limits["memory"] = res.memory
    if gpus and res.gpu.count > 0:
        # extended resources must have requests == limits; quantities are strings for the API
        requests[res.gpu.resource_name] = limits[res.gpu.resource_name] = str(res.gpu.count)
    return {k: v for k, v in {"requests": requests, "limits": limits}.items() if v}


def _api_key_volumes(model: ScoringModel) -> list[dict[str, Any]]:
    # The Secret's key becomes the file worker_contract.API_KEY_PATH. A whole-directory mount (never subPath), so a
    # rotated Secret reaches the running worker, which re-reads the file when it changes.
    ref = model.spec.auth.api_key_secret_ref
    if ref is None:
        return []
    items = [{"key": ref.key, "path": worker_contract.API_KEY_FILE}]
    return [{"name": "api-keys", "secret": {"secretName": ref.name, "items": items}}]


def _api_key_mounts(model: ScoringModel) -> list[dict[str, Any]]:
    if model.spec.auth.api_key_secret_ref is None:
        return []
    return [{"name": "api-keys", "mountPath": worker_contract.API_KEY_DIR, "readOnly": True}]


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": pod_layout.WORKER_UID, "runAsGroup": pod_layout.WORKER_GID,
            # fsGroup: the download init container can write the cache PVC where the volume's driver applies it
            # (most do not for ReadWriteMany: the download then says so); OnRootMismatch skips a recursive chown of a
            # large cache on every start.
            "fsGroup": pod_layout.WORKER_GID, "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"}}


def _dump(items: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [item.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True) for item in items]


def _no_gpus_env(model: ScoringModel) -> list[dict[str, str]]:
    """NVIDIA_VISIBLE_DEVICES=void unless the worker asks for an NVIDIA GPU (then the device plugin sets it): the image
    says `all`, and on a node whose container runtime is NVIDIA's (its default, or a runtimeClassName) a CPU model
    would see every GPU of the node."""
    gpu = model.spec.resources.gpu
    if model.spec.uses_gpu and gpu.resource_name.startswith(pod_layout.NVIDIA_RESOURCE_PREFIX):
        return []
    return [{"name": k, "value": v} for k, v in pod_layout.NO_GPUS_ENV.items()]


def _worker_container(model: ScoringModel, image: str, model_mounts: list[dict[str, Any]],
                      user: dict[str, Any]) -> dict[str, Any]:
    spec = model.spec
    startup_failures = math.ceil(spec.startup_seconds / STARTUP_PROBE_PERIOD_SECONDS)
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "command": [worker_contract.WORKER_COMMAND],
        "args": flags.worker_args(model),
        "ports": [{"name": "http", "containerPort": worker_contract.WORKER_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": worker_contract.METRICS_PORT, "protocol": "TCP"}],
        "env": [*({"name": k, "value": v} for k, v in pod_layout.WORKER_ENV.items()), *_no_gpus_env(model),
                *user["env"]],
        "resources": _resources(model),
        # /ready turns true only once the model is loaded and warm; until then the startup probe holds off
        # liveness, for up to rollout.maxStartupSeconds (plus compile.budgetSeconds when the worker compiles).
        "startupProbe": _probe("/ready", STARTUP_PROBE_PERIOD_SECONDS, startup_failures),
        "readinessProbe": _probe("/ready", 5, 3),
        "livenessProbe": _probe("/health", 15, 4),
        "volumeMounts": [
            {"name": "config", "mountPath": worker_contract.CONFIG_DIR, "readOnly": True},
            {"name": "shm", "mountPath": pod_layout.SHM_DIR},
            {"name": "tmp", "mountPath": pod_layout.TMP_DIR},
            {"name": "cache", "mountPath": pod_layout.CACHE_DIR},
            *model_mounts,
            *user["volumeMounts"],
            *_api_key_mounts(model),
        ],
        "securityContext": _container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",  # why it could not load (or its log tail) → status
    }
    if user["envFrom"]:
        container["envFrom"] = user["envFrom"]
    if spec.rollout.pre_stop_seconds > 0:
        # SIGTERM only after this pause: the pod is already out of the Service's endpoints (it is terminating),
        # and the pause lets kube-proxy and load balancers catch up before the worker stops accepting. An exec
        # hook (python is in the worker image), because the `sleep` action is not in Kubernetes 1.29.
        container["lifecycle"] = {"preStop": {"exec": {"command": [
            "python", "-c", f"import time; time.sleep({spec.rollout.pre_stop_seconds})"]}}}
    return container


def _gpu_tolerations(model: ScoringModel) -> list[dict[str, Any]]:
    # GPU node pools are commonly tainted with the GPU resource name; tolerate that taint whenever we ask for GPUs.
    if not model.spec.uses_gpu:
        return []
    taint = {"key": model.spec.resources.gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}
    return [] if taint in model.spec.scheduling.tolerations else [taint]


def _topology_spread(model: ScoringModel, selector: dict[str, str]) -> list[dict[str, Any]]:
    constraints = _dump(model.spec.pod.topology_spread_constraints)
    for constraint in constraints:  # without a selector a constraint counts no pods: spread this model's pods
        constraint.setdefault("labelSelector", {"matchLabels": dict(selector)})
    return constraints


def _scheduling(model: ScoringModel, selector: dict[str, str]) -> dict[str, Any]:
    spec = model.spec
    fields: dict[str, Any] = {
        "tolerations": [*spec.scheduling.tolerations, *_gpu_tolerations(model)],
        "nodeSelector": dict(spec.scheduling.node_selector),
        "affinity": spec.scheduling.affinity,
        "priorityClassName": spec.scheduling.priority_class_name,
        "runtimeClassName": spec.pod.runtime_class_name,
        "topologySpreadConstraints": _topology_spread(model, selector),
    }
    return {key: value for key, value in fields.items() if value}


def shm_size(model: ScoringModel) -> str:
    """`resources.shmSize`, else 1Gi on CPU and, on a GPU, room for the host-side staging of one batch:
    `scoring.maxBatchTokens` x 128 KiB (8192 tokens: 1Gi), at least 1Gi."""
    spec = model.spec
    if spec.resources.shm_size is not None:
        return spec.resources.shm_size
    if not spec.uses_gpu:
        return pod_layout.SHM_SIZE_LIMIT
    mib = max(1024, spec.scoring.max_batch_tokens * pod_layout.SHM_BYTES_PER_BATCH_TOKEN // 2**20)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def pod_template(model: ScoringModel, settings: OperatorSettings, labels: dict[str, str],
                 selector: dict[str, str], image: str) -> dict[str, Any]:
    """The pod template; render/manifests.py adds the config-hash annotation after hashing this."""
    spec = model.spec
    knobs = spec.pod
    volumes, model_mounts = model_volume(model)
    user = {"env": _dump(knobs.env), "envFrom": _dump(knobs.env_from), "volumeMounts": _dump(knobs.volume_mounts)}
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": termination_grace_seconds(model),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(),
        "containers": [_worker_container(model, image, model_mounts, user)],
        "volumes": [
            {"name": "config", "configMap": {"name": model.name}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(model)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": pod_layout.TMP_SIZE_LIMIT}},
            {"name": "cache", "emptyDir": {"sizeLimit": pod_layout.CACHE_SIZE_LIMIT}},
            *volumes,
            *_dump(knobs.volumes),
            *_api_key_volumes(model),
        ],
        **_scheduling(model, selector),
    }
    if spec.model.scheme == "hf":
        base = {**user, "resources": _resources(model, gpus=False), "securityContext": _container_security()}
        pod["initContainers"] = [download_init_container(model, settings, image, base)]
    if knobs.service_account_name:
        pod["serviceAccountName"] = knobs.service_account_name
    if knobs.image_pull_secrets:
        pod["imagePullSecrets"] = _dump(knobs.image_pull_secrets)
    metadata: dict[str, Any] = {"labels": {**knobs.labels, **labels}}
    if knobs.annotations:
        metadata["annotations"] = dict(knobs.annotations)
    return {"metadata": metadata, "spec": pod}
