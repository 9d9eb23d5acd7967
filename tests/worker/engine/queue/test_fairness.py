"""One request never holds the model for others: batches are filled across open requests, least recently served
first, so a small request sent while a large one runs is in the very next batch, and a stream of small requests
cannot starve a large one. Asserted on batch composition (a scheduler observer), never on time."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from scorekeeper_worker.base.metrics import size_class
from scorekeeper_worker.engine.queue.batching import OpenRequest, arrival_turn, take_batch
from scorekeeper_worker.engine.runner.packing import PackUnit
from serving import BatchGate, RunningServer, wait_until

LARGE = {"query": [5] * 56, "items": [[6 + i] * 8 for i in range(20)]}  # 20 units of 64 tokens: a batch each
SMALL = {"query": [7, 8], "items": [[9, 10]]}  # one unit of 4 tokens


def _request(name: str, unit_tokens: list[int], batches_formed: int = 0) -> OpenRequest:
    units = deque(PackUnit([1] * tokens) for tokens in unit_tokens)
    return OpenRequest(name, units, sum(unit_tokens), "small", arrival_turn(batches_formed))  # type: ignore[arg-type]


def _names(batch: list[tuple[OpenRequest, PackUnit]]) -> list[str]:
    return [str(request.job) for request, _ in batch]


def test_batches_round_robin_over_requests_by_unit() -> None:
    a, b, c = _request("a", [10] * 5), _request("b", [10] * 2), _request("c", [30, 30])
    batch, waiting = take_batch([a, b, c], 70, 0)
    # One unit per request per pass, in arrival order, while units fit; c's second unit does not, so c sits out.
    assert _names(batch) == ["a", "b", "c", "a", "b"]
    assert all(r.queued_tokens == sum(u.num_tokens for u in r.units) for r in (a, b, c))
    assert waiting == [a, c]  # b is done; the others keep their order for the next batch


def test_a_request_that_arrives_mid_batch_goes_first() -> None:
    large = _request("large", [40] * 10)
    batch, waiting = take_batch([large], 40, 0)
    assert _names(batch) == ["large"]
    small = _request("small", [5], batches_formed=1)  # admitted while batch 0 runs
    waiting = sorted([*waiting, small], key=lambda r: r.turn)
    batch, waiting = take_batch(waiting, 40, 1)
    assert _names(batch) == ["small"]  # first, and the large request's 40-token unit no longer fits beside it
    batch, _ = take_batch(waiting, 40, 2)
    assert _names(batch) == ["large"]


def test_a_stream_of_small_requests_cannot_starve_a_large_one() -> None:
    large = _request("large", [40] * 20)
    waiting = [large]
    served = []
    for formed in range(12):
        # Every batch, new small requests arrive that need half a batch; each large unit needs a whole one.
        waiting = sorted([*waiting, *(_request(f"s{formed}.{i}", [10], formed) for i in range(2))],
                         key=lambda r: r.turn)
        batch, waiting = take_batch(waiting, 40, formed)
        served.append("large" in _names(batch))
    # Each request gets its turn: the large one every other batch, the small ones in between (none waits more than
    # one batch). A request only ever waits behind those that arrived before it was last served, so under overload
    # its share is bounded by the queue (--max-queue-tokens), never zero.
    assert served == [True, False] * 6, served
    assert all(request.job == "large" for request in waiting)


def test_size_classes() -> None:
    assert [size_class(t, 1024) for t in (1, 128, 129, 1024, 1025)] == ["small", "small", "medium", "medium",
                                                                         "large"]


def _queue_wait_counts(server: RunningServer) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {sample.labels["size"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "scorekeeper_queue_wait_seconds_count"}


def test_a_later_small_request_is_in_the_very_next_batch(tiny_model: Callable[[str], Path],
                                                         server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"), max_batch_tokens=64)
    alone_large = server.score(**LARGE).json()["scores"]
    alone_small = server.score(**SMALL).json()["scores"]
    waits_before = _queue_wait_counts(server)
    with BatchGate(server.scheduler, hold=True) as gate, ThreadPoolExecutor(2) as pool:
        large = pool.submit(server.score, **LARGE)
        gate.wait_held()  # the large request's first batch is formed; the model thread waits before running it
        small = pool.submit(server.score, **SMALL)
        wait_until("the small request to be admitted", lambda: server.scheduler.open_requests == 2)
        gate.release()
        large_response, small_response = large.result(), small.result()
    sizes = [[job.num_items for job, _ in batch] for batch in gate.batches]
    # First come, first served would run the small request after all 20 large units.
    assert sizes == [[20], [1]] + [[20]] * 19, sizes
    np.testing.assert_allclose(large_response.json()["scores"], alone_large, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(small_response.json()["scores"], alone_small, rtol=1e-5, atol=1e-6)
    waits = _queue_wait_counts(server)
    assert {size: waits[size] - waits_before.get(size, 0) for size in waits} == {"small": 1, "medium": 0,
                                                                                 "large": 1}
