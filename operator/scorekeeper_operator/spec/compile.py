"""spec.compile: torch.compile of the worker's trunk layers (the worker's --compile flags, docs/gpu.md)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from scorekeeper_operator.spec.base import Spec

# The worker's `--compile auto` (compiled_trunk.compile_enabled): off everywhere until a GPU run proves the
# compiled trunk; then on for CUDA, and this turns True with it.
AUTO_COMPILES_ON_GPU = False


class CompileModeName(StrEnum):
    AUTO = "auto"  # the worker's choice: off until a GPU run has proven the compiled trunk
    ON = "on"
    OFF = "off"


class Compile(Spec):
    mode: CompileModeName = CompileModeName.AUTO
    # Start-up compile time the worker may spend; the startup probe and the rollout deadline allow it on top of
    # rollout.maxStartupSeconds whenever the worker compiles.
    budget_seconds: int = Field(600, ge=1, le=3600)
    # Inductor/Triton caches and torch.compile artifacts: a path the pod mounts (spec.pod volumes) so a restart of
    # the same model on the same GPU type skips most of the compile. None: the pod's own cache emptyDir.
    cache_dir: str | None = Field(None, pattern=r"^/", max_length=4096)

    def compiles(self, uses_gpu: bool) -> bool:
        """Whether the worker compiles with this mode (auto: as the worker's auto decides)."""
        return self.mode is CompileModeName.ON or (self.mode is CompileModeName.AUTO and uses_gpu
                                                   and AUTO_COMPILES_ON_GPU)

    def allowance_seconds(self, uses_gpu: bool) -> int:
        """Start-up time the compile may add."""
        return self.budget_seconds if self.compiles(uses_gpu) else 0
