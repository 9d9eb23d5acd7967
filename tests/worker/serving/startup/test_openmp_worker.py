"""`--openmp-runtime` end to end: the real command line re-executes itself with Intel's libiomp5 preloaded (same
process id, so the caller's handle stays valid), torch runs on it, the log line and `scorekeeper_openmp_runtime` say
so, and its scores equal those of a libgomp worker within float32 rounding.

libiomp5 comes from `pip install intel-openmp` (scripts/install.sh installs the worker extra, which has it on x86-64)
or, on a machine without it, from SCOREKEEPER_TEST_LIBIOMP5 (a libiomp5.so, e.g. the benchmarks' .venv-vllm/lib's):
the worker is pointed at its directory."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from scorekeeper_worker.serving.startup.openmp_env import REEXEC_MARKER, find_libiomp, find_tcmalloc
from serving import free_port, wait_until_ready

QUERY = "how do tides work"
ITEMS = ["The moon's gravity pulls the oceans.", "Bread rises because of yeast.", "Tides follow the moon and sun.",
         "A short one.", "Spring tides come at new and full moon, when the sun and moon pull together."]
# The worker as the benchmarks start it (`-c`), with its libiomp5 lookup pointed at the test's directory; the
# re-executed process runs this same line again.
LAUNCH = ("import os; from pathlib import Path; from scorekeeper_worker.serving.startup import openmp_env; "
          "openmp_env._libiomp_dirs = lambda: iter([Path(os.environ['TEST_LIBIOMP5_DIR'])]); "
          "from scorekeeper_worker.cli import main; main()")
# The test's own OpenMP environment (a run of the suite with libiomp5 preloaded) must not reach the workers.
OWN = ("LD_PRELOAD", "KMP_BLOCKTIME", "KMP_TPAUSE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", REEXEC_MARKER,
       "SCOREKEEPER_OPENMP_RUNTIME")


def _libiomp5() -> Path:
    given = os.environ.get("SCOREKEEPER_TEST_LIBIOMP5")
    found = Path(given) if given else find_libiomp()
    if found is None or not found.is_file():
        pytest.skip("libiomp5.so is not installed (pip install intel-openmp) and SCOREKEEPER_TEST_LIBIOMP5 is unset")
    return found


@contextmanager
def _worker(model: Path, libiomp5: Path, log: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in OWN}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path), "TEST_LIBIOMP5_DIR": str(
        libiomp5.parent)})
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-c", LAUNCH, "serve", "--model", str(model), "--port", str(port),
                                    "--threads", "2", "--termination-log", str(log.with_suffix(".termination")),
                                    *extra], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, process, timeout=300)
        yield process, url
    finally:
        process.terminate()
        process.wait(60)


def _scores(url: str) -> list[float]:
    response = httpx.post(url + "/v1/score", json={"query": QUERY, "items": ITEMS}, timeout=120)
    assert response.status_code == 200, response.text
    rows = response.json()["scores"]  # a list of label scores per item for a multi-label head
    return [float(score) for row in rows for score in (row if isinstance(row, list) else [row])]


def _runtime_series(url: str) -> list[str]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return [line for line in text.splitlines() if line.startswith("scorekeeper_openmp_runtime{")]


def test_the_worker_runs_on_intel_openmp_and_scores_as_on_libgomp(tiny_model: Callable[[str], Path],
                                                                    tmp_path: Path) -> None:
    libiomp5, model = _libiomp5(), tiny_model("bert-cross")
    intel_log, gnu_log = tmp_path / "intel.log", tmp_path / "gnu.log"
    with _worker(model, libiomp5, intel_log) as (process, url):  # --openmp-runtime auto
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert "libiomp5.so" in maps  # preloaded into the same process (exec keeps the pid)
        tcmalloc = find_tcmalloc()
        assert tcmalloc is None or Path(tcmalloc).name in maps  # optional, preloaded with it where installed
        assert f"{REEXEC_MARKER}=intel".encode() in environ and b"KMP_BLOCKTIME=1" in environ
        assert _runtime_series(url) == ['scorekeeper_openmp_runtime{runtime="intel"} 1.0']
        intel = _scores(url)
    assert "OpenMP runtime intel: OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=(unset) KMP_BLOCKTIME=1" in \
        intel_log.read_text()
    with _worker(model, libiomp5, gnu_log, "--openmp-runtime", "gnu") as (process, url):
        assert "libiomp5" not in Path(f"/proc/{process.pid}/maps").read_text()
        assert _runtime_series(url) == ['scorekeeper_openmp_runtime{runtime="gnu"} 1.0']
        gnu = _scores(url)
    assert "OpenMP runtime gnu: " in gnu_log.read_text()
    assert len(intel) >= len(ITEMS) and all(math.isfinite(score) for score in intel)
    assert intel == pytest.approx(gnu, abs=1e-5, rel=0)


def test_intel_without_libiomp5_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in OWN}
    env.update({"PYTHONPATH": os.pathsep.join(sys.path), "TEST_LIBIOMP5_DIR": str(tmp_path)})  # an empty directory
    done = subprocess.run([sys.executable, "-c", LAUNCH, "serve", "--model", str(tmp_path), "--openmp-runtime",
                           "intel"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--openmp-runtime intel: libiomp5.so is not installed" in done.stderr
    assert "pip install intel-openmp" in done.stderr
