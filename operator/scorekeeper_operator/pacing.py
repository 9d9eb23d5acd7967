"""Rollouts the operator causes reach the ScoringModels a few at a time, never all at once.

A new operator (a `helm upgrade`: another default worker image, or pods rendered differently) changes the pod template
of every ScoringModel at once; rolling them together would take every single-GPU `Recreate` model down together. So
a change of the rendered pod template that no spec change asked for (the live Deployment was rendered from the
model's current generation, or by an operator that did not record it) waits for one of
SCOREKEEPER_MAX_CONCURRENT_UPGRADES slots:

- a waiting model keeps its Deployment and ConfigMap exactly as they are, and reports the change it waits for
  (`status.pendingConfigHash`, `status.pendingWorkerImage`): it rolls once, when its turn comes, never twice;
- a model in a slot holds it until its rollout completes (the Deployment controller has observed the template and
  every wanted pod of it is ready), so a broken upgrade stops the wave after that many models;
- a freed slot (a rollout completed, a model deleted: both are Deployment watch events) goes to the model that has
  waited longest, and to no other, so a wave costs one pass per model, not one per model per completed rollout.

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


def rolled_out(deployment: dict[str, Any]) -> bool:
    """The Deployment controller has observed the newest template and every wanted pod of it is ready."""
    status = deployment.get("status") or {}
    want = deployment.get("spec", {}).get("replicas", 1)
    return (status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
            and status.get("updatedReplicas", 0) >= want and status.get("readyReplicas", 0) >= want
            and status.get("replicas", 0) == status.get("updatedReplicas", 0))


def in_slot(deployment: dict[str, Any]) -> bool:
    """Rolling out an operator-caused change that has not completed."""
    paced = annotations(deployment).get(PACED_ANNOTATION)
    return paced is not None and paced == template_hash(deployment) and not rolled_out(deployment)


def operator_caused(live: dict[str, Any] | None, generation: int, config_hash: str) -> bool:
    """Would applying `config_hash` roll pods that no spec change asked to roll?"""
    if live is None or template_hash(live) == config_hash:
        return False  # nothing runs yet (it cannot serve anyway), or no rollout at all
    return annotations(live).get(GENERATION_ANNOTATION) in (None, str(generation))


def paced_annotations(live: dict[str, Any] | None, config_hash: str, decision: Decision) -> dict[str, str]:
    """The pacing annotation to apply with the Deployment: set by a paced apply, kept while that rollout is on."""
    if decision.paced or (live is not None and annotations(live).get(PACED_ANNOTATION) == config_hash):
        return {PACED_ANNOTATION: config_hash}
    return {}


class Pacer:
    """The cluster-wide side: slots counted from the watch cache, the queue of waiting models."""

    def __init__(self, max_concurrent: int, cache: WatchCache) -> None:
        self.max_concurrent, self.cache = max_concurrent, cache
        self.waiting: dict[Key, None] = {}  # in arrival order: the longest-waiting first
        self._reserved: set[Key] = set()  # paced applies under way, not yet visible in the cache

    def busy(self) -> set[Key]:
        running = {(d["metadata"].get("namespace", ""), d["metadata"]["name"])
                   for d in self.cache.all("deployments") if in_slot(d)}
        return running | self._reserved

    def decide(self, key: Key, generation: int, live: dict[str, Any] | None, config_hash: str) -> Decision:
        """Synchronous, so that two passes cannot both take the last slot (no await between count and claim)."""
        if not operator_caused(live, generation, config_hash):
            self.waiting.pop(key, None)
            return Decision()
        if len(self.busy() - {key}) < self.max_concurrent:
            self.waiting.pop(key, None)
            self._reserved.add(key)
            return Decision(paced=True)
        self.waiting.setdefault(key)
        return Decision(hold=True)

    def settle(self, key: Key) -> None:
        """The paced apply is done (the cache holds its result) or failed: the reservation has served."""
        self._reserved.discard(key)

    def forget(self, key: Key) -> None:
        self.waiting.pop(key, None)
        self._reserved.discard(key)

    def next_up(self) -> list[Key]:
        """The waiting models that may take the free slots now, longest-waiting first."""
        free = self.max_concurrent - len(self.busy())
        return list(self.waiting)[:max(0, free)]
