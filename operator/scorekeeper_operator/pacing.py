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
  may want. A model that has failed for want of room (its new pods unplaceable past their scheduling deadline)
  frees its slot too. A model whose new pods fail (crash, load, image) keeps it, so a broken upgrade stops the wave
  after that many models; every waiting model names the models that hold the slots, and why (`wait_note`);
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
    """Rolling out an operator-caused change that has not progressed yet."""
    paced = annotations(deployment).get(PACED_ANNOTATION)
    return paced is not None and paced == template_hash(deployment) and not progressed(deployment)


def operator_caused(live: dict[str, Any] | None, generation: int, config_hash: str) -> bool:
    """Would applying `config_hash` roll pods that no spec change asked to roll?"""
    if live is None or template_hash(live) == config_hash:
        return False  # nothing runs yet (it cannot serve anyway), or no rollout at all
    return annotations(live).get(GENERATION_ANNOTATION) in (None, str(generation))


def paced_annotations(live: dict[str, Any] | None, config_hash: str, decision: Decision,
                      capacity: int) -> dict[str, str]:
    """The pacing annotations to apply with the Deployment: set by a paced apply, kept while that rollout is on."""
    if decision.paced or (live is not None and annotations(live).get(PACED_ANNOTATION) == config_hash):
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
        self._notes: dict[Key, str] = {}  # models in a slot → why they still hold it (their Ready condition)

    def busy(self) -> set[Key]:
        running = {_key(d) for d in self.cache.all("deployments")
                   if in_slot(d) and self._failed.get(_key(d)) != template_hash(d)}
        return running | self._reserved

    def holding(self, key: Key) -> bool:
        return key in self.busy()

    def report(self, key: Key, deployment: dict[str, Any] | None, degraded: str, note: str) -> bool:
        """A pass of a model in a slot observed it: a failure for want of room frees the slot; `note` says why it
        holds it otherwise. True when what the waiting models say changes (they need a pass to say it)."""
        if deployment is None or not self.holding(key):
            return self._notes.pop(key, None) is not None
        if degraded in FREES_SLOT:
            self._failed[key] = template_hash(deployment) or ""
            self._notes.pop(key, None)
            return True
        changed = self._notes.get(key) != note
        self._notes[key] = note
        return changed

    def wait_note(self) -> str:
        """What a waiting model says: which models hold the slots, and why."""
        held = sorted(self.busy())
        if not held:
            return "waiting for a rollout slot: one is free, and the longest-waiting model takes it next"
        why = "; ".join(f"{ns}/{name} holds one ({self._notes.get((ns, name), 'its rollout has not progressed')})"
                        for ns, name in held)
        return f"waiting for one of {self.max_concurrent} rollout slots (SCOREKEEPER_MAX_CONCURRENT_UPGRADES): {why}"

    def decide(self, key: Key, generation: int, live: dict[str, Any] | None, config_hash: str) -> Decision:
        """Synchronous, so that two passes cannot both take the last slot (no await between count and claim).

        A free slot goes to the longest-waiting model whichever pass reaches it first: the other waiting models get
        passes at that moment too (the holder they name changed), and one of them must not take it."""
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
        self._notes.pop(key, None)

    def next_up(self) -> list[Key]:
        """The waiting models that may take the free slots now, longest-waiting first."""
        free = self.max_concurrent - len(self.busy())
        return list(self.waiting)[:max(0, free)]
