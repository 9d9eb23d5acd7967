"""What the operator's watches have told it: every child and worker pod of every ScoringModel, by name.

kopf watches the child kinds and the worker pods with the managed-by label selector (handlers.py). Its index handlers
put each object here, and kopf holds every handler (the `resume` passes included) until each indexed kind has been
listed once, so the cache is complete before the first pass reads it. A reconcile pass then reads children from
memory: on the steady path one request (GET the ScoringModel) instead of one per child, and pacing decisions count
the Deployments of every model without listing them.

The API stays the authority. An object the cache does not hold is read from the API (a foreign object of that name
carries no label of ours: a missing entry never means "free to take"); a spec change, a pass after an error and the
periodic resync read everything fresh and put it back here (a watch event lost while a stream was down leaves no
ghost for longer); our own writes go in at once. An older version never replaces a newer one: resourceVersions are
compared as numbers where they are numbers (etcd's are), and deletions leave a short memory of their version: only a
newer version brings the object back (a DELETED event may carry the last version itself).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

INSTANCE_LABEL = "app.kubernetes.io/instance"
Key = tuple[str, str, str]  # (plural, namespace, name)
TOMBSTONES = 4096  # versions of recently deleted objects remembered, so that a late stale event cannot revive one


def _version(obj: dict[str, Any]) -> int | None:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


def _key(plural: str, obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return plural, meta.get("namespace") or "", meta["name"]


def instance_of(obj: dict[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(INSTANCE_LABEL)


class WatchCache:
    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, Any]] = {}
        self._instances: collections.defaultdict[tuple[str, str, str], set[str]] = collections.defaultdict(set)
        self._deleted: collections.OrderedDict[Key, int] = collections.OrderedDict()

    def _newer(self, key: Key, obj: dict[str, Any]) -> bool:
        version = _version(obj)
        if version is None:
            return True  # not a number: nothing to compare, the latest word wins
        known = self._objects.get(key)
        if known is None:  # deleted at that version: only a later one (re-created) is news
            deleted = self._deleted.get(key)
            return deleted is None or version > deleted
        before = _version(known)
        return before is None or version >= before

    def _store(self, key: Key, obj: dict[str, Any]) -> None:
        self._drop(key)
        self._objects[key] = obj
        if (instance := instance_of(obj)) is not None:
            self._instances[key[0], key[1], instance].add(key[2])

    def _drop(self, key: Key) -> None:
        old = self._objects.pop(key, None)
        if old is not None and (instance := instance_of(old)) is not None:
            names = self._instances[key[0], key[1], instance]
            names.discard(key[2])
            if not names:
                del self._instances[key[0], key[1], instance]

    def put(self, plural: str, obj: dict[str, Any]) -> None:
        """A watch event (ADDED, MODIFIED, listed), a fresh read or our own write."""
        key = _key(plural, obj)
        if self._newer(key, obj):
            self._store(key, obj)
            self._deleted.pop(key, None)

    def delete(self, plural: str, obj: dict[str, Any]) -> None:
        """A DELETED watch event (also: the object left the label selection)."""
        key = _key(plural, obj)
        if not self._newer(key, obj):
            return
        self._drop(key)
        version = _version(obj)
        if version is not None:
            self._deleted[key] = version
            self._deleted.move_to_end(key)
            while len(self._deleted) > TOMBSTONES:
                self._deleted.popitem(last=False)

    def discard(self, plural: str, namespace: str, name: str) -> None:
        """A fresh read found nothing there (404)."""
        self._drop((plural, namespace, name))

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((plural, namespace, name))

    def of_instance(self, plural: str, namespace: str, instance: str) -> list[dict[str, Any]]:
        """Every cached object of this kind labelled as this ScoringModel's (its worker pods), by name."""
        names = sorted(self._instances.get((plural, namespace, instance), ()))
        return [self._objects[plural, namespace, name] for name in names]

    def replace_instance(self, plural: str, namespace: str, instance: str, fresh: Iterable[dict[str, Any]]) -> None:
        """A fresh LIST of this model's objects of a kind: what it did not return is gone, and what it returned
        replaces the cached object unless a watch event brought a newer version while the LIST was answered."""
        listed = list(fresh)
        names = {obj["metadata"]["name"] for obj in listed}
        for name in list(self._instances.get((plural, namespace, instance), ())):
            if name not in names:
                self._drop((plural, namespace, name))
        for obj in listed:
            key = _key(plural, obj)
            if self._newer(key, obj):
                self._store(key, obj)

    def all(self, plural: str) -> list[dict[str, Any]]:
        return [obj for (kind, _, _), obj in self._objects.items() if kind == plural]

    def forget_instance(self, namespace: str, instance: str) -> None:
        """The ScoringModel is gone: its children are the garbage collector's now."""
        for plural, ns, name in list(self._instances):
            if ns == namespace and name == instance:
                for child in list(self._instances.get((plural, ns, name), ())):
                    self._drop((plural, ns, child))
