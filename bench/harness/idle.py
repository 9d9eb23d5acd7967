"""Wait until a system under test has stopped using the CPU after answering, so the next one is timed on idle cores.

A benchmark that alternates systems on the same CPUs assumes each one sits idle while another is timed. vLLM's CPU
server does not: its worker process busy-polls its shared-memory message queue for a second after the last message
(`SpinCondition`, `busy_loop_s = 1` in vllm/distributed/device_communicators/shm_broadcast.py), 0.85–0.99
CPU-seconds after every request of bench_cpu.py, so whichever system was timed next shared a core with it. `settle`
waits for that to end and returns what it cost, which the benchmark reports in a column of its own.

CPU time is the kernel's count for every process of a process session (`/proc/PID/stat`: user and system time,
threads that have ended included, in clock ticks of 10 ms); each server and peer leads a session of its own
(`start_new_session`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection

IDLE_WINDOW_S = 0.2  # how long a system must stay (nearly) idle
IDLE_SECONDS = 0.01  # CPU time it may use meanwhile: one clock tick (5 % of a CPU); a busy-poll uses 20
SETTLE_TIMEOUT_S = 30.0
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(sessions: Collection[int]) -> float:
    """CPU time used so far by every live process in `sessions` (all its threads, ended ones included)."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) not in sessions:
                continue
            with open(f"{entry.path}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
        except (OSError, ValueError):  # the process ended meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return ticks * _TICK_S


def settle(sessions: Collection[int], timeout: float = SETTLE_TIMEOUT_S) -> tuple[float, bool]:
    """Wait until `sessions` use at most IDLE_SECONDS of CPU over IDLE_WINDOW_S. Returns the CPU-seconds they used
    meanwhile and whether they became idle within `timeout`."""
    started = previous = cpu_seconds(sessions)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(IDLE_WINDOW_S)
        now = cpu_seconds(sessions)
        if now - previous <= IDLE_SECONDS + 1e-9:
            return now - started, True
        previous = now
    return previous - started, False
