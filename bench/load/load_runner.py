"""One open-loop load step against a running worker: every request of a fixed schedule, sent on time, whatever the
server does meanwhile; the worker's metrics scraped around it.

The client is aiohttp: about 0.1 ms of CPU per request of the sglang-mis shape, where httpx took about 3 ms. On a
2-core machine the client shares the worker's cores: with httpx it could not send more than about 150 requests/s on
time, and the sweep measured the client."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from bench.load.load_metrics import Sample, parse, view
from bench.load.load_stats import TRANSPORT_ERROR, UNFINISHED, Outcome, Step, summarize

JSON = {"content-type": "application/json"}
# A body and its item count for request number i (the runner numbers requests across steps).
BodyFor = Callable[[int], tuple[bytes, int]]


@dataclass(frozen=True)
class Target:
    score_url: str  # …/v1/score
    metrics_url: str | None  # …/metrics, or None: no server-side view


async def post(client: aiohttp.ClientSession, url: str, body: bytes) -> int:
    """POST a JSON body and read the whole answer; its status."""
    async with client.post(url, data=body, headers=JSON) as response:
        await response.read()
        return response.status


async def _one(client: aiohttp.ClientSession, url: str, body: bytes, items: int, due: float,
               offset: float) -> Outcome:
    await asyncio.sleep(max(0.0, due - time.perf_counter()))
    sent = time.perf_counter()
    try:
        status = await post(client, url, body)
    except (aiohttp.ClientError, OSError):
        status = TRANSPORT_ERROR
    latency = time.perf_counter() - due if status == 200 else math.inf
    return Outcome(scheduled_s=offset, send_lag_s=max(0.0, sent - due), status=status, latency_s=latency, items=items)


async def send_schedule(client: aiohttp.ClientSession, url: str, schedule: list[float], body_for: BodyFor,
                        first_index: int, drain_s: float) -> tuple[list[Outcome], float]:
    """Send request `first_index + k` at `schedule[k]` seconds from now (open loop: sending never waits for an
    answer), wait for answers until `drain_s` after the last arrival, abandon the rest (the client disconnects, so the
    worker drops their work). Returns the outcomes in schedule order and the wall time from the first arrival to the
    last answer (or to the deadline, when requests were abandoned)."""
    start = time.perf_counter()
    tasks = []
    for k, offset in enumerate(schedule):
        body, items = body_for(first_index + k)
        tasks.append(asyncio.create_task(_one(client, url, body, items, start + offset, offset)))
    if not tasks:
        return [], 0.0
    deadline = start + schedule[-1] + drain_s
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
    finished_at = time.perf_counter()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    outcomes = []
    for k, task in enumerate(tasks):
        if task in done:
            outcomes.append(task.result())
        else:
            outcomes.append(Outcome(schedule[k], 0.0, UNFINISHED, math.inf, body_for(first_index + k)[1]))
    return outcomes, finished_at - (start + schedule[0])


async def scrape(client: aiohttp.ClientSession, target: Target) -> Sample:
    if target.metrics_url is None:
        return {}
    async with client.get(target.metrics_url, raise_for_status=True) as response:
        return parse(await response.text())


async def settle(client: aiohttp.ClientSession, target: Target, timeout_s: float) -> None:
    """Wait until the worker holds no request (abandoned ones included), so a step never inherits a backlog."""
    deadline = time.perf_counter() + timeout_s
    while target.metrics_url is not None and time.perf_counter() < deadline:
        sample = await scrape(client, target)
        if sample.get(("scorekeeper_queue_depth", ()), 0.0) == 0:
            return
        await asyncio.sleep(0.2)


async def run_step(client: aiohttp.ClientSession, target: Target, arm: str, qps: float, schedule: list[float],
                   body_for: BodyFor, first_index: int, drain_s: float) -> Step:
    await settle(client, target, timeout_s=drain_s)
    before = await scrape(client, target)
    outcomes, wall_s = await send_schedule(client, target.score_url, schedule, body_for, first_index, drain_s)
    step = summarize(arm, qps, outcomes, wall_s)
    step.load_avg = os.getloadavg()[0]
    await settle(client, target, timeout_s=drain_s)
    if before:
        step.server = view(before, await scrape(client, target), wall_s)
    return step
