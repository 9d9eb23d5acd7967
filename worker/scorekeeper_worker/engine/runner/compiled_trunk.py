"""Regional compilation of the trunk: every decoder (or encoder) layer runs one `torch.compile`d code object.

Why regional: all layers of a trunk are instances of one class, so compiling the class's `forward` once serves all
28 layers of a Qwen3-0.6B (parameters are graph inputs, not constants) and compile time is that of one layer, not
of the whole model. On an H200 this fused the norms, the rotary embedding and the q/k norm that eager transformers
layers run as dozens of kernels: one 8,192-token graph bucket went from 49.6 to 21.0 ms (docs/gpu.md).

Two compiled entry points of the same code: `static` (graph buckets: shapes are a bucket's, one specialised graph
per bucket size, which the bucket's CUDA graph then captures) and `dynamic` (eager batches of any length). Which one
a pass uses is a context value set by the caller (`CompiledTrunk.run`), so the model code stays unchanged and a
caller can always run the plain layer instead.

Failures never stop the worker: a compile (or a compiled pass) that raises is logged, counted, and the key it ran
for (a bucket, or the eager path) is switched to the uncompiled layers; the pass is re-run uncompiled. Compile time
is bounded by a budget: once spent, keys not yet compiled stay uncompiled (logged once). Compiled artifacts go to
`cache_dir` (Inductor's and Triton's caches, and torch.compiler's cache artifacts, saved after start-up and loaded
before the first compile) so a second start of the same model on the same GPU type skips most of the work; under
a directory per torch version and CPU vector instruction set (`keyed_cache_dir`).
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

T = TypeVar("T")
STATIC, DYNAMIC = "static", "dynamic"
EAGER_KEY = "eager"
ARTIFACTS_FILE = "torch-compile-artifacts.bin"
# Compiled variants of one layer class: buckets × dtypes × the eager path. torch's default of 8 would silently run
# the plain layer for the buckets compiled last.
RECOMPILE_LIMIT = 64
_mode: contextvars.ContextVar[str | None] = contextvars.ContextVar("scorekeeper_compile_mode", default=None)


def compile_enabled(mode: str, device: torch.device) -> bool:
    """`--compile`: on, off, or auto, which stays off until a GPU run has measured the compiled trunk against
    the plain one and proven it exact (docs/gpu.md; then auto becomes on for CUDA). On CPU compiling is off unless
    asked for: it is not measured faster there."""
    if mode == "auto":
        return False
    return mode == "on"


@contextmanager
def compile_mode(mode: str | None) -> Iterator[None]:
    """Run the trunk's layers compiled (`STATIC`, `DYNAMIC`) or plain (None) inside the block."""
    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


def trunk_layers(trunk: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated layers of a trunk: the longest `ModuleList` whose members are all of one class."""
    best: list[torch.nn.Module] = []
    for module in trunk.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best) \
                and len({type(layer) for layer in module}) == 1:
            best = list(module)
    return best


def keyed_cache_dir(base: Path) -> Path:
    """This process's directory under a compile cache: one per torch version and CPU vector instruction set.
    Inductor's graph cache does not key on the vector width its C++ kernels were generated for, so a cache written
    on an AVX-512 machine and read under AVX2 (a volume shared by nodes of two CPU generations, or a process capped
    with ATEN_CPU_CAPABILITY) runs 16-lane kernels built with 8 lanes: out-of-bounds reads, seen as an abort."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    return base / f"torch-{torch.__version__}-{str(isa).replace(' ', '-') if isa else 'scalar'}"


def use_cache_dir(path: Path) -> None:
    """Point Inductor's and Triton's caches at `path` (a volume the operator can mount) and load the cache
    artifacts a previous start saved there. Called before the first compile of the process."""
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    artifacts = path / ARTIFACTS_FILE
    if artifacts.is_file():
        try:
            torch.compiler.load_cache_artifacts(artifacts.read_bytes())
            log.info("torch.compile: loaded cache artifacts from %s", artifacts)
        except Exception as error:  # a cache from another torch version: compile from scratch
            log.warning("torch.compile: cache artifacts %s not loaded: %s: %s", artifacts, type(error).__name__,
                        error)


def save_cache_artifacts(path: Path) -> None:
    """Save what this process compiled, for the next start (best effort: a full or read-only volume only logs)."""
    try:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            (path / ARTIFACTS_FILE).write_bytes(saved[0])
            log.info("torch.compile: cache artifacts saved to %s", path / ARTIFACTS_FILE)
    except Exception as error:
        log.warning("torch.compile: cache artifacts not saved to %s: %s: %s", path, type(error).__name__, error)


@dataclass
class CompiledTrunk:
    """The trunk's layers wrapped so that each pass runs them compiled or plain; bookkeeping per key."""

    trunk: torch.nn.Module
    budget_seconds: float = 600.0
    cache_dir: Path | None = None
    on_failure: Callable[[], None] | None = None
    on_compiled: Callable[[str, float], None] | None = None  # (key, seconds) after a key's first compiled pass
    seconds: float = 0.0
    compiled: dict[str, float] = field(default_factory=dict)  # key → seconds of its first (compiling) pass
    disabled: dict[str, str] = field(default_factory=dict)  # key → why it runs uncompiled
    _budget_logged: bool = False

    def __post_init__(self) -> None:
        layers = trunk_layers(self.trunk)
        if not layers:
            raise ValueError("no repeated layers to compile in this trunk")
        if self.cache_dir is not None:
            self.cache_dir = keyed_cache_dir(self.cache_dir)
            use_cache_dir(self.cache_dir)
        else:  # whichever directory Inductor uses (its default, the pod's emptyDir), keyed all the same
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            base = Path(cache_dir())
            keyed = keyed_cache_dir(base)
            if base.name != keyed.name:  # not already this process's subdirectory
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(keyed)
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit,
                                                        4 * RECOMPILE_LIMIT)
        forward = type(layers[0]).forward  # one code object for every layer: compiled once per shape
        compiled = {STATIC: torch.compile(forward, dynamic=False), DYNAMIC: torch.compile(forward, dynamic=True)}
        for layer in layers:
            plain = layer.forward

            def dispatch(*args: Any, _layer: torch.nn.Module = layer, _plain: Callable[..., Any] = plain,
                         **kwargs: Any) -> Any:
                mode = _mode.get()
                return _plain(*args, **kwargs) if mode is None else compiled[mode](_layer, *args, **kwargs)

            layer.forward = dispatch  # type: ignore[method-assign]
        self.layers = len(layers)

    def mode_for(self, key: str, static: bool) -> str | None:
        """The mode a pass of `key` runs in: None once the key failed or the budget ran out before it compiled."""
        if key in self.disabled:
            return None
        if key not in self.compiled and self.seconds >= self.budget_seconds:
            self.disabled[key] = "budget"
            if not self._budget_logged:
                log.warning("torch.compile: the compile budget of %.0f s is spent (%.1f s); %s and any later bucket "
                            "run uncompiled layers", self.budget_seconds, self.seconds, key)
                self._budget_logged = True
            return None
        return STATIC if static else DYNAMIC

    def disable(self, key: str, error: BaseException) -> None:
        self.disabled[key] = f"{type(error).__name__}: {error}"
        log.error("torch.compile of the trunk failed for %s, which runs uncompiled layers: %s: %s", key,
                  type(error).__name__, error)
        if self.on_failure is not None:
            self.on_failure()

    def run(self, key: str, static: bool, fn: Callable[[], T]) -> T:
        """`fn` (a forward pass) with the layers compiled for `key`; its first pass compiles and is timed. On any
        error: `key` is switched to uncompiled layers (log line, counter) and `fn` re-runs uncompiled."""
        mode = self.mode_for(key, static)
        if mode is None:
            with compile_mode(None):
                return fn()
        first = key not in self.compiled
        started = time.perf_counter()
        try:
            with compile_mode(mode):
                result = fn()
            if first and torch.cuda.is_available():
                torch.cuda.synchronize()
        except Exception as error:  # never fatal: the plain layers are always there
            self.disable(key, error)
            with compile_mode(None):
                return fn()
        if first:
            spent = time.perf_counter() - started
            self.compiled[key] = spent
            self.seconds += spent
            log.info("torch.compile: trunk layers compiled for %s in %.1f s (%d layers, one code object; %.1f s "
                     "of the %.0f s budget spent)", key, spent, self.layers, self.seconds, self.budget_seconds)
            if self.on_compiled is not None:
                self.on_compiled(key, spent)
        return result

    def finish_start_up(self) -> None:
        """After capture: save the cache artifacts for the next start."""
        if self.cache_dir is not None and self.compiled:
            save_cache_artifacts(self.cache_dir)
