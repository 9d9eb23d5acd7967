"""Start-up self-check: the engine's scores for fixed probe sets against plain transformers on the same weights.

The probes (serving/startup/probes.py) are planned like requests and run through the real path: tokenize → plan →
Executor (CUDA-graph buckets included) → the jobs' heads, in two batches: one of mixed lengths from several
simulated requests (multi-item among them when the server has multi-item scoring on) sized to every configured
limit (batch tokens, items per request), and an edge batch: the model's maximum length (up to a cap) co-batched with
short sequences, both sides of longrope's threshold, the multi-item delimiter on the last position. Special tokens
sit inside the probes; sliding windows are crossed. The reference runs each sequence alone through the model's own
forward with transformers' eager attention and its own rotary modules (the same modules, switched for the pass: the
weights are never loaded twice). Deviation is the largest score difference relative to max(1, largest reference
score); above the dtype's tolerance the worker refuses to start. Without the check (`--no-self-check`) the engine
passes still run: they are the warm-up.

With a prompt template (--prompt-template), a text request through the template is checked too, in a batch of its
own, single-item and (with multi-item scoring on) multi-item, against transformers on each fully rendered prompt,
`tokenizer(prompt)`: it proves the template's tokenization rule (planning/template_encoding.py) on the model's own
tokenizer.

Embedding models are compared with `SentenceTransformer.encode` re-done from an independent reading of their
sentence-transformers files (serving/startup/embedding_reference.py): the probes above, and text probes under every
prompt, one of them past max_seq_length."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.dtypes import dtype_name
from scorekeeper_worker.model.kernels.attention import ATTENTION_NAME
from scorekeeper_worker.model.loader import ModelKind, ScoringModel
from scorekeeper_worker.model.trunk_patches import plain_linears, transformers_rotary
from scorekeeper_worker.planning.planner import ScoreAsk
from scorekeeper_worker.serving.direct import score_now, scored
from scorekeeper_worker.serving.prepare import Limits
from scorekeeper_worker.serving.startup import embedding_reference
from scorekeeper_worker.serving.startup.embedding_reference import ReferenceEncoder
from scorekeeper_worker.serving.startup.probes import Probe, edge_probes, probes

# Wide enough for reordered float arithmetic of the dtype, far below what a leak between sequences, a wrong head,
# pooling position or mask does (O(0.1) and more on real and random models alike).
TOLERANCE = {torch.float32: 5e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
_LABELS = 4  # causal LMs: scored on the reference's top tokens, where a deviation shows most
# The template probe: items that start where the template's item text begins (no leading space, so the tokenizer
# merges across the seam), one of them empty.
TEMPLATE_QUERY = "What is the capital of France?"
TEMPLATE_ITEMS = ("The capital of France is Paris.", "", "Berlin is a large city; the dog likes to run in the park.")


Rows = list[list[list[float]]]  # per probe, per item: the item's scores
Labels = list[list[list[int]] | None]  # per probe: causal LMs' label ids per item, else None


@dataclass(frozen=True)
class SelfCheckResult:
    deviation: float | None  # None: reference pass skipped (--no-self-check)
    tolerance: float
    sequences: int
    tokens: int
    engine_seconds: float
    reference_seconds: float


class SelfCheckFailed(RuntimeError):
    """The engine's scores differ from plain transformers: serving would give wrong scores."""


def engine_scores(model: ScoringModel, executor: Executor, probe_set: list[Probe], labels: Labels,
                  max_batch_tokens: int, delimiter: int | None) -> tuple[Rows, int]:
    """Every probe planned as the server plans a request, all units in one batch; (scores, tokens run)."""
    causal = model.kind == ModelKind.CAUSAL_LM
    asks = [ScoreAsk(query=probe.query, items=probe.items, apply_softmax=causal, label_token_ids=probe_labels,
                     multi_item_scoring=probe.multi_item)
            for probe, probe_labels in zip(probe_set, labels, strict=True)]
    jobs = scored(score_now(executor, asks, Limits(max_batch_tokens=max_batch_tokens, delimiter=delimiter)))
    return [[list(row or []) for row in job.scores] for job in jobs], sum(job.prompt_tokens for job in jobs)


@contextmanager
def eager_attention(model: ScoringModel) -> Iterator[None]:
    if not model.packed:  # the model's own attention already
        with plain_linears():
            yield
        return
    model.model.set_attn_implementation("eager")
    try:
        with transformers_rotary(model.model), plain_linears():
            yield
    finally:
        model.model.set_attn_implementation(ATTENTION_NAME)


def _forward(model: ScoringModel, ids: list[int], types: list[int] | None = None) -> torch.Tensor:
    tensor = torch.tensor([ids], device=model.device)
    extra = {"token_type_ids": torch.tensor([types], device=model.device)} if types and model.uses_token_types else {}
    if model.kind == ModelKind.CAUSAL_LM:
        return model.model(input_ids=tensor, logits_to_keep=1).logits[0, -1].double()
    return model.model(input_ids=tensor, **extra).logits[0].double()


@torch.inference_mode()
def reference_scores(model: ScoringModel, probe_set: list[Probe],
                     encoder: ReferenceEncoder | None = None) -> tuple[Rows, Labels]:
    """Each (query, item) sequence alone through the model's own forward; causal LMs: softmax over the reference's
    top tokens, which become the labels of the engine pass; embedding models: `encoder`'s similarity (its own
    reading of the sentence-transformers files). Returns (scores per probe, labels per probe)."""
    scores: Rows = []
    labels: Labels = []
    with eager_attention(model):
        for probe in probe_set:
            rows, probe_labels = [], []
            query = encoder.embed_ids(probe.query) if encoder is not None else None
            for item in probe.items:
                if encoder is not None and query is not None:
                    rows.append([encoder.similarity(query[None], encoder.embed_ids(item)[None]).item()])
                    continue
                out = _forward(model, probe.query + item, [0] * len(probe.query) + [1] * len(item))
                if model.kind == ModelKind.CAUSAL_LM:
                    top = out.topk(_LABELS).indices
                    probe_labels.append(top.tolist())
                    out = torch.softmax(out[top], dim=-1)
                rows.append(out.tolist())
            scores.append(rows)
            labels.append(probe_labels if model.kind == ModelKind.CAUSAL_LM else None)
    return scores, labels


def _template_rows(model: ScoringModel, executor: Executor, multi_item: bool) -> tuple[Rows, Rows]:
    """(engine, reference) rows of the template probe: a text request through the template, single-item and, with
    multi-item scoring, multi-item; the reference is each rendered prompt's `tokenizer(prompt)` alone."""
    template = model.template
    assert template is not None
    causal = model.kind == ModelKind.CAUSAL_LM
    reference: Rows = []
    labels: list[list[int]] = []
    with eager_attention(model), torch.inference_mode():
        for item in TEMPLATE_ITEMS:
            ids = list(model.tokenizer(template.render(TEMPLATE_QUERY, item, None))["input_ids"])
            out = _forward(model, ids)
            if causal:
                labels.append(out.topk(_LABELS).indices.tolist())
                out = torch.softmax(out[labels[-1]], dim=-1)
            reference.append(out.tolist())
    asks = [ScoreAsk(query=TEMPLATE_QUERY, items=list(TEMPLATE_ITEMS), apply_softmax=causal,
                     label_token_ids=labels if causal else None, multi_item_scoring=multi)
            for multi in sorted({False, multi_item})]
    engine: Rows = [[list(row or []) for row in job.scores] for job in scored(score_now(executor, asks))]
    return engine, [reference] * len(engine)


def deviation(engine: Rows, reference: Rows) -> float:
    """max |engine - reference| / max(1, max |reference|) over every score; infinite if any score is not finite
    (a model that overflows cannot be served either way) or a row has another length (an embedding's dimension)."""
    rows = [(e_row, r_row) for e_rows, r_rows in zip(engine, reference, strict=True)
            for e_row, r_row in zip(e_rows, r_rows, strict=True)]
    pairs = [(e, r) for e_row, r_row in rows for e, r in zip(e_row, r_row, strict=False)]
    if any(len(e_row) != len(r_row) for e_row, r_row in rows) or \
            not all(math.isfinite(e) and math.isfinite(r) for e, r in pairs):
        return math.inf
    scale = max([1.0, *(abs(r) for _, r in pairs)])
    return max(abs(e - r) for e, r in pairs) / scale


def run(model: ScoringModel, executor: Executor, *, check: bool, max_batch_tokens: int, max_items: int,
        multi_item: bool, delimiter: int | None) -> SelfCheckResult:
    """The engine passes (always: they warm the engine up) and, with `check`, the reference pass and the
    comparison."""
    budget_batch = probes(model, max_batch_tokens, max_items, multi_item, delimiter)
    edge_batch = edge_probes(model, multi_item, delimiter)
    every = budget_batch + edge_batch
    started = time.perf_counter()
    reference: Rows = []
    # Embedding models: a reference of their own reading, and text probes (prompts, max_seq_length).
    encoder = embedding_reference.reference_encoder(model) if model.kind == ModelKind.EMBEDDING and check else None
    text_probes = embedding_reference.text_probes(model, encoder) if encoder is not None else None
    text_reference: Rows = []
    if check:
        reference, labels = reference_scores(model, every, encoder)
        if encoder is not None and text_probes is not None:
            with eager_attention(model):
                text_reference = embedding_reference.reference_rows(encoder, text_probes)
    else:
        labels = [[[0, 1]] * len(p.items) if model.kind == ModelKind.CAUSAL_LM else None for p in every]
    referenced = time.perf_counter()
    engine: Rows = []
    tokens: list[int] = []
    for batch, batch_labels in ((budget_batch, labels[:len(budget_batch)]), (edge_batch, labels[len(budget_batch):])):
        rows, batch_tokens = engine_scores(model, executor, batch, batch_labels, max_batch_tokens, delimiter)
        engine += rows
        tokens.append(batch_tokens)
    if model.template is not None and check:
        template_engine, template_reference = _template_rows(model, executor, multi_item)
        engine, reference = engine + template_engine, reference + template_reference
    if text_probes is not None:
        engine, reference = engine + embedding_reference.engine_rows(model, executor, text_probes), \
            reference + text_reference
    result = SelfCheckResult(deviation(engine, reference) if check else None, TOLERANCE[model.dtype],
                             sum(len(p.items) for p in every), sum(tokens),
                             time.perf_counter() - referenced, referenced - started)
    if result.deviation is not None and not result.deviation <= result.tolerance:  # NaN fails too
        overflow = " (non-finite scores: numeric overflow)" if math.isinf(result.deviation) else ""
        raise SelfCheckFailed(
            "start-up self-check failed: the engine's scores deviate from plain transformers by "
            f"{result.deviation:.3g}{overflow} (relative; tolerance {result.tolerance:g} for "
            f"{dtype_name(model.dtype)}) on {result.sequences} probe sequences packed into two batches of "
            f"{tokens[0]} and {tokens[1]} tokens. The engine would serve wrong scores for this model, so the worker "
            "refuses to start; --no-self-check skips the check (only to debug).")
    return result
