"""A new default worker image reaches the ScoringModels a few at a time, never all at once.

`helm upgrade` changes the operator's default image (SCOREKEEPER_WORKER_IMAGE), which is part of every pod template
that uses it. Rolling them all at once would take every single-GPU `Recreate` model down together. Instead at most
`max_concurrent_upgrades` Deployments run a not-yet-rolled-out default image at a time; the others keep the image
they run, report `status.pendingWorkerImage`, and move on when a slot frees. A model whose new pods never become
ready keeps its slot, so a broken image stops the wave after that many models. A ScoringModel that names its own
`spec.image` is never touched by a new default.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from scorekeeper_operator.k8s import CHILD_KINDS, KubeApi
from scorekeeper_operator.render.manifests import DEFAULT_IMAGE_ANNOTATION, MANAGED_SELECTOR
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, name)
# A waiting model is re-checked this often even if no rollout completion wakes it (deleted models free slots too).
RECHECK_SECONDS = 30.0


@dataclass(frozen=True)
class ImageChoice:
    image: str | None  # the default image to render with (None: the model names its own in spec.image)
    pending: str | None = None  # the newer default image this model waits for


def running_default_image(deployment: dict[str, Any] | None) -> str | None:
    """The default image a live Deployment was rendered with (None: none yet, or spec.image chose it)."""
    if deployment is None:
        return None
    image: str | None = (deployment["metadata"].get("annotations") or {}).get(DEFAULT_IMAGE_ANNOTATION)
    return image


def rolled_out(deployment: dict[str, Any]) -> bool:
    """The Deployment controller has observed the newest template and every wanted pod of it is ready."""
    status = deployment.get("status") or {}
    want = deployment.get("spec", {}).get("replicas", 1)
    return (status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
            and status.get("updatedReplicas", 0) >= want and status.get("readyReplicas", 0) >= want
            and status.get("replicas", 0) == status.get("updatedReplicas", 0))


def choose(model: ScoringModel, settings: OperatorSettings, live: dict[str, Any] | None, busy: int) -> ImageChoice:
    """Pure: the default image this model renders with now, given how many other models are mid-upgrade."""
    if model.spec.image:
        return ImageChoice(None)
    running = running_default_image(live)
    if running is None or running == settings.worker_image or busy < settings.max_concurrent_upgrades:
        return ImageChoice(settings.worker_image)
    return ImageChoice(running, pending=settings.worker_image)


class ImageRollout:
    """The cluster-wide side of `choose`: counts models mid-upgrade and serializes the decisions to upgrade."""

    def __init__(self, api: KubeApi, settings: OperatorSettings) -> None:
        self.api, self.settings = api, settings
        self._lock = asyncio.Lock()
        self.waiting: set[Key] = set()

    async def _busy(self, other_than: Key) -> int:
        """Managed Deployments (other than this one) on the new default image whose rollout has not finished."""
        busy = 0
        for namespace in self.settings.namespaces or ("",):  # "": all namespaces
            managed = await self.api.list(CHILD_KINDS["Deployment"], namespace, label_selector=MANAGED_SELECTOR)
            for deployment in managed:
                meta = deployment["metadata"]
                if (meta.get("namespace"), meta["name"]) != other_than \
                        and running_default_image(deployment) == self.settings.worker_image \
                        and not rolled_out(deployment):
                    busy += 1
        return busy

    @contextlib.asynccontextmanager
    async def decide(self, model: ScoringModel) -> AsyncIterator[ImageChoice]:
        """The image to render with; for a model that would upgrade, held under one lock until it is applied, so
        that two models cannot both take the last slot."""
        key = (model.namespace, model.name)
        live = None if model.spec.image else await self.api.get(CHILD_KINDS["Deployment"], *key)
        if running_default_image(live) in (None, self.settings.worker_image):
            self.waiting.discard(key)
            yield choose(model, self.settings, live, busy=0)  # no upgrade involved: no counting, no lock
            return
        async with self._lock:
            choice = choose(model, self.settings, live, await self._busy(other_than=key))
            (self.waiting.add if choice.pending else self.waiting.discard)(key)
            yield choice

    def frees_a_slot(self, deployment: dict[str, Any] | None) -> bool:
        """This Deployment has finished rolling out the current default: a waiting model may go now."""
        return deployment is not None and running_default_image(deployment) == self.settings.worker_image \
            and rolled_out(deployment)
