"""The pass-side debounce (issue 36; its mutants killed for issue 49): a pass that reads a generation newer than
the last one rendered, within the debounce window of that rendering (an edit kopf has not delivered yet), renders
nothing and holds the model's next passes until the edits stop; the window runs from the newest generation rendered.

The reconciler's clock is a list the test moves; its API answers only the GET of the ScoringModel, and counts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from scorekeeper_operator import reconcile
from scorekeeper_operator.k8s import KubeApi, ResourceRef
from scorekeeper_operator.reconcile import Reconciler
from scorekeeper_operator.schedule import Key
from scorekeeper_operator.spec.settings import OperatorSettings

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(20)]
KEY: Key = ("ml", "reranker")
WINDOW = 30.0


class Api:
    """Any pass that runs starts with a GET of the ScoringModel: counted here. It is at `generation`, or gone."""

    def __init__(self, generation: int | None = None) -> None:
        self.gets, self.generation = 0, generation

    async def get(self, ref: ResourceRef, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        if self.generation is None:
            return None  # gone: the pass ends there
        return {"metadata": {"namespace": namespace, "name": name, "generation": self.generation}, "spec": {}}

    def close(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    now = [1000.0]
    monkeypatch.setattr(reconcile, "time", SimpleNamespace(monotonic=lambda: now[0]))
    yield now


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_the_window_runs_from_the_newest_generation_rendered(clock: list[float]) -> None:
    reconciler = Reconciler(cast(KubeApi, Api()), OperatorSettings(debounce_seconds=WINDOW))
    try:
        assert not reconciler._settling(KEY, 1)  # generation 1 rendered at 1000
        clock[0] = 1100.0
        assert not reconciler._settling(KEY, 2)  # long after it: rendered at once, and its window runs from now
        clock[0] = 1101.0
        assert reconciler._settling(KEY, 3)  # within generation 2's window (not 1's, long past): held
        assert reconciler._settling(KEY, 3)  # … until the window has passed
        clock[0] = 1100.0 + WINDOW
        assert not reconciler._settling(KEY, 3)
    finally:
        await reconciler.close()


async def test_a_held_pass_holds_the_passes_that_follow_until_the_edits_stop(clock: list[float]) -> None:
    """Whatever asks for them (a child event here; kopf delivering the edit would be the same): held too, so that
    the edit is rendered once, by the pass at the end of the window, not by the next event's pass nor never."""
    api = Api()
    reconciler = Reconciler(cast(KubeApi, api), OperatorSettings(debounce_seconds=WINDOW))
    try:
        assert not reconciler._settling(KEY, 1)
        clock[0] += 1.0
        assert reconciler._settling(KEY, 2)  # a pass read an edit kopf has not delivered yet
        reconciler.trigger(*KEY)  # a child event
        await turns()
        assert api.gets == 0  # no pass ran: the scheduler holds them for the window
        assert reconciler.scheduler.keys == frozenset({KEY})
    finally:
        await reconciler.close()


async def test_a_held_pass_leaves_the_fresh_reads_an_edit_asked_for_to_the_pass_that_renders_it(
        clock: list[float]) -> None:
    """A spec edit asks for fresh reads (a lost watch event leaves no stale child behind); the held pass reads only
    the ScoringModel, so the pass that renders the edit once the window ends must still read everything fresh."""
    api = Api(generation=2)
    reconciler = Reconciler(cast(KubeApi, api), OperatorSettings(debounce_seconds=WINDOW))
    try:
        assert not reconciler._settling(KEY, 1)  # generation 1 rendered now, by a pass that read fresh: …
        reconciler._fresh_until[KEY] = clock[0] + 600  # … the cache serves the passes until the resync
        reconciler.edited(*KEY)  # generation 2 through kopf's update handler: a pass at once, held (1's window)
        await turns()
        assert api.gets == 1
        assert reconciler._fresh(KEY)  # what the pass at the end of the window will read: the API
    finally:
        await reconciler.close()
