"""Rollouts the operator causes reach the ScoringModels a few at a time, never all at once.

A new operator (a `helm upgrade`: another default worker image, or pods rendered differently) changes the pod template
of every ScoringModel at once; rolling them together would take every single-GPU `Recreate` model down together. So
a change of the rendered pod template that no spec change asked for (the live Deployment was rendered from the
model's current generation, or by an operator that did not record it) waits for one of
SCOREKEEPER_MAX_CONCURRENT_UPGRADES slots:

- a waiting model keeps its Deployment and ConfigMap exactly as they are, and reports the change it waits for
  (`status.pendingConfigHash`, `status.pendingWorkerImage`): it rolls once, when its turn comes, never twice;
- a model in a slot holds it until its rollout has progressed: the new configuration serves the capacity the model
  guarantees (its replicas, or with autoscaling its minReplicas; `PACED_CAPACITY_ANNOTATION`), not every pod an HPA
  may want. Progress counts once seen: the operator remembers it and drops the paced annotation, so a drain or an
  eviction later never makes the model a holder again. A model that has failed for want of room (its new pods
  unplaceable past their scheduling deadline, or still waiting to be placed past the Deployment's progress
  deadline: `Degraded=Unschedulable`) frees its slot too. A model whose new pods fail (crash, load, image) keeps it,
  so a broken upgrade stops the wave after that many models;
- every waiting model says the same while the holders move, and names the holders that are stuck, with their
  reason, when there are (`wait_note`): a waiting model is told only when that changes, so a wave costs each waiting
  model a status write or two, not one per step of every holder's rollout;
- a freed slot (a rollout completed, a model deleted: both are Deployment watch events) wakes the model that has
  waited longest, and goes to it and to no other, whichever waiting model's pass comes first: the others get a pass
  only to name the new holder (a status write), never a rollout.

A spec change rolls its model at once: it is the user's request for that model, and it takes any waiting change
along (one rollout, not two). Slots are counted from the watched Deployments (their paced-rollout annotation) and the
decisions not yet visible there, so they need no API request and survive operator restarts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scorekeeper_operator.cache import WatchCache
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION, GENERATION_ANNOTATION

Key = tuple[str, str]  # (namespace, name)
# On the Deployment while an operator-caused rollout runs: its config hash (metadata only: writing it rolls nothing).
PACED_ANNOTATION = "scorekeeper.dev/paced-rollout"
# With it: how many pods of the new configuration must serve before the slot frees (the guaranteed capacity).
PACED_CAPACITY_ANNOTATION = "scorekeeper.dev/paced-capacity"
# Degraded reasons that free a slot: the model failed for want of room, not because of the release.
FREES_SLOT = frozenset({"Unschedulable"})
# Ready reasons of a rollout on its way: a holder with one of these (and not Degraded) moves the wave.
MOVING = frozenset({"AllReplicasReady", "MinimumReplicasAvailable", "RollingOut", "WaitingForReadyReplicas"})


@dataclass(frozen=True)
class Decision:
    hold: bool = False  # wait for a slot: keep the live Deployment and ConfigMap as they are
    paced: bool = False  # this apply starts an operator-caused rollout, in a slot


def annotations(deployment: dict[str, Any]) -> dict[str, str]:
    return dict(deployment.get("metadata", {}).get("annotations") or {})


def template_hash(deployment: dict[str, Any]) -> str | None:
    template = deployment.get("spec", {}).get("template", {}).get("metadata", {})
    value: str | None = (template.get("annotations") or {}).get(CONFIG_HASH_ANNOTATION)
    return value


def progressed(deployment: dict[str, Any]) -> bool:
    """The new template serves the guaranteed capacity: at least that many ready pods are not old ones."""
    status, notes = deployment.get("status") or {}, annotations(deployment)
    want = deployment.get("spec", {}).get("replicas", 1)
    capacity = min(want, int(notes.get(PACED_CAPACITY_ANNOTATION) or want))
    old = status.get("replicas", 0) - status.get("updatedReplicas", 0)
    return (status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
            and status.get("readyReplicas", 0) - max(0, old) >= capacity)


def in_slot(deployment: dict[str, Any]) -> bool:
    """Rolling out an operator-caused change that has not progressed yet (as far as this Deployment shows)."""
    paced = annotations(deployment).get(PACED_ANNOTATION)
    return paced is not None and paced == template_hash(deployment) and not progressed(deployment)


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def stall_reason(status: dict[str, Any]) -> str | None:
    """Why a holder's rollout is stuck, from its computed status (its Degraded reason, else a Ready reason that is
    not a step of a rollout on its way); None while it moves."""
    degraded, ready = _condition(status, "Degraded"), _condition(status, "Ready")
    if degraded.get("status") == "True":
        return str(degraded.get("reason"))
    return None if ready.get("reason") in MOVING else str(ready.get("reason"))


def operator_caused(live: dict[str, Any] | None, generation: int, config_hash: str) -> bool:
    """Would applying `config_hash` roll pods that no spec change asked to roll?"""
    if live is None or template_hash(live) == config_hash:
        return False  # nothing runs yet (it cannot serve anyway), or no rollout at all
    return annotations(live).get(GENERATION_ANNOTATION) in (None, str(generation))


def paced_annotations(live: dict[str, Any] | None, config_hash: str, decision: Decision, capacity: int,
                      finished: bool) -> dict[str, str]:
    """The pacing annotations to apply with the Deployment: set by a paced apply, kept while that rollout is on and
    has not progressed (`finished`: its progress was seen; the next apply drops them, recording it)."""
    if decision.paced or (live is not None and annotations(live).get(PACED_ANNOTATION) == config_hash
                          and not finished):
        return {PACED_ANNOTATION: config_hash, PACED_CAPACITY_ANNOTATION: str(capacity)}
    return {}


def _key(deployment: dict[str, Any]) -> Key:
    return deployment["metadata"].get("namespace", ""), deployment["metadata"]["name"]


class Pacer:
    """The cluster-wide side: slots counted from the watch cache, the queue of waiting models."""

    def __init__(self, max_concurrent: int, cache: WatchCache) -> None:
        self.max_concurrent, self.cache = max_concurrent, cache
        self.waiting: dict[Key, None] = {}  # in arrival order: the longest-waiting first
        self._reserved: set[Key] = set()  # paced applies under way, not yet visible in the cache
        self._failed: dict[Key, str] = {}  # models that failed for want of room → the config hash they failed on
        self._progressed: dict[Key, str] = {}  # models whose paced rollout was seen progressed → its config hash
        self._stalls: dict[Key, str] = {}  # models in a slot whose rollout is stuck → why (stall_reason)
        self._told: str | None = None  # what the waiting models were last told (wait_note)

    def seen(self, deployment: dict[str, Any]) -> None:
        """A Deployment as a watch event or a read showed it: a paced rollout seen progressed is remembered, so that
        losing ready pods later (a drain, an eviction, a crash) never makes it a slot holder again."""
        paced = annotations(deployment).get(PACED_ANNOTATION)
        if paced is not None and paced == template_hash(deployment) and progressed(deployment):
            self._progressed[_key(deployment)] = paced

    def finished(self, deployment: dict[str, Any]) -> bool:
        """Has the paced rollout this Deployment runs been seen progressed (now or before)?"""
        self.seen(deployment)
        return self._progressed.get(_key(deployment)) == template_hash(deployment)

    def busy(self) -> set[Key]:
        running = {_key(d) for d in self.cache.all("deployments") if in_slot(d) and not self.finished(d)
                   and self._failed.get(_key(d)) != template_hash(d)}
        return running | self._reserved

    def holding(self, key: Key) -> bool:
        return key in self.busy()

    def report(self, key: Key, deployment: dict[str, Any] | None, degraded: str, stall: str | None) -> None:
        """A pass of a model observed it: in a slot, a failure for want of room frees the slot, and `stall` says
        why its rollout is stuck (None: it moves)."""
        holding = deployment is not None and self.holding(key)
        if holding and degraded in FREES_SLOT:
            self._failed[key] = template_hash(deployment) or ""  # type: ignore[index]
        if holding and stall is not None and self.holding(key):  # (not when it just failed for want of room)
            self._stalls[key] = stall
        else:
            self._stalls.pop(key, None)

    def news(self) -> bool:
        """Has what the waiting models say changed since they were last told (a holder got stuck, its reason
        changed, it got going again or went away)? Then each needs a pass to say it; this counts as telling them."""
        note = self.wait_note()
        if note == self._told:
            return False
        self._told = note
        return True

    def wait_note(self) -> str:
        """What a waiting model says: the same while the holders move; the stuck ones, and why, when there are."""
        slots = f"waiting for one of {self.max_concurrent} rollout slots (SCOREKEEPER_MAX_CONCURRENT_UPGRADES)"
        held = self.busy()
        stuck = sorted((key, why) for key, why in self._stalls.items() if key in held)
        if not stuck:
            return f"{slots}: the models in them are rolling out; the longest-waiting model goes next"
        return f"{slots}: " + "; ".join(f"{ns}/{name} holds one and is held up ({why})" for (ns, name), why in stuck)

    def decide(self, key: Key, generation: int, live: dict[str, Any] | None, config_hash: str) -> Decision:
        """Synchronous, so that two passes cannot both take the last slot (no await between count and claim).

        A free slot goes to the longest-waiting model whichever pass reaches it first: another waiting model's pass
        may come first (its own pod's event, a held-up holder named), and it must not take it."""
        if not operator_caused(live, generation, config_hash):
            self.waiting.pop(key, None)
            return Decision()
        queue = list(self.waiting)
        ahead = queue.index(key) if key in self.waiting else len(queue)
        if ahead < self.max_concurrent - len(self.busy() - {key}):
            self.waiting.pop(key, None)
            self._reserved.add(key)
            return Decision(paced=True)
        self.waiting.setdefault(key)
        return Decision(hold=True)

    def withdraw(self, key: Key) -> None:
        """Its pass ended before deciding (an invalid spec, a refusal): it waits for no slot, so it must not keep the
        models behind it from one. A later pass that decides queues it again."""
        self.waiting.pop(key, None)

    def settle(self, key: Key) -> None:
        """The paced apply is done (the cache holds its result) or failed: the reservation has served."""
        self._reserved.discard(key)

    def forget(self, key: Key) -> None:
        self.waiting.pop(key, None)
        self._reserved.discard(key)
        self._failed.pop(key, None)
        self._progressed.pop(key, None)
        self._stalls.pop(key, None)

    def next_up(self) -> list[Key]:
        """The waiting models that may take the free slots now, longest-waiting first."""
        free = self.max_concurrent - len(self.busy())
        return list(self.waiting)[:max(0, free)]
