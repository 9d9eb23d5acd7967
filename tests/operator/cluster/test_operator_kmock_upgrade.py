"""Rollouts the operator causes (a `helm upgrade`: a new default worker image, pods rendered differently) reach the
ScoringModels a bounded number at a time: the real operator, restarted as a new release, against the emulator, which
plays the Deployment controller by reporting rollouts complete when the test says so."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import set_deployment_status
from harness import NAMESPACE, Cluster, running_operator, scoring_model
from scorekeeper_operator.cache import WatchCache
from scorekeeper_operator.pacing import PACED_ANNOTATION, Decision, Pacer, operator_caused, progressed
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION, GENERATION_ANNOTATION
from scorekeeper_operator.spec import flags, pod_layout

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
            and not progressed(cluster.get("deployments", NAMESPACE, n) or {})]


def slot_wait(cluster: Cluster, name: str) -> str:
    """What a waiting model says about the rollout slots: its UpgradePending message."""
    found = next((c for c in status_of(cluster, name).get("conditions", []) if c["type"] == "UpgradePending"), {})
    return str(found.get("message", ""))


def templates(cluster: Cluster, name: str) -> list[str]:
    """The pod templates (config hashes) the Deployment went through, in order: each change is one rollout."""
    seen: list[str] = []
    for version in cluster.versions("deployments", NAMESPACE, name):
        found = version["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        if not seen or seen[-1] != found:
            seen.append(found)
    return seen


async def serving(cluster: Cluster, *names: str, **spec: Any) -> None:
    for name in names:
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(name, **spec))
    for name in names:
        await cluster.wait_for(lambda n=name: cluster.get("deployments", NAMESPACE, n), timeout=WAIT,  # type: ignore[misc]
                               what=name)
        await set_deployment_status(cluster, ready=1, model=name)


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
    waiting model polls nothing: a Deployment event (a completed rollout, a deleted model) frees its slot."""
    for name in MODELS:
        report = await cluster.reconciled(name, timeout=WAIT)
        if image_of(cluster, name) == OLD:
            # the resync only; no apply of any kind (its status may say more about the holder: UpgradePending)
            assert report.next_pass_in == 600 and set(report.wrote) <= {"status"}


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_new_default_image_rolls_one_model_at_a_time(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
        await serving(cluster, "pinned", image="own:7")
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
    assert all(len(templates(cluster, n)) == 2 for n in MODELS)  # each rolled once


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_model_whose_upgrade_never_becomes_ready_stops_the_wave(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW,
                                              "SCOREKEEPER_MAX_CONCURRENT_UPGRADES": "2"}):
        await settled(cluster, on_new=2)
        for name in upgrading(cluster):  # the broken image: new pods never get ready
            await set_deployment_status(cluster, ready=0, model=name)
        await looked_again(cluster)
        assert len(upgrading(cluster)) == 2 and sum(image_of(cluster, n) == OLD for n in MODELS) == 1


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_pods_rendered_differently_roll_one_model_at_a_time_and_each_once(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25: any change to how pods are rendered, not only the image, rolled every model at once; and a model
    waiting for its image rolled twice (first on the old image, rendered the new way). Issue 36: a waiting model's
    ConfigMap changed early, so its running pods read new templates before their rollout."""
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    first = {n: templates(cluster, n) for n in MODELS}
    configs = {n: len(cluster.versions("configmaps", NAMESPACE, n)) for n in MODELS}
    monkeypatch.setitem(pod_layout.WORKER_ENV, "SCOREKEEPER_RELEASE_NOTE", "3")  # the new release renders this
    release_files = flags.config_files
    monkeypatch.setattr(flags, "config_files", lambda model: {**release_files(model), "release.txt": "3"})
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        order = []
        for step in range(1, len(MODELS) + 1):
            await settled(cluster, on_new=step)
            (moving,) = upgrading(cluster)
            order.append(moving)
            for name in MODELS:
                if image_of(cluster, name) == OLD:  # waiting: not touched at all, and says what it waits for
                    assert templates(cluster, name) == first[name]
                    assert len(cluster.versions("configmaps", NAMESPACE, name)) == configs[name]  # not even that
                    assert status_of(cluster, name)["pendingConfigHash"] != status_of(cluster, name)["configHash"]
                    assert status_of(cluster, name)["configHash"] == first[name][-1]
            env = cluster.get("deployments", NAMESPACE, moving)["spec"]["template"]["spec"]["containers"][0]["env"]
            assert {"name": "SCOREKEEPER_RELEASE_NOTE", "value": "3"} in env
            await set_deployment_status(cluster, ready=1, model=moving)
    assert sorted(order) == sorted(MODELS)
    assert all(len(templates(cluster, n)) == 2 for n in MODELS)  # one rollout each


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_freed_slot_wakes_the_longest_waiting_model_and_no_other(cluster: Cluster) -> None:
    """The release of waiting upgrades: a completed rollout lets the next model go at once (no polling: with it
    removed, nothing would wake a waiting model before the resync), and only as many as there are free slots. The
    model that still waits is told nothing (the holders move: what it says stays the same), and rolls nothing."""
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (moving,) = upgrading(cluster)
        waiting = [name for _, name in cluster.memo.reconciler.pacer.waiting]  # type: ignore[union-attr]
        assert sorted(waiting) == sorted(n for n in MODELS if n != moving)  # longest-waiting first
        woken, still = waiting
        before = len(cluster.passes)
        await set_deployment_status(cluster, ready=1, model=moving)
        await cluster.wait_for(lambda: sum(image_of(cluster, n) == NEW for n in MODELS) == 2, timeout=WAIT,
                               what="the next model upgrading")
        assert image_of(cluster, woken) == NEW and image_of(cluster, still) == OLD
        said = slot_wait(cluster, still)
        await looked_again(cluster)  # every model had a pass that started after the slot went
        passes = [p.wrote for p in cluster.passes[before:] if p.key == (NAMESPACE, still)]
        assert passes and all(wrote == [] for wrote in passes)  # neither woken to roll nor rewritten
        assert slot_wait(cluster, still) == said and woken not in said
        await cluster.delete("scoringmodels", NAMESPACE, woken)  # a deleted model frees its slot too
        await cluster.wait_for(lambda: image_of(cluster, still) == NEW, timeout=WAIT, what="the last model")


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_spec_change_of_a_waiting_model_rolls_it_at_once_and_once(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        waiting = next(n for n in MODELS if image_of(cluster, n) == OLD)
        await cluster.patch("scoringmodels", NAMESPACE, waiting, {"spec": {"scoring": {"maxBatchTokens": 4096}}})
        await cluster.wait_for(lambda: image_of(cluster, waiting) == NEW, timeout=WAIT, what="rolled with the spec")
        await cluster.wait_for(lambda: status_of(cluster, waiting)["observedGeneration"] == 2, what="status")
        assert len(templates(cluster, waiting)) == 2 and "pendingWorkerImage" not in status_of(cluster, waiting)
        assert len(upgrading(cluster)) == 2  # the user's rollout is theirs: it takes no slot from the wave


# -- the pure decision ---------------------------------------------------------------------------------------------
def _deployment(config_hash: str, generation: str | None = "2", *, paced: str | None = None,
                ready: int = 1, name: str = "x") -> dict[str, Any]:
    notes = {k: v for k, v in ((GENERATION_ANNOTATION, generation), (PACED_ANNOTATION, paced)) if v is not None}
    return {"metadata": {"name": name, "namespace": NAMESPACE, "generation": 4, "annotations": notes},
            "spec": {"replicas": 1, "template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: config_hash}}}},
            "status": {"observedGeneration": 4, "replicas": 1, "updatedReplicas": 1, "readyReplicas": ready}}


@pytest.mark.parametrize(("live", "expected"), [
    (None, False),  # nothing runs yet
    (_deployment("new"), False),  # no rollout at all
    (_deployment("old", generation="1"), False),  # the user changed the spec since: theirs, at once
    (_deployment("old"), True),  # same generation, another template: the operator's
    (_deployment("old", generation=None), True),  # rendered by an operator that did not record it
])
def test_operator_caused(live: dict[str, Any] | None, expected: bool) -> None:
    assert operator_caused(live, 2, "new") is expected


def test_slots_come_from_the_cache_and_from_decisions_not_yet_visible_there() -> None:
    cache = WatchCache()
    pacer = Pacer(2, cache)
    cache.put("deployments", _deployment("h1", paced="h1", ready=0, name="busy"))  # a paced rollout under way
    cache.put("deployments", _deployment("h2", paced="h2", ready=1, name="done"))  # completed: no slot
    assert pacer.decide((NAMESPACE, "a"), 2, _deployment("old", name="a"), "new") == Decision(paced=True)
    assert pacer.decide((NAMESPACE, "b"), 2, _deployment("old", name="b"), "new") == Decision(hold=True)
    assert list(pacer.waiting) == [(NAMESPACE, "b")] and pacer.next_up() == []
    pacer.settle((NAMESPACE, "a"))  # its apply failed (the cache shows no paced rollout for it): the slot is free
    assert pacer.next_up() == [(NAMESPACE, "b")]


def test_a_free_slot_goes_to_the_longest_waiting_model_whichever_pass_comes_first() -> None:
    cache = WatchCache()
    pacer = Pacer(1, cache)
    cache.put("deployments", _deployment("h1", paced="h1", ready=0, name="busy"))
    for name in ("first", "second"):
        assert pacer.decide((NAMESPACE, name), 2, _deployment("old", name=name), "new") == Decision(hold=True)
    cache.put("deployments", _deployment("h1", paced="h1", ready=1, name="busy"))  # its rollout progressed
    for name in ("second", "late"):  # a pass for another reason (the holder it names changed, a pod event)
        assert pacer.decide((NAMESPACE, name), 2, _deployment("old", name=name), "new") == Decision(hold=True)
    assert pacer.next_up() == [(NAMESPACE, "first")]
    pacer.withdraw((NAMESPACE, "first"))  # its pass stopped at an error: it no longer keeps the others waiting
    assert pacer.decide((NAMESPACE, "second"), 2, _deployment("old", name="second"), "new") == Decision(paced=True)
    assert list(pacer.waiting) == [(NAMESPACE, "late")]


def test_progress_needs_the_new_generation_observed_and_new_pods_ready() -> None:
    assert progressed(_deployment("h"))
    assert not progressed({**_deployment("h"), "status": {"observedGeneration": 3, "replicas": 1,
                                                          "updatedReplicas": 1, "readyReplicas": 1}})
    assert not progressed(_deployment("h", ready=0))
    old_pods_left = _deployment("h")
    old_pods_left["status"]["replicas"] = 2  # the ready pod may be the old one
    assert not progressed(old_pods_left)
