"""The operator image, run as the chart renders the operator's pod: every module of the operator imports in it, and
its real entry point starts; with no cluster to talk to it exits with one clear line, not a traceback.

Run by `scripts/images.sh smoke` (the images must be built): not collected by a plain `pytest` run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pod_container import PodContainer

OPERATOR_SOURCE = Path(__file__).resolve().parents[3] / "operator"
LIST_AND_IMPORT = """
import importlib, pkgutil, scorekeeper_operator
for module in pkgutil.walk_packages(scorekeeper_operator.__path__, "scorekeeper_operator."):
    importlib.import_module(module.name)
    print(module.name)
"""
# Without a cluster the operator must give up at once; this bounds the wait for that, on a loaded machine.
EXIT_DEADLINE_SECONDS = 60


def source_modules() -> set[str]:
    found = set()
    for path in (OPERATOR_SOURCE / "scorekeeper_operator").rglob("*.py"):
        parts = path.relative_to(OPERATOR_SOURCE).with_suffix("").parts
        if parts[-1] != "__init__":
            found.add(".".join(parts))
        elif len(parts) > 2:
            found.add(".".join(parts[:-1]))  # a subpackage
    return found


def run_to_exit(pod: dict[str, Any], container: dict[str, Any], tmp_path: Path) -> tuple[int | None, str]:
    running = PodContainer.start(pod, container, {}, tmp_path)
    try:
        return running.wait(EXIT_DEADLINE_SECONDS), running.logs()
    finally:
        running.remove()


def test_every_operator_module_imports_in_the_image(operator_pod: dict[str, Any], tmp_path: Path) -> None:
    container = {**operator_pod["containers"][0], "command": ["python", "-c", LIST_AND_IMPORT]}
    status, logs = run_to_exit(operator_pod, container, tmp_path)
    assert status == 0, logs
    assert set(logs.split()) == source_modules()


def test_the_operator_runs_as_the_pods_user_on_a_read_only_root(operator_pod: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    probe = ("import os\nprint(os.getuid(), os.getgid())\ntry:\n    open('/opt/venv/probe', 'w')\n"
             "except OSError as error:\n    print(error.strerror)\nopen('/tmp/probe', 'w')\nprint('tmp writable')")
    container = {**operator_pod["containers"][0], "command": ["python", "-c", probe]}
    status, logs = run_to_exit(operator_pod, container, tmp_path)
    context = operator_pod["securityContext"]
    assert status == 0, logs
    assert logs.split("\n")[:3] == [f"{context['runAsUser']} {context['runAsGroup']}", "Read-only file system",
                                     "tmp writable"]


def test_without_a_cluster_the_entry_point_exits_with_one_clear_line(operator_pod: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    status, logs = run_to_exit(operator_pod, operator_pod["containers"][0], tmp_path)
    print(logs)
    assert status is not None, f"still running {EXIT_DEADLINE_SECONDS} s after its start without a cluster"
    assert status != 0
    assert "Traceback" not in logs
    last = logs.strip().splitlines()[-1]
    assert re.search(r"kube-?config|KUBERNETES_SERVICE_HOST|cluster", last, re.IGNORECASE), last
