"""Issue 49, the pure parts: a slot is held only by a rollout that has not progressed yet (progress counts once
seen), and a model deleted leaves nothing of it in the pacer; waiting models hear only of stuck holders; a rollout
still waiting for room past its progress deadline failed for want of room; the scheduling deadline runs on the
operator's clock; Available holds through a scale-up onto a node being added. (/dev/shm's floor and CPU size:
test_operator_issue36_units.py.)"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import kubernetes.client
import pytest
from harness import NAMESPACE
from scorekeeper_operator.cache import WatchCache
from scorekeeper_operator.k8s import KubeApi
from scorekeeper_operator.pacing import (
    PACED_ANNOTATION,
    PACED_CAPACITY_ANNOTATION,
    Decision,
    Pacer,
    paced_annotations,
    stall_reason,
)
from scorekeeper_operator.reconcile import Reconciler
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION
from scorekeeper_operator.spec.settings import OperatorSettings
from scorekeeper_operator.status.compute import Observed
from scorekeeper_operator.status.pods import placement_clock
from status_fixtures import NOW, assess, at, conditions, desired, event, message, pod, rendered, rolled, unscheduled

NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
ALPHA, BRAVO = (NAMESPACE, "alpha"), (NAMESPACE, "bravo")


def paced(name: str, *, ready: int, config_hash: str = "h") -> dict[str, Any]:
    """A Deployment in a paced rollout of `config_hash`, one pod wanted, `ready` of the new ones ready."""
    return {"metadata": {"name": name, "namespace": NAMESPACE, "generation": 3,
                         "annotations": {PACED_ANNOTATION: config_hash, PACED_CAPACITY_ANNOTATION: "1"}},
            "spec": {"replicas": 1, "template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: config_hash}}}},
            "status": {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1, "readyReplicas": ready}}


def status_with(**found: tuple[str, str]) -> dict[str, Any]:
    return {"conditions": [{"type": kind, "status": flag, "reason": reason} for kind, (flag, reason) in found.items()]}


# -- slots --------------------------------------------------------------------------------------------------------
def test_a_rollout_seen_progressed_holds_no_slot_when_it_loses_ready_pods_later() -> None:
    cache = WatchCache()
    pacer = Pacer(1, cache)
    cache.put("deployments", paced("alpha", ready=0))
    assert pacer.busy() == {ALPHA}
    cache.put("deployments", paced("alpha", ready=1))  # progressed …
    pacer.seen(paced("alpha", ready=1))
    cache.put("deployments", paced("alpha", ready=0))  # … then a drain took its pod
    assert pacer.busy() == set()
    cache.put("deployments", paced("alpha", ready=0, config_hash="h2"))  # a later paced rollout of its own: held
    assert pacer.busy() == {ALPHA}


def test_progress_counts_from_the_watch_event_that_shows_it() -> None:
    """No model waits yet, so nothing counts the slots between the two events: the first one must be remembered."""
    reconciler = Reconciler(KubeApi(kubernetes.client.ApiClient()), OperatorSettings())
    try:
        reconciler.observe("deployments", None, paced("alpha", ready=1))  # the watch shows the progress …
        reconciler.observe("deployments", None, paced("alpha", ready=0))  # … then a drain, before any pass
        assert reconciler.pacer.busy() == set()
    finally:
        reconciler.api.close()


def test_the_paced_annotations_go_once_the_progress_is_seen() -> None:
    live = paced("alpha", ready=1)
    assert paced_annotations(live, "h", Decision(), 1, finished=False) == {PACED_ANNOTATION: "h",
                                                                           PACED_CAPACITY_ANNOTATION: "1"}
    assert paced_annotations(live, "h", Decision(), 1, finished=True) == {}
    assert paced_annotations(live, "h2", Decision(paced=True), 1, finished=True)[PACED_ANNOTATION] == "h2"
    pacer = Pacer(1, WatchCache())
    assert not pacer.finished(paced("alpha", ready=0)) and pacer.finished(live)
    assert pacer.finished(paced("alpha", ready=0))  # remembered


def test_a_model_deleted_and_restored_starts_afresh_in_the_pacer() -> None:
    """Restored from a backup with its Deployment on the old template, it is paced to the same configuration once
    more: what the pacer knew of the deleted model's rollout (progress seen, a failure for want of room, a stall)
    must not let this one skip its slot, or name it held up."""
    cache = WatchCache()
    pacer = Pacer(1, cache)
    pacer.seen(paced("alpha", ready=1))  # progressed, then deleted
    pacer.forget(ALPHA)
    cache.put("deployments", paced("alpha", ready=0))  # restored, and paced again
    assert pacer.busy() == {ALPHA}
    pacer.report(ALPHA, paced("alpha", ready=0), "Unschedulable", "Unschedulable")  # failed for want of room …
    assert pacer.busy() == set()
    pacer.forget(ALPHA)  # … deleted, restored
    assert pacer.busy() == {ALPHA}
    pacer.report(ALPHA, paced("alpha", ready=0), "", "CrashLoopBackOff")  # held up …
    assert "ml/alpha" in pacer.wait_note()
    pacer.forget(ALPHA)  # … deleted (its Deployment not yet collected)
    assert "ml/alpha" not in pacer.wait_note()


# -- what waiting models hear -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("status", "expected"), [
    (status_with(Ready=("True", "AllReplicasReady"), Degraded=("False", "Healthy")), None),
    (status_with(Ready=("False", "RollingOut"), Degraded=("False", "Healthy")), None),
    (status_with(Ready=("False", "WaitingForReadyReplicas"), Degraded=("False", "Healthy")), None),
    (status_with(Ready=("False", "PodsUnschedulable"), Degraded=("False", "Healthy")), "PodsUnschedulable"),
    (status_with(Ready=("False", "NodeProvisioning"), Degraded=("False", "Healthy")), "NodeProvisioning"),
    (status_with(Ready=("True", "MinimumReplicasAvailable"), Degraded=("True", "CrashLoopBackOff")),
     "CrashLoopBackOff"),  # serving on old pods while the new ones crash: stuck
])
def test_a_holder_is_stuck_when_degraded_or_ready_for_a_reason_that_is_no_step_of_a_rollout(
        status: dict[str, Any], expected: str | None) -> None:
    assert stall_reason(status) == expected


def test_waiting_models_hear_of_stuck_holders_and_of_nothing_else() -> None:
    cache = WatchCache()
    pacer = Pacer(1, cache)
    cache.put("deployments", paced("alpha", ready=0))
    pacer.waiting[BRAVO] = None
    moving = pacer.wait_note()
    assert "alpha" not in moving and "rolling out" in moving
    assert pacer.news() is True  # never told yet
    pacer.report(ALPHA, paced("alpha", ready=0), "", None)
    assert pacer.news() is False  # moving: nothing to tell
    pacer.report(ALPHA, paced("alpha", ready=0), "", "PodsUnschedulable")
    assert pacer.news() is True and pacer.news() is False  # told once
    assert pacer.wait_note().endswith(": ml/alpha holds one and is held up (PodsUnschedulable)")
    pacer.report(ALPHA, paced("alpha", ready=0), "", "NodeProvisioning")
    assert pacer.news() is True  # another reason
    pacer.report(BRAVO, None, "", None)
    assert pacer.news() is False  # a waiting model's own pass changes nothing
    pacer.report(ALPHA, paced("alpha", ready=0), "Unschedulable", "Unschedulable")  # failed for want of room
    assert pacer.busy() == set() and pacer.next_up() == [BRAVO]
    assert pacer.news() is True and pacer.wait_note() == moving


def test_a_stuck_holder_that_goes_away_is_no_longer_named() -> None:
    cache = WatchCache()
    pacer = Pacer(1, cache)
    cache.put("deployments", paced("alpha", ready=0))
    pacer.report(ALPHA, paced("alpha", ready=0), "", "CrashLoopBackOff")
    assert pacer.news() is True and "ml/alpha" in pacer.wait_note()
    cache.delete("deployments", paced("alpha", ready=0))  # the garbage collector came first
    pacer.forget(ALPHA)
    assert pacer.news() is True and "ml/alpha" not in pacer.wait_note()


# -- waiting for room past the progress deadline ------------------------------------------------------------------
def deadline_passed(config_hash: str) -> dict[str, Any]:
    return rolled(config_hash, 1, 0, conditions=[{"type": "Progressing", "status": "False",
                                                  "reason": "ProgressDeadlineExceeded",
                                                  "message": 'ReplicaSet "reranker-5d8f" has timed out progressing.'}])


def test_a_rollout_that_only_waits_for_a_node_past_its_progress_deadline_failed_for_want_of_room() -> None:
    r = rendered(replicas=1)
    nominated = {"a": [event("Nominated", "Pod should schedule on: nodeclaim/gpu-1", kind="Normal")]}
    status = assess(desired(r, 1), Observed(deadline_passed(r.config_hash),
                                            [unscheduled("a", r.config_hash, at(2400), NO_GPU)], nominated)).status
    assert conditions(status)["Degraded"] == ("True", "Unschedulable")
    assert "progress deadline" in message(status, "Degraded") and "nodeclaim/gpu-1" in message(status, "Degraded")
    assert conditions(status)["Progressing"] == ("False", "ProgressDeadlineExceeded")


def test_past_the_progress_deadline_a_pod_that_does_something_else_keeps_the_deadline_as_the_reason() -> None:
    r = rendered(replicas=1)
    loading = pod("b", r.config_hash, ready=False, containerStatuses=[{"name": "worker", "ready": False,
                                                                       "restartCount": 0,
                                                                       "state": {"running": {"startedAt": at(5)}}}])
    for pods in ([loading], [unscheduled("a", r.config_hash, at(5)), loading], []):
        status = assess(desired(r, 1), Observed(deadline_passed(r.config_hash), pods)).status
        assert conditions(status)["Degraded"] == ("True", "ProgressDeadlineExceeded")


# -- the scheduling deadline on the operator's clock -----------------------------------------------------------------
def test_the_scheduling_deadline_counts_from_when_the_operator_first_saw_the_wait() -> None:
    """The scheduler's clock 15 minutes behind the operator's: the pod's condition looks 900 s old when the operator
    first sees it, and it is a wait (with the whole deadline left), not a failure."""
    r = rendered(replicas=1)
    pending = unscheduled("a", r.config_hash, at(900), NO_GPU)
    first = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [pending], unplaced_since={"a": NOW}))
    assert conditions(first.status)["Degraded"] == ("False", "Healthy")
    assert first.recheck_in == pytest.approx(600)
    seen = NOW - timedelta(seconds=600)
    late = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [pending], unplaced_since={"a": seen}))
    assert conditions(late.status)["Degraded"] == ("True", "Unschedulable")
    assert message(late.status, "Degraded").endswith("(for 10 min)")


def test_a_wait_past_a_short_deadline_says_seconds_not_a_rounded_minute() -> None:
    r = rendered(replicas=1)
    want = replace(desired(r, 1), scheduling_deadline=30.0)
    seen = {"a": NOW - timedelta(seconds=31)}
    status = assess(want, Observed(rolled(r.config_hash, 1, 0), [unscheduled("a", r.config_hash, at(31))],
                                   unplaced_since=seen)).status
    assert message(status, "Degraded").endswith("(for 31 s)")


def test_a_pod_the_last_status_named_unschedulable_stays_so_after_an_operator_restart() -> None:
    r = rendered(replicas=1)
    pending = unscheduled("a", r.config_hash, at(900), NO_GPU)
    before = {"lastFailure": {"reason": "Unschedulable", "pod": "a", "message": NO_GPU, "time": at(300)}}
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [pending], unplaced_since={"a": NOW}),
                    before).status
    assert conditions(status)["Degraded"] == ("True", "Unschedulable")
    assert "past its scheduling deadline" in message(status, "Degraded")


def test_the_placement_clock_keeps_the_first_sighting_and_forgets_placed_pods() -> None:
    r = rendered(replicas=1)
    waiting, placed = unscheduled("a", r.config_hash, at(900)), pod("b", r.config_hash)
    earlier = NOW - timedelta(seconds=42)
    assert placement_clock([waiting, placed], {"a": earlier, "b": earlier}, NOW) == {"a": earlier}
    assert placement_clock([waiting], {}, NOW) == {"a": NOW}


# -- Available during a scale-up onto a node being added ------------------------------------------------------------
def test_available_stays_true_while_the_model_serves_and_its_new_pods_wait_for_a_node() -> None:
    r = rendered(autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    serving = [pod("a", r.config_hash), pod("b", r.config_hash)]
    before = assess(desired(r, None, min_replicas=2), Observed(rolled(r.config_hash, 2, 2), serving)).status
    pending = [unscheduled(n, r.config_hash, at(60)) for n in ("c", "d")]
    events = {n: [event("TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 1->2 (max: 4)}]", kind="Normal")]
              for n in ("c", "d")}
    later = NOW + timedelta(minutes=1)
    scaling = assess(desired(r, None, min_replicas=2), Observed(rolled(r.config_hash, 4, 2), [*serving, *pending],
                                                                events), before, later).status
    assert conditions(scaling)["Available"] == ("True", "MinimumReplicasAvailable")
    available = next(c for c in scaling["conditions"] if c["type"] == "Available")
    assert available["lastTransitionTime"] == next(c for c in before["conditions"]
                                                   if c["type"] == "Available")["lastTransitionTime"]

