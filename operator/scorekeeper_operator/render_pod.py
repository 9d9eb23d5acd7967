"""Pure rendering of the worker pod template: container, probes, GPU resources, scheduling, model volume."""

from __future__ import annotations

import math
from typing import Any

from scorekeeper_operator import flags
from scorekeeper_operator.settings import OperatorSettings
from scorekeeper_operator.spec import ScoringModel

STARTUP_PROBE_PERIOD_SECONDS = 10
# huggingface_hub's snapshot_download is a stable Python API (its CLI was renamed across versions), and the worker
# image already ships huggingface_hub with transformers. Inputs come through env, never through the script text.
HF_DOWNLOAD_SCRIPT = (
    "import os\n"
    "from huggingface_hub import snapshot_download\n"
    "snapshot_download(repo_id=os.environ['HF_REPO_ID'], revision=os.environ.get('HF_REVISION') or None,"
    " local_dir=os.environ['HF_TARGET'])\n"
)


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def _resources(model: ScoringModel) -> dict[str, Any]:
    res = model.spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.cpu is not None:
        requests["cpu"] = res.cpu  # no CPU limit: throttling a tokenizer-bound worker only adds latency
    if res.memory is not None:
        requests["memory"] = limits["memory"] = res.memory
    if res.gpu.count > 0:
        # extended resources must have requests == limits; quantities are strings for the API
        requests[res.gpu.resource_name] = limits[res.gpu.resource_name] = str(res.gpu.count)
    return {k: v for k, v in {"requests": requests, "limits": limits}.items() if v}


def _model_volume(model: ScoringModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, worker volumeMounts) that put the weights where flags.model_path says."""
    scheme, rest = model.spec.model.uri.split("://", 1)
    if scheme == "pvc":
        claim = rest.split("/", 1)[0]
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    elif scheme == "hf":
        volume = {"name": "model", "emptyDir": {}}
    else:
        return [], []  # file:// lives in the image
    return [volume], [{"name": "model", "mountPath": flags.MODEL_MOUNT, "readOnly": True}]


def _download_init_container(model: ScoringModel, image: str) -> dict[str, Any]:
    source = model.spec.model
    env: list[dict[str, Any]] = [
        {"name": "HF_REPO_ID", "value": source.uri.removeprefix("hf://")},
        {"name": "HF_REVISION", "value": source.revision or ""},
        {"name": "HF_TARGET", "value": flags.model_path(source.uri)},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if source.token_secret_ref is not None:
        ref = source.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return {"name": "download-model", "image": image, "command": ["python", "-c", HF_DOWNLOAD_SCRIPT], "env": env,
            "volumeMounts": [{"name": "model", "mountPath": flags.MODEL_MOUNT}],
            "securityContext": _container_security()}


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _worker_container(model: ScoringModel, image: str, model_mounts: list[dict[str, Any]]) -> dict[str, Any]:
    startup_failures = math.ceil(model.spec.rollout.max_startup_seconds / STARTUP_PROBE_PERIOD_SECONDS)
    return {
        "name": "worker",
        "image": image,
        "command": [flags.WORKER_COMMAND],
        "args": flags.worker_args(model),
        "ports": [{"name": "http", "containerPort": flags.WORKER_PORT, "protocol": "TCP"}],
        # The worker never downloads: weights come from the volume (or the init container).
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"}],
        "resources": _resources(model),
        # /ready turns true only once the model is loaded and warm; until then the startup probe holds off
        # liveness, for up to rollout.maxStartupSeconds.
        "startupProbe": _probe("/ready", STARTUP_PROBE_PERIOD_SECONDS, startup_failures),
        "readinessProbe": _probe("/ready", 5, 3),
        "livenessProbe": _probe("/health", 15, 4),
        "volumeMounts": [
            {"name": "config", "mountPath": flags.CONFIG_DIR, "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
            *model_mounts,
        ],
        "securityContext": _container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",  # why it could not load (or its log tail) → status
    }


def _gpu_tolerations(model: ScoringModel) -> list[dict[str, Any]]:
    # GPU node pools are commonly tainted with the GPU resource name; tolerate that taint whenever we ask for GPUs.
    if not model.spec.uses_gpu:
        return []
    taint = {"key": model.spec.resources.gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}
    return [] if taint in model.spec.scheduling.tolerations else [taint]


def pod_template(model: ScoringModel, settings: OperatorSettings, labels: dict[str, str]) -> dict[str, Any]:
    """The pod template without the config-hash annotation (render.py adds it after hashing this)."""
    spec = model.spec
    image = spec.image or settings.worker_image
    volumes, model_mounts = _model_volume(model)
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": spec.rollout.drain_seconds + 10,
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_worker_container(model, image, model_mounts)],
        "volumes": [
            {"name": "config", "configMap": {"name": model.name}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            *volumes,
        ],
    }
    if spec.model.scheme == "hf":
        pod["initContainers"] = [_download_init_container(model, image)]
    tolerations = [*spec.scheduling.tolerations, *_gpu_tolerations(model)]
    if tolerations:
        pod["tolerations"] = tolerations
    if spec.scheduling.node_selector:
        pod["nodeSelector"] = dict(spec.scheduling.node_selector)
    if spec.scheduling.affinity:
        pod["affinity"] = spec.scheduling.affinity
    if spec.scheduling.priority_class_name:
        pod["priorityClassName"] = spec.scheduling.priority_class_name
    return {"metadata": {"labels": labels}, "spec": pod}
