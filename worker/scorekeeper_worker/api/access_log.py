"""uvicorn's logging: its access lines in the worker's format (request ids, control characters escaped)."""

from __future__ import annotations

import logging
from typing import Any

from uvicorn.logging import AccessFormatter

from scorekeeper_worker.base.logs import FORMAT, SafeFormatter, escape_controls

ACCESS_FORMAT = '%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(client_addr)s "%(request_line)s" %(status_code)s'


class SafeAccessFormatter(AccessFormatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """`log_config` for uvicorn: the root logger (the worker's modules) and uvicorn's loggers, one format."""
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {"()": SafeFormatter, "fmt": FORMAT},
            "access": {"()": SafeAccessFormatter, "fmt": ACCESS_FORMAT, "use_colors": False},
        },
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"},
            "access": {"class": "logging.StreamHandler", "formatter": "access", "stream": "ext://sys.stdout"},
        },
        "loggers": {
            "": {"handlers": ["default"], "level": level},
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            # uvicorn's life-cycle lines ("Started server process", "Application startup complete") only at DEBUG:
            # the worker says itself when it listens, loads and is ready (api/server.py, serving/service.py).
            "uvicorn.error": {"level": "WARNING" if level == "INFO" else level},
            "uvicorn.access": {"handlers": ["access"], "level": level, "propagate": False},
        },
    }
