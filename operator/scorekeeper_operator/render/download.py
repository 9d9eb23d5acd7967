"""Pure rendering of where the weights come from: the model volume and, for hf://, the download init container.

hf:// downloads exactly one commit (the pinned or resolved revision) into `/models/<org>/<name>/<commit>`: on the
`model.cache` PVC (shared by pods, restarts and ScoringModels; a complete snapshot is never downloaded twice) or on
an emptyDir bounded by `model.downloadSizeLimit`. The init container runs `python -m scorekeeper_worker.hub_download`
from the worker image; it picks the files a model needs (worker/scorekeeper_worker/model/hub_download.py).
"""

from __future__ import annotations

import math
from typing import Any

from scorekeeper_operator.spec import pod_layout, worker_contract
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.quantity import quantity_bytes
from scorekeeper_operator.spec.settings import OperatorSettings

DOWNLOAD_CONTAINER = "download-model"
DOWNLOAD_COMMAND = ["python", "-m", "scorekeeper_worker.hub_download"]  # the stable entry point


def mebibytes(size: int) -> str:
    return f"{math.ceil(size / 2**20)}Mi"


def downloads_to_empty_dir(model: ScoringModel) -> bool:
    return model.spec.model.scheme == "hf" and model.spec.model.cache is None


def model_volume(model: ScoringModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, worker volumeMounts) that put the weights where flags.model_path says."""
    source = model.spec.model
    scheme, rest = source.uri.split("://", 1)
    if scheme == "pvc":
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": rest.split("/", 1)[0], "readOnly": True}}
    elif scheme == "hf" and source.cache is not None:
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": source.cache.claim_name}}
    elif scheme == "hf":
        volume = {"name": "model", "emptyDir": {"sizeLimit": source.size_limit}}
    else:
        return [], []  # file:// lives in the image
    return [volume], [{"name": "model", "mountPath": worker_contract.MODEL_MOUNT, "readOnly": True}]


def download_env(model: ScoringModel, settings: OperatorSettings) -> list[dict[str, Any]]:
    source = model.spec.model
    commit = model.hf_commit
    if commit is None:
        raise ValueError(f"{source.uri}: the revision is not resolved to a commit yet")
    values = {
        "HF_REPO_ID": source.hf_repo,
        "HF_REVISION": commit,
        "HF_TARGET": worker_contract.hf_snapshot_dir(source.hf_repo, commit),
        "HF_SIZE_LIMIT_BYTES": str(quantity_bytes(source.size_limit)),
        "HF_ENDPOINT": settings.hf_endpoint,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **{k: pod_layout.WORKER_ENV[k] for k in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "HF_HOME")},
        **pod_layout.NO_GPUS_ENV,  # it never asks for a GPU
    }
    if source.hf_file is not None:
        values["HF_FILE"] = source.hf_file
    if not settings.allow_hf_download:
        values["HF_HUB_OFFLINE"] = "1"  # air-gapped: use the cache PVC's copy or fail with a clear message
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    if source.token_secret_ref is not None:
        ref = source.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def download_init_container(model: ScoringModel, settings: OperatorSettings, image: str,
                            base: dict[str, Any]) -> dict[str, Any]:
    """`base` carries what the worker container shares with it: securityContext, resources without GPUs, and the
    user's env, envFrom and volumeMounts (a proxy or a CA bundle for an in-house Hub mirror)."""
    mounts = [{"name": "model", "mountPath": worker_contract.MODEL_MOUNT},
              {"name": "tmp", "mountPath": pod_layout.TMP_DIR}, {"name": "cache", "mountPath": pod_layout.CACHE_DIR},
              *base["volumeMounts"]]
    container: dict[str, Any] = {
        "name": DOWNLOAD_CONTAINER, "image": image, "command": DOWNLOAD_COMMAND,
        "env": [*download_env(model, settings), *base["env"]], "volumeMounts": mounts,
        "resources": base["resources"], "securityContext": base["securityContext"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if base["envFrom"]:
        container["envFrom"] = base["envFrom"]
    return container
