"""Domain errors: what the worker refuses and why, in its own words. They know nothing of HTTP; the edge
(`api/error_shape.py`) gives each its status code, type and headers, in one table; the command line (`cli.py`) gives
each start-up refusal its exit status.

Every message names what is at fault (a request field first: `items[2]: ...`), because it reaches the client as is.
"""

from __future__ import annotations

from typing import ClassVar


class ScoringError(Exception):
    """A refusal the worker means to give; anything else that escapes a request is an internal error."""

    # scorekeeper_rejected_requests_total{reason}: set on refusals that protect capacity.
    reason: ClassVar[str | None] = None
    # scorekeeper_cancelled_requests_total{reason}: set on requests whose queued work was dropped.
    cancelled: ClassVar[str | None] = None

    def __init__(self, message: str) -> None:
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __str__(self) -> str:  # pydantic reads str() of a ValueError raised in a validator
        return self.message


class Invalid(ScoringError, ValueError):
    """The request is wrong at `field` (`items[2]`, `label_token_ids`, ...), which the error carries as data and its
    message names first (`field: problem`). A ValueError too, so pydantic validators may raise it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class ResponseTooLarge(Invalid):
    """The response could exceed --max-response-bytes: refused before any work."""

    reason = "response_bytes"


class IntermediateTooLarge(Invalid):
    """A tensor the request would make the worker hold at once exceeds --max-intermediate-bytes: refused before any
    forward (serving/prepare.py)."""

    reason = "intermediate_bytes"


class TooLarge(ScoringError):
    """The request would run more tokens through the model than --max-request-tokens (planned, before queueing)."""

    reason = "request_tokens"


class Overloaded(ScoringError):
    """The queue is full (or the worker is stopping); the client should retry later."""

    reason = "queue_full"

    def __init__(self, message: str) -> None:
        super().__init__(f"server busy: {message}")


class NotReady(ScoringError):
    """The model is loading or warming up, or the worker is draining."""


class DeviceLost(NotReady):
    """A forward left the accelerator unusable (a CUDA error is sticky): the worker stops being ready and exits so
    that it is restarted; every request in flight gets this (503 with Retry-After: another replica can serve it)."""

    cancelled = "device_lost"


class Timeout(ScoringError):
    """The request ran past its deadline (--request-timeout-seconds); its remaining work is dropped."""

    cancelled = "timeout"


class NonFiniteScore(ScoringError):
    """The model's output overflowed: an internal error, never a score of NaN or inf."""


class StartupRefused(Exception):
    """A reason the worker will not start, known before it serves: said in one line, with an exit status of its own
    (cli.py maps each kind to it), never with a traceback."""


class ModelRefused(StartupRefused):
    """The model path holds no model, or one the worker does not serve (found from its files, before any weights)."""


class DeviceUnavailable(StartupRefused):
    """The device asked for is not on this machine (--device cuda where torch sees no CUDA device)."""


class PortUnavailable(StartupRefused):
    """A port the worker must listen on is taken by another process, or not permitted."""
