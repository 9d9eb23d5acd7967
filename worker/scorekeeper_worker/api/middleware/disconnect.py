"""A client that goes away cancels its request's work.

Starlette (and so FastAPI) never cancels a route handler when its client disconnects: the handler runs to the end
and its response is thrown away. So a scoring route races its work against the ASGI `receive` channel, which, once
the body has been read, yields nothing until `http.disconnect`. Cancelling the work task lets the service drop the
request's queued units (`Scheduler.cancel`). Pure ASGI: it works under any middleware that passes `receive` on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from scorekeeper_worker.api.error_shape import ClientDisconnected

log = logging.getLogger(__name__)
T = TypeVar("T")
Receive = Callable[[], Awaitable[Mapping[str, Any]]]


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # more body or an empty message: the body was complete already, keep listening


async def cancel_on_disconnect(work: Coroutine[Any, Any, T], receive: Receive) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise `ClientDisconnected`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself was cancelled (server shutting down)
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    if watcher.exception() is not None:  # the channel failed, not the client: carry on without a watch
        log.debug("disconnect watch ended: %r", watcher.exception())
        return await task
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected("the client closed the connection; its queued work was dropped")
