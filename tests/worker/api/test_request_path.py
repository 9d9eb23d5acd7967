"""How far one /v1/score request travels through the worker: the files it crosses (at most 24, a ratchet:
docs/architecture.md "One request, file by file"), and never handed back to the service after
planning. Every worker function the request runs is recorded, on every thread it crosses (the
event loop, the worker thread that plans it, the model thread), with a profiler installed before the server
starts, so each thread has it."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import scorekeeper_worker
from serving import RunningServer

PACKAGE = Path(scorekeeper_worker.__file__).parent
# A ratchet: lower it as files merge. Raised once, from 20, when the engine's loop was pipelined: the device stream,
# the batch's heads, the fair batching and the row-block packer each became a file of its own (one job per file).
MAX_FILES = 24


class CallRecorder:
    """The worker functions called while `recording` is set, in call order (file, function)."""

    def __init__(self) -> None:
        self.recording = False
        self.calls: list[tuple[str, str]] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.recording and frame.f_code.co_filename.startswith(str(PACKAGE)):
            where = str(Path(frame.f_code.co_filename).relative_to(PACKAGE))
            self.calls.append((where, frame.f_code.co_name))


@pytest.fixture
def traced(tiny_model: Callable[[str], Path]) -> Iterator[tuple[RunningServer, CallRecorder]]:
    recorder = CallRecorder()
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    try:
        server = RunningServer(model=tiny_model("qwen3-cls3"))
        try:
            yield server, recorder
        finally:
            server.stop()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)


def test_a_score_request_crosses_few_files_and_never_returns_to_the_service(
        traced: tuple[RunningServer, CallRecorder]) -> None:
    server, recorder = traced
    server.score(query="warm up", items=["a"]).raise_for_status()  # lazily created threads and caches
    gc.disable()  # the GC pause observer (serving/startup/gc_pauses.py) runs whenever GC does, not for the request
    recorder.recording = True
    try:
        response = server.score(query="What is the capital of France?", items=["Paris", "Berlin"])
    finally:
        recorder.recording = False
        gc.enable()
    response.raise_for_status()
    files = sorted({where for where, _ in recorder.calls})
    assert "engine/runner/executor.py" in files and "planning/planner.py" in files  # the recorder saw every thread
    assert len(files) <= MAX_FILES, files
    planned = max(i for i, call in enumerate(recorder.calls) if call == ("planning/planner.py", "plan"))
    back = [name for where, name in recorder.calls[planned:] if where == "serving/service.py"]
    # Only the request's own await chain resumes there (a coroutine's resumption is a call), then the finite check
    # (run_job's generator over the job's values).
    allowed = {"run", "bounded", "_run", "run_job", "<lambda>", "_values", "_all_finite", "<listcomp>", "<genexpr>"}
    assert set(back) <= allowed, back
