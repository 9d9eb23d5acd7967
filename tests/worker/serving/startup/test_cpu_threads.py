"""`--threads auto|N`: the cgroup CPU quota (v1 and v2, fake hierarchies and a real one where the machine lets us make
one), the affinity mask, torch's intra-op and inter-op threads set before any parallel work, and the gauge."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from scorekeeper_worker.serving.startup.cgroup_cpu import cpu_quota, dedicated_cpus, threads_for_quota
from scorekeeper_worker.serving.startup.cpu_threads import resolve
from serving import free_port, wait_until_ready

V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_CPU_MOUNT = ("35 30 0:30 {root} /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup "
                "cgroup rw,cpu,cpuacct\n")
V1_MEMORY_MOUNT = "36 30 0:31 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory\n"


def _fake(tmp_path: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> Path:
    """A fake /proc/self and cgroup tree under tmp_path; returns the /proc/self directory."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    for name, text in files.items():
        path = tmp_path / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return proc


def test_v2_takes_the_smallest_limit_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    pod = "/sys/fs/cgroup/kubepods.slice/pod1"
    proc = _fake(tmp_path, "0::/kubepods.slice/pod1/container\n", V2_MOUNT, {
        "/sys/fs/cgroup/cpu.max": "max 100000\n",
        f"{pod}/cpu.max": "150000 100000\n",  # the pod's limit: 1.5 CPUs
        f"{pod}/container/cpu.max": "max 100000\n",
    })
    assert cpu_quota(proc, tmp_path) == 1.5
    (tmp_path / pod.lstrip("/") / "container" / "cpu.max").write_text("50000 100000\n")
    assert cpu_quota(proc, tmp_path) == 0.5


def test_v2_without_a_limit(tmp_path: Path) -> None:
    proc = _fake(tmp_path, "0::/\n", V2_MOUNT, {"/sys/fs/cgroup/cpu.max": "max 100000\n"})
    assert cpu_quota(proc, tmp_path) is None


@pytest.mark.parametrize("mount_root", ["/", "/docker/abc"], ids=["host-view", "container-view"])
def test_v1_quota_over_period(tmp_path: Path, mount_root: str) -> None:
    """A container without a cgroup namespace sees its own cgroup at the mount point, while /proc/self/cgroup
    still names the host's path: the mount's root maps one onto the other."""
    base = "/sys/fs/cgroup/cpu,cpuacct" + ("/docker/abc" if mount_root == "/" else "")
    proc = _fake(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
                 V1_CPU_MOUNT.format(root=mount_root) + V1_MEMORY_MOUNT,
                 {f"{base}/cpu.cfs_quota_us": "200000\n", f"{base}/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(proc, tmp_path) == 2.0


def test_v1_unlimited_and_hybrid(tmp_path: Path) -> None:
    base = "/sys/fs/cgroup/cpu,cpuacct"
    proc = _fake(tmp_path, "4:cpu,cpuacct:/\n0::/\n", V1_CPU_MOUNT.format(root="/") + V2_MOUNT.replace(
        "/sys/fs/cgroup ", "/sys/fs/cgroup/unified "),
        {f"{base}/cpu.cfs_quota_us": "-1\n", f"{base}/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(proc, tmp_path) is None
    (tmp_path / "sys/fs/cgroup/unified").mkdir()
    (tmp_path / "sys/fs/cgroup/unified/cpu.max").write_text("300000 100000\n")
    assert cpu_quota(proc, tmp_path) == 3.0


def test_no_cgroup_files(tmp_path: Path) -> None:
    assert cpu_quota(tmp_path / "missing", tmp_path) is None


@pytest.mark.parametrize(("quota", "threads"), [(0.2, 1), (1.0, 1), (1.5, 1), (2.0, 2), (7.99, 7), (64.0, 64)])
def test_threads_for_quota(quota: float, threads: int) -> None:
    assert threads_for_quota(quota) == threads


@pytest.mark.parametrize(("setting", "quota", "affinity", "threads"), [
    ("auto", None, 16, 16),  # no quota: the affinity mask
    ("auto", 1.0, 64, 1),  # limits.cpu: 1 on a 64-core node
    ("auto", 8.0, 4, 4),  # a cpuset smaller than the quota
    ("auto", 2.5, 16, 2),
    (3, 1.0, 16, 3),  # an explicit number wins
])
def test_resolve(setting: int | str, quota: float | None, affinity: int, threads: int) -> None:
    choice = resolve(setting, lambda: quota, lambda: affinity)  # type: ignore[arg-type]
    assert choice.threads == threads
    assert (choice.quota, choice.affinity) == (quota, affinity)


# Runs in a fresh interpreter: resolve and apply `--threads`, then report what a thread started afterwards (like the
# model thread) gets from torch.
_PROBE = """
import sys, threading, torch
from scorekeeper_worker.serving.startup import cpu_threads
choice = cpu_threads.resolve(sys.argv[1] if sys.argv[1] == "auto" else int(sys.argv[1]))
cpu_threads.apply(choice)
seen = {}
def look():
    seen.update(intra=torch.get_num_threads(), inter=torch.get_num_interop_threads())
thread = threading.Thread(target=look)
thread.start(); thread.join()
print(choice.threads, choice.quota, seen["intra"], seen["inter"])
"""


def _probe(setting: str, preexec: Callable[[], None] | None = None) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", _PROBE, setting], capture_output=True, text=True, timeout=120,
                          env=env, preexec_fn=preexec)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_explicit_threads_reach_a_thread_started_later() -> None:
    threads, _, intra, inter = _probe("3")
    assert (threads, intra, inter) == ("3", "3", "3")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to narrow the affinity mask")
def test_auto_follows_a_real_affinity_mask() -> None:
    first = min(os.sched_getaffinity(0))
    threads, _, intra, inter = _probe("auto", lambda: os.sched_setaffinity(0, {first}))
    assert (threads, intra, inter) == ("1", "1", "1")


def _real_cgroup() -> Iterator[tuple[Path, str]]:
    """A fresh cgroup limited to one CPU on this machine (v2, else v1), or a skip where it cannot be made."""
    name = f"scorekeeper-test-{uuid.uuid4().hex[:8]}"
    candidates = []
    control = Path("/sys/fs/cgroup/cgroup.subtree_control")
    if control.exists() and "cpu" in control.read_text().split():
        candidates.append((control.parent / name, "cpu.max", "100000 100000"))
    candidates.append((Path("/sys/fs/cgroup/cpu") / name, "cpu.cfs_quota_us", "100000"))
    for directory, file, value in candidates:
        try:
            directory.mkdir()
        except OSError:
            continue
        try:
            (directory / file).write_text(value)
        except OSError:
            directory.rmdir()
            continue
        try:
            yield directory, file
        finally:
            directory.rmdir()
        return
    pytest.skip("this machine does not let the test create a cgroup with a CPU quota (not root, or no cpu "
                "controller)")


@pytest.fixture
def one_cpu_cgroup() -> Iterator[tuple[Path, str]]:
    yield from _real_cgroup()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a one-CPU quota must be below the affinity mask")
def test_auto_follows_a_real_cgroup_quota(one_cpu_cgroup: tuple[Path, str]) -> None:
    directory, _ = one_cpu_cgroup
    threads, quota, intra, inter = _probe("auto", lambda: (directory / "cgroup.procs").write_text(str(os.getpid())))
    assert (threads, float(quota), intra, inter) == ("1", 1.0, "1", "1")


def test_the_worker_logs_and_exports_its_threads(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """The real CLI under a one-CPU affinity mask: `--threads auto` becomes 1, in the log and in the gauge."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to narrow the affinity mask")
    first = min(os.sched_getaffinity(0))
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    for variable in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "LD_PRELOAD"):
        env.pop(variable, None)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from scorekeeper_worker.cli import main; main(sys.argv[1:])", "serve",
             "--model", str(tiny_model("bert-cross")), "--port", str(port), "--termination-log",
             str(tmp_path / "termination"), "--openmp-runtime", "gnu"], stdout=out, stderr=subprocess.STDOUT, env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, {first}))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, process, timeout=300)
        metrics = httpx.get(url + "/metrics", timeout=10).text
        assert "\nscorekeeper_cpu_threads 1.0\n" in metrics
        assert "CPU threads: 1 (auto:" in log.read_text()
        assert "1 CPUs in the affinity mask" in log.read_text()
        assert "OpenMP runtime gnu: OMP_WAIT_POLICY=PASSIVE" in log.read_text()  # the CLI's libgomp default
    finally:
        process.terminate()
        process.wait(60)


@pytest.mark.parametrize(("quota", "affinity", "online", "dedicated"), [
    (2.0, 2, 64, True),  # Guaranteed pod, static CPU manager: an exclusive cpuset as large as its quota
    (2.0, 62, 64, False),  # the node's shared pool, wider than the quota
    (1.5, 2, 64, False),  # a fractional quota never gets exclusive CPUs
    (None, 2, 64, False),  # no quota (taskset on a VM): other processes may still run there
    (2.0, 2, 2, False),  # the whole machine, not an exclusive share of it
])
def test_dedicated_cpus_are_an_exclusive_cpuset_as_large_as_the_quota(quota: float | None, affinity: int,
                                                                      online: int, dedicated: bool) -> None:
    assert dedicated_cpus(quota, affinity, online) is dedicated
    assert resolve("auto", lambda: quota, lambda: affinity, online).dedicated is dedicated


def test_openmp_waits_passively_on_shared_cpus_and_spins_briefly_on_dedicated_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from scorekeeper_worker.serving.startup import cgroup_cpu, openmp_env

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(cgroup_cpu, "cpu_quota", lambda: 2.0)
    assert openmp_env.openmp_defaults({}) == openmp_env.OPENMP_DEDICATED
    monkeypatch.setattr(cgroup_cpu, "cpu_quota", lambda: None)
    assert openmp_env.openmp_defaults({}) == openmp_env.OPENMP_SHARED == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert openmp_env.openmp_defaults({"OMP_WAIT_POLICY": "ACTIVE"}) == {}  # the environment's own setting wins
    assert openmp_env.openmp_defaults({"GOMP_SPINCOUNT": "0"}) == {}
