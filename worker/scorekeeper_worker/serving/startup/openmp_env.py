"""Which OpenMP runtime torch's threads run on, and how they wait at a barrier: settled by the command line before
torch loads (`--openmp-runtime auto|intel|gnu`), and read back once it has.

libgomp, which torch links, offers two ways to wait, and each loses one case: a spin (`GOMP_SPINCOUNT`) collapses
beside an equal-share neighbour, sleeping at once (`OMP_WAIT_POLICY=PASSIVE`) gives up speed under light load. Intel's
runtime (libiomp5, pip's `intel-openmp`, which puts it in the environment's lib/) spins for a bounded time
(`KMP_BLOCKTIME=1`: 1 ms) and then sleeps: with TCMalloc beside it, 1.26–1.55× faster than libgomp passive on
quiet CPUs, and within the noise of it beside an equal-share stress (docs/benchmarks.md). Torch binds OpenMP symbols
to whichever library comes first, so Intel's runtime has to be preloaded, and the dynamic loader reads LD_PRELOAD
only when a program starts: the command line re-executes itself once with it, as vLLM's launcher does. No torch
here."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path

from scorekeeper_worker.base.config import Device, OpenMPRuntime

LIBIOMP = "libiomp5.so"
TCMALLOC = "libtcmalloc_minimal.so.4"  # Debian's and Ubuntu's libtcmalloc-minimal4
TCMALLOC_DIRS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"))
# Set in the re-executed process so that it never re-executes again. Not SCOREKEEPER_OPENMP_RUNTIME: that variable
# is the setting itself (cli reads SCOREKEEPER_<FLAG>).
REEXEC_MARKER = "SCOREKEEPER_OPENMP_PRELOADED"
# Intel's wait: spin 1 ms, then sleep (as fast as 5 ms on quiet CPUs, and no slower beside an equal share: measured);
# KMP_TPAUSE=0 as vLLM sets it.
INTEL_WAIT = {"KMP_BLOCKTIME": "1", "KMP_TPAUSE": "0"}
# libgomp's wait, unless the environment says otherwise (read when torch loads libgomp). On CPUs shared with other
# processes (the common case for CPU pods) a spinning thread burns the time slice its descheduled sibling needs, so
# threads sleep at once (PASSIVE). On CPUs the worker has to itself a short spin (about a millisecond) catches the next
# operator's start without a futex wake-up, and then sleeps: never ACTIVE, which spins forever and would take the
# cores from the worker's own tokenizer and HTTP threads (docs/operations.md, docs/benchmarks.md).
OPENMP_SHARED = {"OMP_WAIT_POLICY": "PASSIVE"}
OPENMP_DEDICATED = {"GOMP_SPINCOUNT": "300000"}  # libgomp's own default spin, made explicit (not throttled)
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


class RuntimeMissing(ValueError):
    """`--openmp-runtime intel` where libiomp5 is not installed."""


def openmp_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The wait settings for this process: none when the environment sets any of its own; Intel's where libiomp5 is
    preloaded already (by hand; it reads them at its first parallel region); else libgomp's for its CPUs."""
    if any(variable in environ for variable in OPENMP_WAIT_VARIABLES):
        return {}
    if LIBIOMP in _preloaded_names(environ):
        return {k: v for k, v in INTEL_WAIT.items() if k not in environ}
    from scorekeeper_worker.serving.startup.cgroup_cpu import cpu_quota, dedicated_cpus

    affinity = len(os.sched_getaffinity(0))
    dedicated = dedicated_cpus(cpu_quota(), affinity, os.cpu_count() or affinity)
    return dict(OPENMP_DEDICATED if dedicated else OPENMP_SHARED)


def _libiomp_dirs() -> Iterator[Path]:
    """Where pip's intel-openmp puts libiomp5: the environment's lib/ (a venv, the image's /opt/venv), else wherever
    the distribution's own file list says (a --user install). Lazy: the metadata scan only when lib/ lacks it."""
    yield Path(sys.prefix) / "lib"
    try:
        files = metadata.distribution("intel-openmp").files or []
    except metadata.PackageNotFoundError:
        return
    yield from (Path(str(file.locate())).parent for file in files if file.name == LIBIOMP)


def find_in(name: str, dirs: Iterable[Path]) -> Path | None:
    return next((Path(os.path.realpath(d / name)) for d in dirs if (d / name).is_file()), None)


def find_libiomp(dirs: Iterable[Path] | None = None) -> Path | None:
    return find_in(LIBIOMP, _libiomp_dirs() if dirs is None else dirs)


def find_tcmalloc(dirs: Iterable[Path] = TCMALLOC_DIRS,
                  by_name: Callable[[str], str | None] = ctypes.util.find_library) -> str | None:
    """TCMalloc's path, else a name the loader finds (ldconfig's cache), else None: it is optional."""
    found = find_in(TCMALLOC, dirs)
    return str(found) if found is not None else by_name("tcmalloc_minimal")


def resolve_runtime(setting: OpenMPRuntime, device: Device, libiomp: Path | None) -> OpenMPRuntime:
    """auto: Intel's runtime on CPU where it is installed, else libgomp; intel without the library is an error."""
    if setting == OpenMPRuntime.INTEL and libiomp is None:
        raise RuntimeMissing(f"--openmp-runtime intel: {LIBIOMP} is not installed (looked in {sys.prefix}/lib and "
                             "the intel-openmp package's files); pip install intel-openmp, or --openmp-runtime gnu")
    if setting == OpenMPRuntime.AUTO:
        return OpenMPRuntime.INTEL if device == Device.CPU and libiomp is not None else OpenMPRuntime.GNU
    return setting


def _preloads(environ: Mapping[str, str]) -> list[str]:
    return [entry for entry in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if entry]


def _preloaded_names(environ: Mapping[str, str]) -> set[str]:
    return {Path(entry).name for entry in _preloads(environ)}


def reexec_env(runtime: OpenMPRuntime, environ: Mapping[str, str], libiomp: Path | None,
               tcmalloc: str | None) -> dict[str, str] | None:
    """The environment to re-execute with so that Intel's runtime (and TCMalloc, where found) is preloaded, or None:
    libgomp, already re-executed, or libiomp5 preloaded by hand (LD_PRELOAD, as the benchmarks do)."""
    if runtime != OpenMPRuntime.INTEL or libiomp is None or REEXEC_MARKER in environ:
        return None
    preloads, names = _preloads(environ), _preloaded_names(environ)
    if LIBIOMP in names:
        return None
    ours = [library for library in (tcmalloc, str(libiomp)) if library is not None and Path(library).name not in names]
    env = {**environ, "LD_PRELOAD": ":".join([*ours, *preloads]), REEXEC_MARKER: runtime.value}
    if not any(variable in environ for variable in OPENMP_WAIT_VARIABLES):  # an operator's own wait setting stays
        env.update({k: v for k, v in INTEL_WAIT.items() if k not in environ})
    return env


def reexec_argv(given: Sequence[str] | None, argv: Sequence[str], orig_argv: Sequence[str],
                executable: str) -> list[str] | None:
    """The command line that starts this process again (`python -c …`, `-m …`, a console script: the interpreter's
    own argv, options included), or None when `main` was handed arguments of its own: a caller in the same process
    (a test) that re-executing would restart."""
    if not executable or not orig_argv or (given is not None and list(given) != list(argv[1:])):
        return None
    return [executable, *orig_argv[1:]]


def reexec(runtime: OpenMPRuntime, libiomp: Path | None, given: Sequence[str] | None, tcmalloc: bool = True) -> None:
    """Replace this process by itself under Intel's runtime when that is the choice and it is not preloaded yet;
    returns only when nothing is to be done (or exec failed: torch then gets libgomp, which the log line says).
    `tcmalloc=False` leaves TCMalloc out: OpenVINO (`--quantization int8`) aborts under it (free(): invalid pointer)."""
    if runtime != OpenMPRuntime.INTEL or REEXEC_MARKER in os.environ:
        return  # before looking for TCMalloc, which may ask ldconfig
    env = reexec_env(runtime, os.environ, libiomp, find_tcmalloc() if tcmalloc else None)
    command = reexec_argv(given, sys.argv, getattr(sys, "orig_argv", []), sys.executable)
    if env is None or command is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(command[0], command, env)
    except OSError as error:
        print(f"scorekeeper-worker: could not re-execute with Intel OpenMP preloaded ({error}); using libgomp",
              file=sys.stderr)


def runtime_of(library: str | None, maps: str) -> str:
    """intel, gnu or unknown: from the library torch's OpenMP calls bind to where known, else from the mapped ones
    (a preloaded libiomp5 comes first, so where both are mapped it is the one in use)."""
    names = [library] if library else [line.split()[-1] for line in maps.splitlines() if "/" in line]
    basenames = [Path(name).name for name in names]
    if any(name.startswith("libiomp5") for name in basenames):
        return "intel"
    return "gnu" if any(name.startswith("libgomp") for name in basenames) else "unknown"


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]


def _bound_library() -> str | None:
    """The file that defines `omp_get_max_threads` in the process's global scope: where torch's calls go."""
    try:
        process = ctypes.CDLL(None)
        info = _DlInfo()
        if process.dladdr(ctypes.cast(process.omp_get_max_threads, ctypes.c_void_p), ctypes.byref(info)):
            return info.fname.decode() if info.fname else None
    except (AttributeError, OSError):
        pass
    return None


def loaded_runtime(maps_file: Path = Path("/proc/self/maps")) -> str:
    """After torch loads: the OpenMP runtime this process really runs (intel, gnu, or unknown)."""
    try:
        maps = maps_file.read_text()
    except OSError:
        maps = ""
    return runtime_of(_bound_library(), maps)
