"""Every Prometheus metric the worker exports, defined once, in base units, with deliberate buckets."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

if TYPE_CHECKING:
    from scorekeeper_worker.base.config import WorkerConfig
    from scorekeeper_worker.base.gpu_stats import GpuReader

# Stage latencies range from ~100 µs (tokenizing a short text, a small GPU forward, an idle queue) to tens of seconds
# (a long batch on CPU); the lowest buckets resolve the fast stages, the upper ones the alert thresholds (0.5-1 s).
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                 10.0, 30.0, 60.0)
# Device→host copies of a few pooled vectors take microseconds; thousands of large vectors take milliseconds.
COPY_BUCKETS = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5)
# A young-generation collection takes microseconds; a full one over a loaded worker's objects hundreds of milliseconds.
GC_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# The model thread's on-CPU share of a forward: 0.5 is two threads given one core's worth, 0.9 a quiet machine.
CPU_SHARE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
STAGES = ("tokenize", "queue", "forward", "scoring", "serialize", "end_to_end")
# A forward batch's steps (`batch_step_seconds`): on the host, then the device's time of the forward.
BATCH_STEPS = ("pack", "copy_in", "device", "heads", "copy_out", "respond")
REJECTIONS = ("queue_full", "body_too_large", "request_tokens", "response_bytes", "intermediate_bytes",
              "parse_queue_full")
CANCELLATIONS = ("disconnect", "timeout", "device_lost")
SIZE_CLASSES = ("small", "medium", "large")  # queue wait by request size (`size_class`)
DECISION_TYPES = ("predicate", "yes_no", "choice", "score")  # planning.decision_prompts.QuestionKind


def size_class(tokens: int, max_batch_tokens: int) -> str:
    """small: fits in an eighth of a batch; medium: fits in one batch; large: spans several batches."""
    if tokens <= max_batch_tokens // 8:
        return "small"
    return "medium" if tokens <= max_batch_tokens else "large"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


class WorkerMetrics:
    """One instance per server; a private registry keeps tests and several apps in one process independent."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.stage_seconds = Histogram("scorekeeper_stage_duration_seconds", "Time spent per request stage",
                                       ["stage"], buckets=STAGE_BUCKETS, registry=r)
        self.batch_step_seconds = Histogram(
            "scorekeeper_batch_step_seconds", "Each step of a forward batch. On the host: pack (the batch's tensors), "
            "copy_in (into the device's buffers), heads (enqueueing them), copy_out (the results to Python floats), "
            "respond (finishing the batch's requests). device: the forward's device time (CUDA events on a GPU, the "
            "simulated device's time with --simulate-device-ms, the forward's wall time on CPU)", ["step"],
            buckets=STAGE_BUCKETS, registry=r)
        self.device_busy_seconds = Counter(
            "scorekeeper_device_busy_seconds_total", "Device time of every forward batch: its rate is the share of "
            "time the device computes (1 = never idle)", registry=r)
        self.device_simulated = Gauge("scorekeeper_device_simulated", "1 when --simulate-device-ms replaces every "
                                      "forward by a simulated device (a benchmark of the host pipeline)", registry=r)
        # `route`, not `endpoint`: the Prometheus Operator gives every target an `endpoint` label (the port's name),
        # which would rename this one exported_endpoint (docs/observability.md#target-labels).
        self.requests = Counter("scorekeeper_requests_total", "HTTP requests by route and status code",
                                ["route", "code"], registry=r)
        self.rejected = Counter("scorekeeper_rejected_requests_total", "Requests refused for capacity",
                                ["reason"], registry=r)
        self.cancelled = Counter("scorekeeper_cancelled_requests_total",
                                 "Admitted requests whose remaining work was dropped", ["reason"], registry=r)
        self.isolated_failures = Counter(
            "scorekeeper_isolated_failures_total", "Requests failed alone by an error of their forward (the other "
            "requests of the batch were served), by cause: the exception's type; device_lost when the error made the "
            "accelerator unusable and every open request got 503", ["cause"], registry=r)
        self.queue_wait_seconds = Histogram("scorekeeper_queue_wait_seconds",
                                            "Admission to first batch, by request size (planned tokens against "
                                            "the batch budget)", ["size"], buckets=STAGE_BUCKETS, registry=r)
        self.inflight = Gauge("scorekeeper_inflight_requests", "Requests being handled", registry=r)
        self.queue_depth = Gauge("scorekeeper_queue_depth", "Requests admitted and not yet finished", registry=r)
        self.queue_tokens = Gauge("scorekeeper_queue_tokens", "Tokens admitted and not yet run", registry=r)
        self.batch_requests = Histogram("scorekeeper_batch_requests", "Requests with rows in one forward batch",
                                        buckets=COUNT_BUCKETS, registry=r)
        self.batch_sequences = Histogram("scorekeeper_batch_sequences", "Pack units (context rows) per batch",
                                         buckets=COUNT_BUCKETS, registry=r)
        self.batch_tokens = Histogram("scorekeeper_batch_tokens", "Tokens per forward batch",
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.padding_tokens = Counter("scorekeeper_padding_tokens_total",
                                      "Pad tokens run through the model (zero when packed; graph buckets pad)",
                                      registry=r)
        self.items = Counter("scorekeeper_items_scored_total", "Items scored", ["mode"], registry=r)
        self.prompt_tokens = Counter("scorekeeper_prompt_tokens_total", "Tokens run through the model for requests",
                                     registry=r)
        self.score_requests = Counter("scorekeeper_score_requests_total", "Scored requests by execution mode",
                                      ["mode"], registry=r)
        self.decision_questions = Counter("scorekeeper_decision_questions_total",
                                          "Questions answered on /v1/decisions and /v1/systemone, by type", ["type"],
                                          registry=r)
        self.hidden_copy_bytes = Counter("scorekeeper_hidden_state_copy_bytes_total",
                                         "Bytes of pooled hidden states copied device→host", registry=r)
        self.hidden_copy_seconds = Histogram("scorekeeper_hidden_state_copy_seconds",
                                             "Device→host copy time of pooled hidden states per batch",
                                             buckets=COPY_BUCKETS, registry=r)
        self.hidden_copy_vectors = Counter("scorekeeper_hidden_state_copy_vectors_total",
                                           "Pooled hidden-state vectors copied to the host", registry=r)
        self.hidden_requests = Counter("scorekeeper_hidden_state_requests_total",
                                       "Requests asking for pooled hidden states", registry=r)
        self.model_load_seconds = Gauge("scorekeeper_model_load_seconds", "Time to load the model", registry=r)
        self.warmup_seconds = Gauge("scorekeeper_warmup_seconds", "Time of the warm-up batch", registry=r)
        self.ready = Gauge("scorekeeper_ready", "1 when the model is loaded and warm", registry=r)
        self.self_check_deviation = Gauge("scorekeeper_self_check_deviation",
                                          "Start-up self-check: largest relative score difference between the "
                                          "engine and plain transformers on the probe set", registry=r)
        self.self_check_tolerance = Gauge("scorekeeper_self_check_tolerance",
                                          "Start-up self-check: the largest deviation accepted for the model's dtype",
                                          registry=r)
        self.cpu_threads = Gauge("scorekeeper_cpu_threads", "CPU threads the model runs with (--threads: auto is the "
                                 "smaller of the cgroup CPU quota and the affinity mask)", registry=r)
        self.model_thread_cpu_share = Histogram(
            "scorekeeper_model_thread_cpu_share", "CPU forwards by the model thread's CPU time over their wall time: "
            "0.9-1 alone on its cores, lower while other processes hold them", buckets=CPU_SHARE_BUCKETS, registry=r)
        self.cpu_dedicated = Gauge("scorekeeper_cpu_dedicated", "1 when the worker's CPUs are its own (an exclusive "
                                   "cpuset as large as its CPU quota: Guaranteed QoS, static CPU manager), 0 when "
                                   "shared with other processes; OpenMP's wait policy follows it", registry=r)
        self.openmp_runtime = Gauge("scorekeeper_openmp_runtime", "1 for the OpenMP runtime torch's CPU threads run "
                                    "on (--openmp-runtime): intel (libiomp5 preloaded), gnu (libgomp) or unknown",
                                    ["runtime"], registry=r)
        self.int8_max_score_delta = Gauge("scorekeeper_int8_max_score_delta", "int8 accuracy certificate: largest "
                                          "|int8 - float32| score on the fixed probe set", registry=r)
        self.int8_spearman = Gauge("scorekeeper_int8_spearman", "int8 accuracy certificate: Spearman correlation of "
                                   "int8 and float32 scores per probe query (mean)", registry=r)
        self.int8_top10 = Gauge("scorekeeper_int8_top10_agreement", "int8 accuracy certificate: share of the float32 "
                                "top 10 that int8 also ranks in its top 10 (mean over probe queries)", registry=r)
        self.int8_speedup = Gauge("scorekeeper_int8_speedup", "int8 certificate: float32 seconds / int8 seconds for "
                                  "the probe set (after a warm-up request each)", registry=r)
        self.info = Info("scorekeeper_model", "Served model", registry=r)
        self.build_info = Info("scorekeeper_build", "Worker build: package versions", registry=r)
        # The configured budgets, so dashboards can show batch fill and queue fill as ratios.
        self.max_batch_tokens = Gauge("scorekeeper_max_batch_tokens", "Token budget of one forward batch", registry=r)
        self.max_queue_tokens = Gauge("scorekeeper_max_queue_tokens",
                                      "Queued-token limit beyond which requests get 429", registry=r)
        self.graph_runs = Counter("scorekeeper_cuda_graph_runs_total", "Forward batches by execution path",
                                  ["path", "bucket"], registry=r)
        self.graph_capture_failures = Counter("scorekeeper_cuda_graph_capture_failures_total",
                                              "CUDA graph captures that fell back to eager", registry=r)
        self.compile_seconds = Gauge("scorekeeper_compile_seconds", "torch.compile of the trunk layers (--compile): "
                                     "seconds of the first, compiling pass per target (a graph bucket, or eager)",
                                     ["target"], registry=r)
        self.compile_failures = Counter("scorekeeper_compile_failures_total", "Compiles of the trunk layers that "
                                        "failed: their target runs the plain layers", registry=r)
        self.gc_pauses = Histogram("scorekeeper_gc_pause_seconds", "Python garbage-collector pauses (the GIL is held: "
                                   "no request progresses) by generation", ["generation"], buckets=GC_BUCKETS,
                                   registry=r)
        self.gc_frozen_objects = Gauge("scorekeeper_gc_frozen_objects",
                                       "Objects moved to the collector's permanent generation after load (--gc-freeze)",
                                       registry=r)
        # A GPU worker's device (watch_gpu): read at every scrape, so the values are current without a model thread.
        self.gpu_memory_allocated = Gauge("scorekeeper_gpu_memory_allocated_bytes", "Device memory held by tensors "
                                          "(torch.cuda.memory_allocated)", ["device"], registry=r)
        self.gpu_memory_reserved = Gauge("scorekeeper_gpu_memory_reserved_bytes", "Device memory held by torch's "
                                         "caching allocator: tensors and cached free blocks (torch.cuda.memory_"
                                         "reserved)", ["device"], registry=r)
        self.gpu_memory_peak = Gauge("scorekeeper_gpu_memory_peak_bytes", "Most device memory held by tensors at "
                                     "once since the worker started (torch.cuda.max_memory_allocated)", ["device"],
                                     registry=r)
        self.gpu_memory_total = Gauge("scorekeeper_gpu_memory_total_bytes", "The device's memory", ["device"],
                                      registry=r)
        self.gpu_utilization = Gauge("scorekeeper_gpu_utilization_ratio", "Share of NVML's last sample period in "
                                     "which a kernel ran on the device (where nvidia-ml-py is installed)", ["device"],
                                     registry=r)
        for generation in ("0", "1", "2"):
            self.gc_pauses.labels(generation)
        for stage in STAGES:
            self.stage_seconds.labels(stage)  # export every series from the start so dashboards have data
        for step in BATCH_STEPS:
            self.batch_step_seconds.labels(step)
        for mode in ("multi_item", "single_item"):
            self.items.labels(mode)
            self.score_requests.labels(mode)
        for question_type in DECISION_TYPES:
            self.decision_questions.labels(question_type)
        for reason in REJECTIONS:
            self.rejected.labels(reason)
        for reason in CANCELLATIONS:
            self.cancelled.labels(reason)
        for size in SIZE_CLASSES:
            self.queue_wait_seconds.labels(size)
        self.graph_runs.labels("eager", "none")
        self.build_info.info({"version": _version("scorekeeper"), "python": platform.python_version(),
                              "torch": _version("torch"), "transformers": _version("transformers")})

    def configure(self, config: WorkerConfig) -> None:
        """Export the limits a server runs with (called once, before serving)."""
        self.max_batch_tokens.set(config.max_batch_tokens)
        self.max_queue_tokens.set(config.max_queue_tokens)

    def watch_gpu(self, gpu: GpuReader) -> None:
        """Export `gpu`'s memory, and its utilisation where NVML answers, read afresh at every scrape."""
        for gauge, read in ((self.gpu_memory_allocated, gpu.allocated), (self.gpu_memory_reserved, gpu.reserved),
                            (self.gpu_memory_peak, gpu.peak), (self.gpu_memory_total, gpu.total)):
            gauge.labels(gpu.device).set_function(read)
        if gpu.has_utilization():
            self.gpu_utilization.labels(gpu.device).set_function(gpu.utilization)
