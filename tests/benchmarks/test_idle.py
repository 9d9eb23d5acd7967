"""bench/harness/idle.py: the benchmarks time the next system only once the last one has stopped using the CPU."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from bench.harness import idle

# Answers each line on stdin, then keeps a thread busy for the CPU time the line names (as vLLM's worker busy-polls
# after a response), then waits for the next line.
CHILD = """
import sys, threading, time
def spin(seconds):
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass
for line in sys.stdin:
    worker = threading.Thread(target=spin, args=(float(line),))
    worker.start()
    print("answered", flush=True)
    worker.join()
"""


@contextmanager
def server() -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def ask(child: subprocess.Popen[str], spin_seconds: float) -> None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"{spin_seconds}\n")
    child.stdin.flush()
    assert child.stdout.readline() == "answered\n"


def test_settle_waits_out_the_work_a_system_does_after_answering() -> None:
    with server() as child:
        ask(child, 0.4)
        used, became_idle = idle.settle({child.pid})
        assert became_idle
        assert used >= 0.3  # the busy thread's 0.4 CPU-seconds, less what it ran before the first reading
        assert idle.settle({child.pid})[1]  # and it stays idle until asked again


def test_settle_reports_a_system_that_never_goes_idle() -> None:
    with server() as child:
        ask(child, 3600.0)
        used, became_idle = idle.settle({child.pid}, timeout=0.5)
        assert not became_idle
        assert used > 0


def test_cpu_seconds_counts_only_the_given_sessions() -> None:
    with server() as busy, server() as other:
        ask(busy, 0.3)
        idle.settle({busy.pid})
        assert idle.cpu_seconds({busy.pid}) >= 0.3
        assert idle.cpu_seconds({other.pid}) < 0.3
