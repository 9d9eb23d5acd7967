"""Start-up: host tuning → load → prompt template and label tokens → executor (CUDA graphs captured) → self-check
(also the warm-up) → int8 certificate → the model thread. What it returns is proven on this model; any failure is
raised with a message saying why (the caller exits non-zero with it)."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from scorekeeper_worker.base.config import Device, DType, Quantization, WorkerConfig
from scorekeeper_worker.base.metrics import WorkerMetrics
from scorekeeper_worker.engine.queue.scheduler import Scheduler
from scorekeeper_worker.engine.runner.compiled_trunk import CompiledTrunk, compile_enabled
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.device_stream import SimulatedStream
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.kernels.flex import resolve_backend
from scorekeeper_worker.model.loader import ModelKind, ScoringModel, load_model
from scorekeeper_worker.model.templates.decision_template import DecisionTemplate, resolve_decision_template
from scorekeeper_worker.model.templates.prompt_template import load_template, resolve_label_tokens
from scorekeeper_worker.model.trunk_patches import fuse_linears
from scorekeeper_worker.serving.service import Served
from scorekeeper_worker.serving.startup import (
    cpu_memory,
    cpu_threads,
    decision_selfcheck,
    openmp_env,
    quantization,
    selfcheck,
)
from scorekeeper_worker.serving.startup.gc_pauses import freeze_after_load

log = logging.getLogger(__name__)


def load(config: WorkerConfig, metrics: WorkerMetrics) -> Served:
    """The model proven against transformers (self-check), with its model thread started."""
    started = time.perf_counter()
    threads = cpu_threads.resolve(config.threads)
    runtime = openmp_env.loaded_runtime()  # torch has bound its OpenMP calls on import
    cpu_threads.apply(threads, runtime)  # before any parallel work: loading is the first
    metrics.cpu_threads.set(threads.threads)
    metrics.cpu_dedicated.set(threads.dedicated)
    metrics.openmp_runtime.labels(runtime).set(1)
    if config.device == Device.CPU:
        cpu_memory.keep_freed_memory()
    # int8 is quantized from, and certified against, the float32 weights.
    dtype = DType.FLOAT32 if config.quantization == Quantization.INT8 else config.dtype
    model = load_model(config.model, dtype, config.device.value, config.name)
    if config.onednn_linear and model.device.type == "cpu" and model.dtype == torch.float32 and \
            config.quantization == Quantization.NONE:  # int8 converts the plain float32 modules
        log.info("oneDNN linear layers: %d", fuse_linears(model.trunk))
    decision_template = _prompt(config, model)
    delimiter = config.multi_item_scoring_delimiter
    if delimiter is not None and delimiter >= model.model.get_input_embeddings().num_embeddings:
        raise ValueError(f"--multi-item-scoring-delimiter {delimiter} is outside the vocabulary "
                         f"(size {model.model.get_input_embeddings().num_embeddings})")
    if config.cuda_graph and not model.packed:
        raise ValueError(f"--cuda-graph: {model.support.model_type} runs its own attention on padded batches "
                         "(docs/support-matrix.md), which the CUDA-graph buckets do not capture")
    metrics.model_load_seconds.set(time.perf_counter() - started)
    metrics.info.info({"model": model.name, "kind": model.kind.value,
                       "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device)})
    executor = _executor(config, metrics, model)
    check = selfcheck.run(model, executor, check=config.self_check, max_batch_tokens=config.max_batch_tokens,
                          max_items=config.max_items_per_request, multi_item=config.mis_enabled, delimiter=delimiter)
    metrics.warmup_seconds.set(check.engine_seconds)
    metrics.self_check_tolerance.set(check.tolerance)
    if decision_template is not None and check.deviation is not None:
        decided = decision_selfcheck.run(model, executor, decision_template, config.mis_enabled)
        check = dataclasses.replace(check, deviation=max(check.deviation, decided))
    if check.deviation is None:
        log.warning("self-check skipped (--no-self-check): scores are not compared with transformers at start-up")
    else:
        metrics.self_check_deviation.set(check.deviation)
        log.info("self-check passed: deviation %.3g (tolerance %g) on %d sequences, %d tokens in two batches; "
                 "engine %.3f s, reference %.3f s", check.deviation, check.tolerance, check.sequences,
                 check.tokens, check.engine_seconds, check.reference_seconds)
    if config.quantization == Quantization.INT8:
        executor = _int8(config, metrics, model, executor, threads.threads)
    if config.simulate_device_ms is not None:  # after the self-check, which proved the real forward
        executor.stream = SimulatedStream(config.simulate_device_ms, model.hidden_size)
        metrics.device_simulated.set(1)
        log.warning("simulated device: every forward is replaced by %g ms per 8,192 tokens of computing nothing; "
                    "scores are meaningless (--simulate-device-ms is for benchmarks of the host pipeline)",
                    config.simulate_device_ms)
    if config.gc_freeze:
        metrics.gc_frozen_objects.set(freeze_after_load())
    scheduler = Scheduler(executor, config.max_batch_tokens, config.max_queue_tokens, metrics,
                          config.pipeline_depth)
    scheduler.start()
    return Served(model, scheduler, decision_template)


def _int8(config: WorkerConfig, metrics: WorkerMetrics, model: ScoringModel, reference: Executor,
          threads: int) -> Executor:
    """The int8 engine, certified against the float32 one (`reference`), or CertificateFailed."""
    executor, certificate = quantization.int8_executor(model, reference, config, threads)
    metrics.int8_max_score_delta.set(certificate.max_score_delta)
    metrics.int8_spearman.set(certificate.spearman)
    metrics.int8_top10.set(certificate.top10)
    metrics.int8_speedup.set(certificate.speedup)
    quantization.check(certificate, config)
    return executor


def _prompt(config: WorkerConfig, model: ScoringModel) -> DecisionTemplate | None:
    """--prompt-template and --label-tokens, resolved once with the model's tokenizer (or refused: the worker
    does not start with a prompt that cannot apply, or a label that is not one token); the decision template."""
    template = load_template(config.prompt_template) if config.prompt_template is not None else None
    if template is not None and not model.is_decoder:
        raise ValueError(f"--prompt-template {template.name}: a prompt template wraps (query, item) pairs for "
                         "decoder models (causal LMs and decoder classifiers); this model is a "
                         f"{model.kind.value}")
    labels, source = config.label_tokens, "--label-tokens"
    if labels is None and template is not None and model.kind == ModelKind.CAUSAL_LM and template.label_tokens:
        labels, source = template.label_tokens, f"the {template.name} template's label tokens (--label-tokens)"
    if labels is not None and model.kind != ModelKind.CAUSAL_LM:
        raise ValueError(f"--label-tokens: label tokens are read from a causal LM's next-token logits; this "
                         f"model is a {model.kind.value}, whose own head gives its scores")
    model.template = template
    decision_template = None
    if model.kind == ModelKind.CAUSAL_LM:
        decision_template = resolve_decision_template(model.tokenizer, config.decision_template)
    elif config.decision_template is not None:
        raise ValueError(f"--decision-template: decisions are read from a causal LM's next-token probabilities; "
                         f"this model is a {model.kind.value}")
    if labels is not None:
        model.default_labels = resolve_label_tokens(model.tokenizer, labels, source, model.logit_size)
    if template is not None or labels is not None:
        log.info("prompt template %s (shared prefix %r, per item {item}%r); label tokens %s = %s",
                 template.name if template else None, "".join(template.head) if template else "",
                 template.tail if template else "", list(labels or []), model.default_labels)
    return decision_template


def _executor(config: WorkerConfig, metrics: WorkerMetrics, model: ScoringModel) -> Executor:
    """Attention backend and, with --cuda-graph, the graph buckets (captured here, before the model thread
    starts: nothing else may use the GPU during a capture)."""
    backend = resolve_backend(config.attention_backend.value, model.device)
    compiler = None
    if compile_enabled(config.compile.value, model.device):
        compiler = CompiledTrunk(model.trunk, config.compile_budget_seconds, config.compile_cache_dir,
                                 on_failure=metrics.compile_failures.inc,
                                 on_compiled=lambda key, seconds: metrics.compile_seconds.labels(key).set(seconds))
    graphs = None
    if config.cuda_graph:
        kinds = {"flex": LayoutKind.FLEX, "triton": LayoutKind.TRITON}
        graphs = GraphRunner(model, kinds.get(backend, LayoutKind.DENSE),
                             config.cuda_graph_token_buckets, config.cuda_graph_max_tokens,
                             config.cuda_graph_max_seqs, on_capture_failure=metrics.graph_capture_failures.inc,
                             compiler=compiler)
        graphs.capture()
        if compiler is not None:
            compiler.finish_start_up()
        for bucket in graphs.buckets:  # every series from the start, so graph panels have data
            if not bucket.disabled:
                path = "graph" if bucket.graph is not None else "padded"
                metrics.graph_runs.labels(path, str(bucket.tokens))
    return Executor(model, backend, graphs, compiler=compiler)
