"""The worker image, run as the operator renders the hello world's pod (examples/hello-world-cpu.yaml): its user, a
read-only root with the pod's writable mounts, the rendered environment; it serves the baked-in all-MiniLM-L6-v2,
answers the README's request with the README's scores, serves /metrics, and stops cleanly on SIGTERM.

Run by `scripts/images.sh smoke` (the images must be built): not collected by a plain `pytest` run."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from pod_container import PodContainer
from prometheus_client.parser import text_string_to_metric_families

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_score_example() -> tuple[dict[str, Any], list[str]]:
    """The README's /v1/score request body and the scores it prints (as written: leading digits, then `...`)."""
    section = README.read_text().split("## Score something", 1)[1]
    body = re.search(r"localhost:8000/v1/score -H 'content-type: application/json' -d '(\{.*?\})'", section, re.S)
    printed = re.search(r'# \{"scores":(\[\[.*?\]\])', section)
    assert body and printed, "README's score example moved: update this parser"
    return json.loads(body.group(1)), re.findall(r"\[(\d+\.\d+)\.\.\.\]", printed.group(1))


def post(container: PodContainer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{container.address('http')}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def proc_status(container: PodContainer) -> dict[str, list[str]]:
    lines = container.exec("cat", "/proc/1/status").stdout.splitlines()
    return {key: value.split() for key, _, value in (line.partition(":") for line in lines)}


def test_the_worker_runs_as_the_pods_user(worker: PodContainer) -> None:
    context = worker.pod["securityContext"]
    status = proc_status(worker)
    assert set(status["Uid"]) == {str(context["runAsUser"])}
    assert set(status["Gid"]) == {str(context["runAsGroup"])}
    assert str(context["fsGroup"]) in status["Groups"]
    assert status["CapEff"] == ["0000000000000000"]  # every capability dropped


def test_the_root_filesystem_is_read_only_and_the_pods_mounts_are_writable(worker: PodContainer) -> None:
    # /home/scorekeeper belongs to the worker's user in the image: only a read-only root stops the write
    refused = worker.exec("touch", "/home/scorekeeper/probe")
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
    writable = [m["mountPath"] for m in worker.container["volumeMounts"] if not m.get("readOnly")]
    assert {"/tmp", "/dev/shm", "/var/cache/scorekeeper"} <= set(writable)
    for path in writable:
        written = worker.exec("touch", f"{path}/probe")
        assert written.returncode == 0, f"{path}: {written.stderr}"


def test_the_worker_has_the_rendered_environment(worker: PodContainer) -> None:
    environ = worker.exec("cat", "/proc/1/environ").stdout.split("\0")
    for var in worker.container["env"]:
        assert f"{var['name']}={var['value']}" in environ
    assert "SCOREKEEPER_HOST=0.0.0.0" in environ  # the image's own, for `docker run`


def test_it_serves_the_baked_in_model_at_the_path_the_example_names(worker: PodContainer,
                                                                     hello_world: dict[str, Any]) -> None:
    path = hello_world["spec"]["model"]["uri"].removeprefix("file://")
    command = worker.exec("cat", "/proc/1/cmdline").stdout.split("\0")
    assert command[command.index("--model") + 1] == path
    found = worker.exec("python", "-c", f"import os; print(os.path.isfile(os.path.join({path!r}, 'config.json')))")
    assert found.stdout.strip() == "True"
    status, models = worker.get("http", "/v1/models")
    assert status == 200 and hello_world["metadata"]["name"] in models


def test_it_answers_the_readmes_request_with_the_readmes_scores(worker: PodContainer) -> None:
    body, printed = readme_score_example()
    scores = [row[0] for row in post(worker, "/v1/score", body)["scores"]]
    print("README request answered:", scores)
    assert len(scores) == len(printed) == 3
    for score, digits in zip(scores, printed, strict=True):
        assert f"{score:.10f}".startswith(digits), (scores, printed)


def items_scored(worker: PodContainer) -> float:
    status, text = worker.get("metrics", "/metrics")
    assert status == 200
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "scorekeeper_items_scored" for sample in family.samples
               if sample.name == "scorekeeper_items_scored_total")


def test_it_serves_metrics_on_the_metrics_port(worker: PodContainer) -> None:
    before = items_scored(worker)
    post(worker, "/v1/score", {"query": "capital of California?", "items": ["Sacramento", "bananas"]})
    assert items_scored(worker) == before + 2


def test_the_probes_answer(worker: PodContainer) -> None:
    assert worker.probe("readinessProbe") == 200
    assert worker.probe("livenessProbe") == 200


def test_it_stops_cleanly_on_sigterm(worker: PodContainer) -> None:
    """Last in this module: the worker fixture is stopped here (preStop hook, SIGTERM, within the grace period)."""
    assert worker.terminate() == 0
    logs = worker.logs()
    assert "Traceback" not in logs
    assert not worker.state()["OOMKilled"]  # within the pod's memory limit throughout
