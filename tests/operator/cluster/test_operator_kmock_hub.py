"""hf:// revisions, with the real operator against the emulator and a fake Hugging Face Hub on loopback: a revision is
resolved to a commit once and stays that commit across replicas, operator restarts, a failed status write and moves
of the branch; another revision in the spec resolves again; a 40-hex revision never asks the Hub; refusals and
outages are reported or retried; an air-gapped operator never downloads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_hub import FakeHub
from harness import NAMESPACE, Cluster, running_operator, scoring_model
from model_checks import condition, model_status

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]
FILES = {"config.json": b"{}", "model.safetensors": b"weights"}
REVISION_CALL = "/api/models/org/name/revision/"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub().running() as running:
        yield running


def operator_env(hub: FakeHub, **extra: str) -> dict[str, str]:
    return {"SCOREKEEPER_HF_ENDPOINT": hub.url, "SCOREKEEPER_HF_TOKEN": hub.token, **extra}


def download(pod: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in pod["initContainers"] if c["name"] == "download-model")
    return found


def pinned(cluster: Cluster) -> tuple[str, str, int] | None:
    """(HF_REVISION of the download, the worker's --model, replicas) of the live Deployment."""
    deployment = cluster.get("deployments", NAMESPACE, "reranker")
    if deployment is None:
        return None
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in download(pod)["env"]}
    args = pod["containers"][0]["args"]
    return env["HF_REVISION"], args[args.index("--model") + 1], deployment["spec"].get("replicas", 1)


async def create(cluster: Cluster, **source: Any) -> None:
    await cluster.create("scoringmodels", NAMESPACE, scoring_model(model={"uri": "hf://org/name", **source}))


async def test_a_branch_is_resolved_once_and_every_replica_and_restart_keeps_that_commit(
        cluster: Cluster, hub: FakeHub) -> None:
    first = hub.commit("org/name", FILES)
    async with running_operator(cluster, env=operator_env(hub)):
        await create(cluster, revision="main")
        await cluster.wait_for(lambda: pinned(cluster), what="deployment")
        assert model_status(cluster)["model"] == {"uri": "hf://org/name", "revision": "main",
                                                  "resolvedRevision": first}
        assert pinned(cluster) == (first, f"/models/org/name/{first}", 1)
        moved = hub.commit("org/name", {**FILES, "model.safetensors": b"retrained"})  # main moves on
        assert moved != first
        await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"replicas": 3}})
        await cluster.wait_for(lambda: (pinned(cluster) or ("", "", 0))[2] == 3, what="3 replicas")
        assert pinned(cluster) == (first, f"/models/org/name/{first}", 3)
    async with running_operator(cluster, env=operator_env(hub)):  # a restarted operator (resume handler)
        await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"replicas": 2}})
        await cluster.wait_for(lambda: (pinned(cluster) or ("", "", 0))[2] == 2, what="2 replicas")
        assert pinned(cluster) == (first, f"/models/org/name/{first}", 2)
        assert model_status(cluster)["model"]["resolvedRevision"] == first
    assert hub.calls("GET", REVISION_CALL) == 1


async def test_a_commit_whose_status_write_failed_is_kept_without_asking_the_hub_again(cluster: Cluster,
                                                                                    hub: FakeHub) -> None:
    """The pass that resolved the branch could not record the commit (its status write failed); the branch moves
    before the retry, whose read of the ScoringModel shows no commit: the operator remembers the one it resolved."""
    first = hub.commit("org/name", FILES)
    hold = cluster.emulator.hold("PATCH", "scoringmodels", subresource="status")
    async with running_operator(cluster, env=operator_env(hub)):
        await create(cluster, revision="main")
        await cluster.wait_for(lambda: hold.held, what="the commit being recorded")
        moved = hub.commit("org/name", {**FILES, "model.safetensors": b"retrained"})  # main moves on
        hold.release(fail_with=503)  # that write fails; the pass is retried
        await cluster.wait_for(lambda: pinned(cluster), what="deployment")
        assert pinned(cluster) == (first, f"/models/org/name/{first}", 1) and moved != first
        await cluster.wait_for(lambda: model_status(cluster).get("model", {}).get("resolvedRevision") == first)
    assert hub.calls("GET", REVISION_CALL) == 1


async def test_another_revision_in_the_spec_resolves_again(cluster: Cluster, hub: FakeHub) -> None:
    hub.commit("org/name", FILES)
    tagged = hub.commit("org/name", {**FILES, "tokenizer.json": b"{}"}, ref="v2")
    async with running_operator(cluster, env=operator_env(hub)):
        await create(cluster, revision="main")
        await cluster.wait_for(lambda: pinned(cluster), what="deployment")
        await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"model": {"revision": "v2"}}})
        await cluster.wait_for(lambda: (pinned(cluster) or ("",))[0] == tagged, what="the v2 commit")
        await cluster.wait_for(lambda: model_status(cluster).get("model", {}).get("revision") == "v2")
        assert model_status(cluster)["model"]["resolvedRevision"] == tagged
    assert hub.calls("GET", REVISION_CALL + "main") == hub.calls("GET", REVISION_CALL + "v2") == 1


async def test_a_commit_needs_no_hub_and_no_revision_means_the_default_branch(cluster: Cluster,
                                                                            hub: FakeHub) -> None:
    commit = hub.commit("org/name", FILES)
    async with running_operator(cluster, env=operator_env(hub)):
        await create(cluster, revision=commit)
        await cluster.wait_for(lambda: pinned(cluster), what="deployment")
        assert pinned(cluster) == (commit, f"/models/org/name/{commit}", 1)
        assert hub.requests == []
        await cluster.delete("scoringmodels", NAMESPACE, "reranker")
        await cluster.wait_for(lambda: cluster.get("deployments", NAMESPACE, "reranker") is None, what="collected")
        await create(cluster)  # no revision
        await cluster.wait_for(lambda: pinned(cluster), what="deployment")
        assert pinned(cluster) == (commit, f"/models/org/name/{commit}", 1)
        assert [path for _, path in hub.requests] == ["/api/models/org/name"]


@pytest.mark.parametrize(("source", "reason", "message"), [
    ({"revision": "no-such-branch"}, "RevisionNotFound", "HTTP 404"),
    ({"uri": "hf://org/private"}, "HubAccessDenied", "private or gated repository needs the operator's Hub token"),
])
async def test_a_refused_resolution_is_reported_not_retried(cluster: Cluster, hub: FakeHub, source: dict[str, str],
                                                            reason: str, message: str) -> None:
    hub.commit("org/name", FILES)
    hub.commit("org/private", FILES, private=True)
    async with running_operator(cluster, env={"SCOREKEEPER_HF_ENDPOINT": hub.url}):  # no operator token
        await create(cluster, **source)
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("False", reason), what=reason)
        config_valid = next(c for c in model_status(cluster)["conditions"] if c["type"] == "ConfigValid")
        assert message in config_valid["message"]
        assert cluster.get("deployments", NAMESPACE, "reranker") is None
        assert "model" not in model_status(cluster)
    assert hub.calls("GET", "/api/models/") == 1


async def test_a_hub_outage_is_reported_and_retried_until_it_answers(cluster: Cluster, hub: FakeHub) -> None:
    """Issue 25: an unreachable Hub left a new model with an empty status, like a silent 403."""
    commit = hub.commit("org/name", FILES)
    hub.fail(503, times=2)
    async with running_operator(cluster, env=operator_env(hub)):
        await create(cluster, revision="main")
        await cluster.wait_for(lambda: pinned(cluster), what="deployment after the outage")
        assert pinned(cluster) == (commit, f"/models/org/name/{commit}", 1)
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("True", "Valid"), what="healed")
    assert hub.calls("GET", REVISION_CALL) == 3
    reported = [c for version in cluster.versions("scoringmodels", NAMESPACE, "reranker")
                for c in (version.get("status") or {}).get("conditions", []) if c["type"] == "ConfigValid"]
    outage = next(c for c in reported if c["status"] == "False")
    assert outage["reason"] == "HubUnavailable" and "HTTP 503" in outage["message"]
    first = await cluster.wait_for(lambda: next((p for p in cluster.passes if p.error == "HubUnavailable"), None))
    assert "status" in first.wrote and "event" in first.wrote  # the first pass that met it said so


async def test_an_air_gapped_operator_serves_only_pinned_commits_from_a_cache(cluster: Cluster,
                                                                             hub: FakeHub) -> None:
    commit = hub.commit("org/name", FILES)
    air_gapped = operator_env(hub, SCOREKEEPER_ALLOW_HF_DOWNLOAD="false")
    async with running_operator(cluster, env=air_gapped):
        await create(cluster, revision="main", cache={"claimName": "hub-cache"})
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("False", "ModelSourceUnavailable"))
        await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"model": {"revision": commit}}})
        await cluster.wait_for(lambda: pinned(cluster), what="deployment")
        pod = (cluster.get("deployments", NAMESPACE, "reranker") or {})["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in download(pod)["env"]}
        assert env["HF_HUB_OFFLINE"] == "1"  # the init container only checks the cache
        assert {v["name"]: v for v in pod["volumes"]}["model"]["persistentVolumeClaim"] == {"claimName": "hub-cache"}
    assert hub.requests == []
