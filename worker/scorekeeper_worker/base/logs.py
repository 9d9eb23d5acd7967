"""Logging: every record carries the id of the request being handled (`request_id`, "-" outside a request), and the
worker's own lines and uvicorn's access lines (api/access_log.py) share one format that shows it.

A line is one record: control characters in what a client sent (a path with `%0D%0A`, a header echoed in a message)
are written escaped (`\\r`, `\\n`, `\\x1b`), so nobody can forge a line in the log. A traceback, appended after
the message, keeps its own lines.
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar
from typing import Any

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="-")
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"

_base_factory = logging.getLogRecordFactory()
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class SafeFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))


def _record_with_request_id(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record = _base_factory(*args, **kwargs)
    record.request_id = REQUEST_ID.get()
    return record


def install_request_ids() -> None:
    """Stamp the current request id on every log record (a record factory, so any handler can format it)."""
    logging.setLogRecordFactory(_record_with_request_id)
