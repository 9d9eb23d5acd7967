"""The CPU quota of this process's cgroup (a pod's `limits.cpu`), read the way the kernel enforces it.

cgroup v2: `cpu.max` ("QUOTA PERIOD", or "max PERIOD" without a limit); cgroup v1: `cpu.cfs_quota_us` (-1 without a
limit) over `cpu.cfs_period_us`. The process's cgroup comes from /proc/self/cgroup and the hierarchy's mount point
from /proc/self/mountinfo; every ancestor up to the mount point is read too, because a limit set on a parent (a
pod's cgroup above its container's) bounds its children. With both hierarchies mounted (hybrid), the smaller limit
counts. Pure file reading: no torch here, so the command line can use it before torch is imported."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    root: str  # the cgroup path that the mount point shows (not "/" when a container sees only its own subtree)
    point: Path
    version: int  # 1 or 2


def _mounts(mountinfo: str, root: Path) -> list[Mount]:
    """cgroup mounts with the cpu controller, from /proc/self/mountinfo (mount points placed under `root`)."""
    found = []
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        fs_type, options = extra[0], extra[2].split(",")
        point = root / parts[4].lstrip("/")
        if fs_type == "cgroup2":
            found.append(Mount(parts[3], point, 2))
        elif fs_type == "cgroup" and "cpu" in options:
            found.append(Mount(parts[3], point, 1))
    return found


def _paths(cgroup: str) -> dict[int, str]:
    """/proc/self/cgroup → {1: the v1 cpu controller's path, 2: the unified path}."""
    paths: dict[int, str] = {}
    for line in cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            paths[2] = path
        elif "cpu" in controllers.split(","):
            paths[1] = path
    return paths


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _limit(directory: Path, version: int) -> float | None:
    """CPUs allowed by this one cgroup directory, None without a limit (or without the files)."""
    if version == 2:
        text = _read(directory / "cpu.max")
        if text is None:
            return None
        quota, _, period = text.partition(" ")
        return None if quota == "max" else int(quota) / int(period or "100000")
    quota_text, period_text = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota_text is None or period_text is None or int(quota_text) < 0:
        return None
    return int(quota_text) / int(period_text)


def _directory(mount: Mount, path: str) -> Path:
    """The process's cgroup directory under a mount: the path relative to what the mount shows; the mount point
    itself when the path lies outside it (a container's private view of its own cgroup)."""
    inner = Path(path)
    try:
        relative = inner.relative_to(mount.root)
    except ValueError:
        return mount.point
    directory = mount.point / relative
    return directory if directory.is_dir() else mount.point


def cpu_quota(proc_self: Path = Path("/proc/self"), root: Path = Path("/")) -> float | None:
    """The smallest CPU limit over this process's cgroup and its ancestors, in CPUs (1.5 for `limits.cpu: 1500m`),
    or None when no cgroup limits it (or the files cannot be read)."""
    cgroup, mountinfo = _read(proc_self / "cgroup"), _read(proc_self / "mountinfo")
    if cgroup is None or mountinfo is None:
        return None
    paths = _paths(cgroup)
    limits: list[float] = []
    for mount in _mounts(mountinfo, root):
        if mount.version not in paths:
            continue
        directory = _directory(mount, paths[mount.version])
        while True:
            limit = _limit(directory, mount.version)
            if limit is not None:
                limits.append(limit)
            if directory == mount.point or mount.point not in directory.parents:
                break
            directory = directory.parent
    return min(limits) if limits else None


def threads_for_quota(quota: float) -> int:
    """Whole CPUs a quota pays for, at least one: 1.5 CPUs → 1 thread (a second one would be throttled for half of
    every period, stalling the first at each parallel region's barrier)."""
    return max(1, math.floor(quota + 1e-9))


def dedicated_cpus(quota: float | None, affinity: int, online: int) -> bool:
    """Whether this process has whole CPUs to itself: a pod with Guaranteed QoS and an integer CPU limit under the
    kubelet's static CPU manager gets an exclusive cpuset exactly as large as its quota, narrower than the node. A
    shared pod's cpuset is the node's shared pool (wider than its quota); without a quota (a VM, a laptop, a pod
    without limits) other processes may run on any CPU, so that counts as shared too."""
    return quota is not None and affinity < online and abs(quota - affinity) < 1e-9
