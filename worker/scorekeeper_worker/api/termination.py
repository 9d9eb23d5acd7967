"""A worker that cannot serve says why and exits: one paragraph in the termination-message file (what Kubernetes shows
in the container's last state; the operator turns status 3 into ModelLoadFailed), then an exit status per reason."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

# Exit statuses (docs/operations.md#exit-statuses). 1 is an unexpected crash (with its traceback), 2 a setting that
# cannot be used (argparse, cli.py).
EXIT_LOAD_FAILED = 3  # the model cannot be served: no model at the path, refused, self-check or certificate failed
EXIT_DEVICE_LOST = 4  # the accelerator failed while serving (a sticky CUDA error): a restart recovers it
EXIT_PORT_UNAVAILABLE = 5  # --port or --metrics-port is taken by another process, or not permitted
EXIT_DEVICE_UNAVAILABLE = 6  # --device cuda where torch finds no usable CUDA device
MESSAGE_LIMIT = 4096  # bytes the kubelet keeps of a termination message


def failure_reason(model: Path, error: BaseException) -> str:
    """One paragraph: the model, the kind of failure and its message, whitespace folded, within the size limit."""
    text = " ".join(f"model {model} failed to load: {type(error).__name__}: {error}".split())
    data = text.encode()
    return text if len(data) <= MESSAGE_LIMIT else data[:MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."


def write_termination_message(path: Path, message: str) -> None:
    """Best effort: outside Kubernetes the file usually cannot be created; the log has the message anyway."""
    try:
        path.write_text(message + "\n")
    except OSError as error:
        log.warning("could not write the termination message to %s: %s", path, error)
