"""How many CPU threads the model gets (`--threads auto|N`), and setting them in torch before any parallel work.

`auto` is the smaller of the cgroup CPU quota (serving/startup/cgroup_cpu.py: a pod's `limits.cpu`) and the CPUs of the
process's affinity mask (a cpuset, `taskset`). Torch's default is one thread per CPU the machine has, so a pod limited
to one CPU on a 64-core node would start 64 OpenMP threads that the quota throttles in turn: every parallel region
then waits for its slowest, throttled thread.

Whether the CPUs are the process's own (a Guaranteed pod's exclusive cpuset under the static CPU manager) or shared
with other processes (`cgroup_cpu.dedicated_cpus`) decides how OpenMP threads wait: the command line sets that before
torch loads (openmp_env.openmp_defaults); it is logged here and exported as `scorekeeper_cpu_dedicated`. So is the
OpenMP runtime torch really runs on (`--openmp-runtime`: openmp_env.loaded_runtime), as `scorekeeper_openmp_runtime`."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from scorekeeper_worker.serving.startup.cgroup_cpu import cpu_quota, dedicated_cpus, threads_for_quota

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuThreads:
    threads: int
    quota: float | None  # CPUs of the cgroup quota, None without one
    affinity: int  # CPUs in the affinity mask
    reason: str  # for the start-up log line
    dedicated: bool = False  # whole CPUs of its own (an exclusive cpuset as large as the quota), not shared


def affinity_cpus() -> int:
    return len(os.sched_getaffinity(0))


def resolve(setting: int | Literal["auto"], quota: Callable[[], float | None] = cpu_quota,
            affinity: Callable[[], int] = affinity_cpus, online: int | None = None) -> CpuThreads:
    """`--threads` → the thread count, with what it was derived from (`online`: the machine's CPUs)."""
    cpus, limit = affinity(), quota()
    dedicated = dedicated_cpus(limit, cpus, online or os.cpu_count() or cpus)
    described = (f"cgroup quota {limit:g} CPUs" if limit is not None else "no cgroup quota") + \
        f", {cpus} CPUs in the affinity mask ({'dedicated' if dedicated else 'shared'})"
    if setting != "auto":
        return CpuThreads(setting, limit, cpus, f"--threads {setting} ({described})", dedicated)
    threads = min(cpus, threads_for_quota(limit)) if limit is not None else cpus
    return CpuThreads(max(1, threads), limit, cpus, f"auto: {described}", dedicated)


def apply(choice: CpuThreads, runtime: str = "unknown") -> None:
    """Torch's intra-op threads, and inter-op threads to match. Call before the model loads: each thread reads the
    intra-op count at its first parallel region, and the inter-op pool can be sized only before it starts (a second
    server in the same process keeps the first one's inter-op pool)."""
    torch.set_num_threads(choice.threads)
    if torch.get_num_interop_threads() != choice.threads:
        try:
            torch.set_num_interop_threads(choice.threads)
        except RuntimeError as error:  # already started (or already set) in this process
            log.warning("inter-op threads stay at %d: %s", torch.get_num_interop_threads(), error)
    log.info("CPU threads: %d (%s); torch intra-op %d, inter-op %d; OpenMP runtime %s: OMP_WAIT_POLICY=%s "
             "GOMP_SPINCOUNT=%s KMP_BLOCKTIME=%s", choice.threads, choice.reason, torch.get_num_threads(),
             torch.get_num_interop_threads(), runtime, *(os.environ.get(variable, "(unset)") for variable in (
                 "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")))
