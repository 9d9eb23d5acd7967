"""Pure rendering of the `check-model` init container: before anything reads the weights, say plainly what is wrong
with where they should be.

- pvc:// and file:// models: the path must exist (a model directory with config.json, or a file such as a .gguf).
  Otherwise the worker would take the missing path for a Hub repository id and fail with transformers' "Repo id must
  be in the form ..."; this says which path is missing and what the volume holds instead.
- hf:// models with `model.cache`: the claim must be writable by the pod's user. Most CSI drivers do not apply
  `fsGroup` to ReadWriteMany volumes, so a shared cache is often root-owned; the download would fail with a bare
  PermissionError. This names the claim, the user and the ways out.

It exits 3 with one paragraph in its termination message, like the worker (status: ModelLoadFailed, with that
message). It runs `python` from the worker image, with the pod's restricted security settings, and costs a second.
"""

from __future__ import annotations

from typing import Any

from scorekeeper_operator.spec import worker_contract
from scorekeeper_operator.spec.model import ScoringModel

CHECK_CONTAINER = "check-model"
CHECK_SCRIPT = r"""
import os, sys
path, what, mode = sys.argv[1:4]
def fail(text):
    text = " ".join(text.split())
    try:
        with open("/dev/termination-log", "w") as log:
            log.write(text)
    except OSError:
        pass
    print(text, file=sys.stderr)
    sys.exit(3)
if mode == "model":
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "config.json")):
        sys.exit(0)
    found = path
    while not os.path.isdir(found) and found not in ("/", ""):
        found = os.path.dirname(found)
    entries = sorted(os.listdir(found))[:20] if os.path.isdir(found) else []
    state = "has no config.json" if os.path.isdir(path) else "does not exist"
    fail(f"{what}: {path} {state}; {found} holds: {', '.join(entries) or 'nothing'}. Check the path in model.uri")
probe = os.path.join(path, f".scorekeeper-write-check-{os.uname().nodename}")
try:
    with open(probe, "w"):
        pass
    os.remove(probe)
except OSError as error:
    fail(f"{what} is not writable by uid {os.getuid()} gid {os.getgid()} (supplementary groups {os.getgroups()}):"
         f" {error}. Most CSI drivers do not apply fsGroup to ReadWriteMany volumes: give the volume to uid/gid"
         " 10001 through its StorageClass (examples/reranker-gpu.yaml shows how for NFS, EFS and Azure Files), or"
         " annotate the PersistentVolume with pv.beta.kubernetes.io/gid for a group-writable export")
"""


def check_args(model: ScoringModel, path: str) -> list[str] | None:
    """The script's arguments (path, what to name, mode), or None when there is nothing to check."""
    source = model.spec.model
    if source.scheme in ("pvc", "file"):
        return [path, f"model.uri {source.uri}", "model"]
    if source.scheme == "hf" and source.cache is not None:
        return [worker_contract.MODEL_MOUNT, f"model.cache {source.cache.claim_name} (mounted at"
                f" {worker_contract.MODEL_MOUNT})", "cache"]
    return None


def check_init_container(model: ScoringModel, path: str, image: str,
                         base: dict[str, Any]) -> dict[str, Any] | None:
    """`base`: what it shares with the worker container (securityContext, resources without GPUs) and the model
    volume's mount (read-only for the model, read-write for a cache)."""
    args = check_args(model, path)
    if args is None:
        return None
    return {"name": CHECK_CONTAINER, "image": image, "command": ["python", "-c", CHECK_SCRIPT, *args],
            "volumeMounts": base["volumeMounts"], "resources": base["resources"],
            "securityContext": base["securityContext"], "terminationMessagePolicy": "FallbackToLogsOnError"}
