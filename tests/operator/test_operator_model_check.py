"""The check-model init container, run for real (its script, with the arguments the operator renders) against
directories shaped like the volumes: a wrong model path says which path is missing and what is there, never
transformers' "Repo id must be in the form ..."; a cache the pod cannot write says so, with the way out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from render_cases import COMMIT, SETTINGS, model_from
from scorekeeper_operator.render.manifests import render
from scorekeeper_operator.status.compute import Observed
from status_fixtures import assess, conditions, desired, message, pod, rendered, rolled

UNWRITABLE = Path("/sys/kernel")  # sysfs: EACCES on create for every user


def check_container(spec: dict[str, Any]) -> dict[str, Any]:
    deployment = render(model_from(spec), SETTINGS, service_monitor_api=False).get("Deployment")
    assert deployment is not None
    found: dict[str, Any] = next(c for c in deployment["spec"]["template"]["spec"]["initContainers"]
                                 if c["name"] == "check-model")
    return found


def run_check(container: dict[str, Any], mounted_at: str, volume: Path) -> subprocess.CompletedProcess[str]:
    """Run the rendered command with the pod's mount point replaced by a local directory."""
    python, flag, script, path, *rest = container["command"]
    assert (python, flag) == ("python", "-c")
    local = str(volume) + path.removeprefix(mounted_at)
    return subprocess.run([sys.executable, "-c", script, local, *rest], capture_output=True, text=True, timeout=60)


def test_a_model_path_that_is_not_in_the_claim_is_named(tmp_path: Path) -> None:
    (tmp_path / "qwen3-reranker-0.6b").mkdir()
    (tmp_path / "bge-m3").mkdir()
    result = run_check(check_container({"model": {"uri": "pvc://models/qwen3-reranker"}}), "/models", tmp_path)
    assert result.returncode == 3  # the worker's "this model cannot be served"
    assert "model.uri pvc://models/qwen3-reranker:" in result.stderr and "does not exist" in result.stderr
    assert "bge-m3, qwen3-reranker-0.6b" in result.stderr and "Repo id" not in result.stderr


def test_a_directory_without_config_json_is_named(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    result = run_check(check_container({"model": {"uri": "pvc://models/m"}}), "/models", tmp_path)
    assert result.returncode == 3 and "has no config.json" in result.stderr


@pytest.mark.parametrize(("uri", "layout"), [("pvc://models/m", "m/config.json"), ("pvc://models", "config.json"),
                                             ("pvc://models/m/q4.gguf", "m/q4.gguf")])
def test_a_model_that_is_there_passes(tmp_path: Path, uri: str, layout: str) -> None:
    (tmp_path / layout).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / layout).write_text("{}")
    result = run_check(check_container({"model": {"uri": uri}}), "/models", tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_cache_the_pod_cannot_write_is_named(tmp_path: Path) -> None:
    """Most CSI drivers do not apply fsGroup to ReadWriteMany volumes: a root-owned shared cache."""
    spec = {"model": {"uri": "hf://org/name", "revision": COMMIT, "cache": {"claimName": "hub-cache"}}}
    container = check_container(spec)
    assert container["volumeMounts"] == [{"name": "model", "mountPath": "/models"}]  # read-write, as the download's
    assert run_check(container, "/models", tmp_path).returncode == 0
    assert list(tmp_path.iterdir()) == []  # it leaves nothing behind
    # A directory no one may write, root included (the tests may run as root, which permission bits do not stop).
    result = run_check(container, "/models", UNWRITABLE)
    assert result.returncode == 3
    assert "model.cache hub-cache (mounted at /models) is not writable by uid" in result.stderr
    assert "fsGroup" in result.stderr and "examples/reranker-gpu.yaml" in result.stderr


def test_no_check_where_the_download_checks_already() -> None:
    deployment = render(model_from({"model": {"uri": "hf://org/name", "revision": COMMIT}}), SETTINGS,
                        service_monitor_api=False).get("Deployment")
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["initContainers"]] == ["download-model"]  # type: ignore[index]


def test_its_verdict_is_a_model_load_failure_with_its_message() -> None:
    r = rendered(replicas=1)
    said = "model.uri pvc://models/qwen3-reranker: /models/qwen3-reranker does not exist; /models holds: bge-m3"
    stuck = pod("a", r.config_hash, ready=False, phase="Pending", initContainerStatuses=[{
        "name": "check-model", "ready": False, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": said}}}])
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [stuck])).status
    assert conditions(status)["Degraded"] == ("True", "ModelLoadFailed") and message(status, "Degraded") == f"a: {said}"
