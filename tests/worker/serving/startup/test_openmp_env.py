"""`--openmp-runtime auto|intel|gnu`, pure parts: which runtime, the environment the worker re-executes with (Intel's
runtime preloaded, the operator's own settings kept), the command line that starts it again, where libiomp5 and
TCMalloc are found, the wait defaults, which runtime a process runs, and the configuration error."""

from __future__ import annotations

from pathlib import Path

import pytest
from scorekeeper_worker import cli
from scorekeeper_worker.base.config import Device, OpenMPRuntime
from scorekeeper_worker.serving.startup import openmp_env
from scorekeeper_worker.serving.startup.openmp_env import (
    INTEL_WAIT,
    REEXEC_MARKER,
    RuntimeMissing,
    find_libiomp,
    find_tcmalloc,
    openmp_defaults,
    reexec_argv,
    reexec_env,
    resolve_runtime,
    runtime_of,
)

IOMP = Path("/venv/lib/libiomp5.so")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
AUTO, INTEL, GNU = OpenMPRuntime.AUTO, OpenMPRuntime.INTEL, OpenMPRuntime.GNU


@pytest.mark.parametrize(("setting", "device", "library", "runtime"), [
    (AUTO, Device.CPU, IOMP, INTEL),  # the default where intel-openmp is installed (the image, `pip install .[worker]`)
    (AUTO, Device.CPU, None, GNU),
    (AUTO, Device.CUDA, IOMP, GNU),  # on a GPU the CPU threads wait for kernels, not for each other
    (INTEL, Device.CUDA, IOMP, INTEL),  # asked for: given
    (GNU, Device.CPU, IOMP, GNU),  # the way out
])
def test_resolve(setting: OpenMPRuntime, device: Device, library: Path | None, runtime: OpenMPRuntime) -> None:
    assert resolve_runtime(setting, device, library) == runtime


def test_intel_without_libiomp5_is_an_error_naming_the_flag_and_the_install() -> None:
    with pytest.raises(RuntimeMissing, match=r"--openmp-runtime intel: libiomp5\.so .*pip install intel-openmp"):
        resolve_runtime(INTEL, Device.CPU, None)


def test_the_cli_refuses_intel_without_libiomp5(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(openmp_env, "_libiomp_dirs", lambda: iter([]))
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--model", "/m", "--openmp-runtime", "intel"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("scorekeeper-worker: error: --openmp-runtime intel:")
    assert "pip install intel-openmp" in error


def test_the_setting_comes_from_the_flag_or_its_variable() -> None:
    assert cli.parse_config(["serve", "--model", "/m"], {}).openmp_runtime == AUTO
    assert cli.parse_config(["serve", "--model", "/m", "--openmp-runtime", "gnu"], {}).openmp_runtime == GNU
    assert cli.parse_config(["serve", "--model", "/m"], {"SCOREKEEPER_OPENMP_RUNTIME": "intel"}).openmp_runtime == INTEL


def test_intel_preloads_libiomp5_after_tcmalloc_and_before_the_operator_s_own_preloads() -> None:
    env = reexec_env(INTEL, {"PATH": "/bin", "LD_PRELOAD": "/opt/libx.so /opt/liby.so"}, IOMP, TCMALLOC)
    assert env == {"PATH": "/bin", "LD_PRELOAD": f"{TCMALLOC}:{IOMP}:/opt/libx.so:/opt/liby.so",
                   REEXEC_MARKER: "intel", **INTEL_WAIT}
    assert INTEL_WAIT == {"KMP_BLOCKTIME": "1", "KMP_TPAUSE": "0"}  # the measured configuration


def test_without_tcmalloc_only_libiomp5() -> None:
    env = reexec_env(INTEL, {}, IOMP, None)
    assert env is not None and env["LD_PRELOAD"] == str(IOMP)


def test_a_tcmalloc_already_preloaded_is_not_preloaded_twice() -> None:
    env = reexec_env(INTEL, {"LD_PRELOAD": "/elsewhere/libtcmalloc_minimal.so.4"}, IOMP, TCMALLOC)
    assert env is not None and env["LD_PRELOAD"] == f"{IOMP}:/elsewhere/libtcmalloc_minimal.so.4"


@pytest.mark.parametrize("own", [{"KMP_BLOCKTIME": "20"}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}])
def test_the_operator_s_own_wait_setting_is_kept(own: dict[str, str]) -> None:
    env = reexec_env(INTEL, own, IOMP, None)
    assert env is not None
    assert {k: v for k, v in env.items() if k not in ("LD_PRELOAD", REEXEC_MARKER)} == own


def test_a_user_s_kmp_tpause_is_kept() -> None:
    env = reexec_env(INTEL, {"KMP_TPAUSE": "1"}, IOMP, None)
    assert env is not None and (env["KMP_BLOCKTIME"], env["KMP_TPAUSE"]) == ("1", "1")


@pytest.mark.parametrize(("runtime", "environ"), [
    (GNU, {}),  # today's behaviour: no re-execution
    (INTEL, {REEXEC_MARKER: "intel"}),  # the re-executed process: never again
    (INTEL, {"LD_PRELOAD": "/venv-vllm/lib/libiomp5.so", "KMP_BLOCKTIME": "5"}),  # preloaded by hand (benchmarks)
])
def test_nothing_to_re_execute(runtime: OpenMPRuntime, environ: dict[str, str]) -> None:
    assert reexec_env(runtime, environ, IOMP, TCMALLOC) is None


@pytest.mark.parametrize(("given", "argv", "orig"), [
    (None, ["/venv/bin/scorekeeper-worker", "serve", "--model", "m"],  # the console script
     ["/venv/bin/python", "/venv/bin/scorekeeper-worker", "serve", "--model", "m"]),
    (None, ["/src/scorekeeper_worker/cli.py", "serve"], ["python3", "-u", "-m", "scorekeeper_worker.cli", "serve"]),
    (["serve", "--model", "m"], ["-c", "serve", "--model", "m"],  # the benchmarks' and tests' `-c` form
     ["python", "-c", "from scorekeeper_worker.cli import main; main()", "serve", "--model", "m"]),
])
def test_the_same_invocation_again(given: list[str] | None, argv: list[str], orig: list[str]) -> None:
    assert reexec_argv(given, argv, orig, "/venv/bin/python3") == ["/venv/bin/python3", *orig[1:]]


def test_a_caller_in_the_same_process_is_never_restarted() -> None:
    assert reexec_argv(["serve", "--model", "m"], ["/venv/bin/pytest", "-q"], ["python", "-m", "pytest", "-q"],
                       "/venv/bin/python") is None
    assert reexec_argv(None, ["x"], ["python", "x"], "") is None  # embedded: no interpreter to exec


def test_libiomp5_is_found_in_the_given_directories(tmp_path: Path) -> None:
    assert find_libiomp([tmp_path]) is None
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    assert find_libiomp([tmp_path, tmp_path / "lib"]) == (tmp_path / "lib" / "libiomp5.so").resolve()


def test_tcmalloc_by_path_else_by_name_else_none(tmp_path: Path) -> None:
    assert find_tcmalloc([tmp_path], lambda _name: None) is None
    assert find_tcmalloc([tmp_path], lambda name: f"lib{name}.so.4") == "libtcmalloc_minimal.so.4"
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_tcmalloc([tmp_path], lambda _name: None) == str((tmp_path / "libtcmalloc_minimal.so.4").resolve())


def test_wait_defaults_follow_a_hand_preloaded_libiomp5() -> None:
    assert openmp_defaults({"LD_PRELOAD": str(IOMP)}) == INTEL_WAIT
    assert openmp_defaults({"LD_PRELOAD": str(IOMP), "KMP_BLOCKTIME": "1"}) == {}


MAPS = ("7f00-7f01 r-xp 00000000 08:01 12 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1\n"
        "7f02-7f03 rw-p 00000000 00:00 0 [heap]\n")


def test_the_runtime_a_process_runs() -> None:
    assert runtime_of("/venv/lib/libiomp5.so", MAPS) == "intel"  # the library torch's calls bind to decides
    assert runtime_of("/torch/lib/libgomp-a34b3233.so.1", MAPS) == "gnu"
    assert runtime_of(None, MAPS) == "gnu"
    assert runtime_of(None, MAPS + "7f04-7f05 r-xp 00000000 08:01 13 /venv/lib/libiomp5.so\n") == "intel"
    assert runtime_of(None, "") == "unknown"


def test_this_process_reads_its_own_runtime() -> None:
    import torch  # noqa: F401  (binds OpenMP)

    expected = "intel" if "libiomp5" in Path("/proc/self/maps").read_text() else "gnu"
    assert openmp_env.loaded_runtime() == expected
