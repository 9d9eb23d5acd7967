"""The worker as a Python library: the public entry points that benchmarks, tools and notebooks use, so they
follow the worker's own path (and its renames) instead of reaching into its modules.

- Models: `load_model` (a local directory or .gguf), the offline real models (`minilm_path`, `prepare_smollm2`).
- Requests: `ScoreAsk` scored with `score_now` through an `Executor` (prepared exactly as the server prepares them),
  or planned into `PackUnit`s with `plan_units`.
- The engine's parts for GPU and kernel benchmarks: `build_inputs`, `pooled_rows`, `GraphRunner`, `LayoutKind`,
  the compiled trunk (`CompiledTrunk`, `compile_mode`), flex's `block_tables` and the mask rule `token_allowed`,
  the CPU kernels (`tiled`, `fuse_linears`), the start-up checks (`selfcheck`, `decision_selfcheck`).
- The server: `load` (start-up, returning what serves), `create_app` (the FastAPI app).
"""

from __future__ import annotations

from scorekeeper_worker.api.server import create_app
from scorekeeper_worker.base.config import DType, WorkerConfig
from scorekeeper_worker.base.metrics import WorkerMetrics
from scorekeeper_worker.engine.queue.batching import token_batches
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.compiled_trunk import CompiledTrunk, compile_mode
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.executor import BatchStats, Executor
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.heads import CopyStats, copy_vectors
from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.files import (
    fix_gguf_tokenizer,
    gguf_tokenizer_metadata,
    minilm_path,
    prepare_smollm2,
    save_converted,
    smollm2_gguf_path,
)
from scorekeeper_worker.model.kernels import tiled
from scorekeeper_worker.model.kernels.attention import LayoutKind, token_allowed
from scorekeeper_worker.model.kernels.flex import block_tables
from scorekeeper_worker.model.loader import Pooling, ScoringModel, load_model
from scorekeeper_worker.model.templates.decision_template import resolve_decision_template
from scorekeeper_worker.model.trunk_patches import FusedLinear, fuse_linears
from scorekeeper_worker.planning.bounded_tokens import bounded_ids
from scorekeeper_worker.planning.encoding import LengthRules
from scorekeeper_worker.planning.planner import ScoreAsk, plan, tokenize
from scorekeeper_worker.serving.direct import score_now, scored
from scorekeeper_worker.serving.prepare import Limits
from scorekeeper_worker.serving.startup import decision_selfcheck, selfcheck
from scorekeeper_worker.serving.startup.cpu_memory import keep_freed_memory
from scorekeeper_worker.serving.startup.gc_pauses import freeze_after_load
from scorekeeper_worker.serving.startup.load import load
from scorekeeper_worker.serving.startup.quantization import spearman

__all__ = [
    "BatchStats", "CompiledTrunk", "CopyStats", "DType", "Executor", "FusedLinear", "GraphRunner", "LayoutKind",
    "LengthRules", "Limits", "PackUnit", "Pool", "Pooling", "ScoreAsk", "ScoringModel", "WorkerConfig", "WorkerMetrics",
    "block_tables", "bounded_ids", "build_inputs", "compile_mode", "copy_vectors", "create_app", "decision_selfcheck",
    "fix_gguf_tokenizer", "freeze_after_load", "fuse_linears", "gguf_tokenizer_metadata", "keep_freed_memory", "load",
    "load_model", "minilm_path", "plan_units", "pooled_rows", "prepare_smollm2", "resolve_decision_template",
    "save_converted", "score_now", "scored", "selfcheck", "smollm2_gguf_path", "spearman", "tiled", "token_allowed",
    "token_batches",
]


def plan_units(model: ScoringModel, ask: ScoreAsk, limits: Limits | None = None) -> list[PackUnit]:
    """A request's pack units as the server plans them (multi-item as the request or `limits` say)."""
    limits = limits or Limits()
    multi_item = model.is_decoder and (ask.multi_item_scoring if ask.multi_item_scoring is not None
                                       else limits.multi_item)
    return plan(model, ask, tokenize(model, ask), multi_item, limits.max_batch_tokens, limits.delimiter,
                limits.max_request_tokens).units
