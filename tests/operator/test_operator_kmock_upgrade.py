"""A new default worker image (a `helm upgrade`) reaches the ScoringModels a bounded number at a time: the real
operator, restarted with a new SCOREKEEPER_WORKER_IMAGE, against the emulator, which plays the Deployment
controller by reporting rollouts complete when the test says so."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import set_deployment_status
from harness import NAMESPACE, Cluster, running_operator, scoring_model
from scorekeeper_operator.image_rollout import RECHECK_SECONDS, ImageChoice, choose, rolled_out
from scorekeeper_operator.render.manifests import DEFAULT_IMAGE_ANNOTATION
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings

MODELS = ("alpha", "bravo", "charlie")
OLD, NEW = "registry.example/worker:1", "registry.example/worker:2"
WAIT = 60.0


def image_of(cluster: Cluster, name: str) -> str:
    deployment = cluster.get("deployments", NAMESPACE, name) or {}
    image: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    return image


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return (cluster.get("scoringmodels", NAMESPACE, name) or {}).get("status") or {}


def upgrading(cluster: Cluster) -> list[str]:
    """Models on the new image whose rollout the 'Deployment controller' has not finished."""
    return [n for n in MODELS if image_of(cluster, n) == NEW
            and not rolled_out(cluster.get("deployments", NAMESPACE, n) or {})]


async def settled(cluster: Cluster, on_new: int) -> None:
    # Generous deadlines: the waits poll and return as soon as the state is there, and a loaded CI box is slow.
    await cluster.wait_for(lambda: sum(image_of(cluster, n) == NEW for n in MODELS) == on_new, timeout=WAIT,
                           what=f"{on_new} models on the new image")
    await cluster.wait_for(lambda: all(status_of(cluster, n).get("pendingWorkerImage") == NEW
                                       for n in MODELS if image_of(cluster, n) == OLD), timeout=WAIT,
                           what="pending reported")
    await looked_again(cluster)


async def looked_again(cluster: Cluster) -> None:
    """Every model has had a pass that started after every change so far: a model that could move has moved. A
    waiting model comes back by itself (a slot freed by a deleted model sends it no event)."""
    for name in MODELS:
        report = await cluster.reconciled(name, timeout=WAIT)
        if image_of(cluster, name) == OLD:
            assert report.next_pass_in == RECHECK_SECONDS


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_new_default_image_rolls_one_model_at_a_time(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        for name in MODELS:
            await cluster.create("scoringmodels", NAMESPACE, scoring_model(name))
        await cluster.create("scoringmodels", NAMESPACE, scoring_model("pinned", image="own:7"))
        for name in (*MODELS, "pinned"):
            await cluster.wait_for(lambda n=name: cluster.get("deployments", NAMESPACE, n), timeout=WAIT,  # type: ignore[misc]
                                   what=name)
            await set_deployment_status(cluster, ready=1, model=name)
    assert [image_of(cluster, n) for n in MODELS] == [OLD] * 3

    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW,
                                              "SCOREKEEPER_MAX_CONCURRENT_UPGRADES": "1"}):
        for step in range(1, len(MODELS) + 1):
            await settled(cluster, on_new=step)
            (moving,) = upgrading(cluster)  # never two at once
            waiting = [n for n in MODELS if image_of(cluster, n) == OLD]
            assert all(status_of(cluster, n)["workerImage"] == OLD for n in waiting)
            assert status_of(cluster, moving)["workerImage"] == NEW
            assert "pendingWorkerImage" not in status_of(cluster, moving)
            await set_deployment_status(cluster, ready=1, model=moving)  # its new pods are ready: the slot frees
        await cluster.wait_for(lambda: not any(status_of(cluster, n).get("pendingWorkerImage") for n in MODELS),
                               timeout=WAIT, what="nothing pending")
        assert image_of(cluster, "pinned") == "own:7"  # its own spec.image: untouched by the default


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_model_whose_upgrade_never_becomes_ready_stops_the_wave(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        for name in MODELS:
            await cluster.create("scoringmodels", NAMESPACE, scoring_model(name))
            await cluster.wait_for(lambda n=name: cluster.get("deployments", NAMESPACE, n), timeout=WAIT,  # type: ignore[misc]
                                   what=name)
            await set_deployment_status(cluster, ready=1, model=name)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW,
                                              "SCOREKEEPER_MAX_CONCURRENT_UPGRADES": "2"}):
        await settled(cluster, on_new=2)
        for name in upgrading(cluster):  # the broken image: new pods never get ready
            await set_deployment_status(cluster, ready=0, model=name)
        await looked_again(cluster)
        assert len(upgrading(cluster)) == 2 and sum(image_of(cluster, n) == OLD for n in MODELS) == 1


# -- the pure decision ---------------------------------------------------------------------------------------------
def _deployment(image: str | None, generation: int = 2, observed: int = 2, ready: int = 1) -> dict[str, Any]:
    annotations = {DEFAULT_IMAGE_ANNOTATION: image} if image else {}
    return {"metadata": {"generation": generation, "annotations": annotations}, "spec": {"replicas": 1},
            "status": {"observedGeneration": observed, "replicas": 1, "updatedReplicas": 1, "readyReplicas": ready}}


@pytest.mark.parametrize(("image", "live", "busy", "expected"), [
    ("", None, 5, ImageChoice(NEW)),  # a new model starts on the current default
    ("", _deployment(NEW), 5, ImageChoice(NEW)),  # already there
    ("", _deployment(OLD), 0, ImageChoice(NEW)),  # a free slot
    ("", _deployment(OLD), 1, ImageChoice(OLD, pending=NEW)),  # no slot: keep the running image
    ("", _deployment(None), 1, ImageChoice(NEW)),  # spec.image was just removed: the user asked for the default
    ("mine:1", _deployment(OLD), 1, ImageChoice(None)),  # its own image
])
def test_choose(image: str, live: dict[str, Any] | None, busy: int, expected: ImageChoice) -> None:
    body = scoring_model(image=image) if image else scoring_model()
    model = ScoringModel.from_body(body)
    assert choose(model, OperatorSettings(worker_image=NEW, max_concurrent_upgrades=1), live, busy) == expected


def test_rolled_out_needs_the_new_generation_observed_and_every_pod_ready() -> None:
    assert rolled_out(_deployment(NEW))
    assert not rolled_out(_deployment(NEW, generation=3, observed=2))
    assert not rolled_out(_deployment(NEW, ready=0))
    old_pods_left = _deployment(NEW)
    old_pods_left["status"]["replicas"] = 2
    assert not rolled_out(old_pods_left)
