"""The model's own computation on a packed batch: the trunk forward, pooled (`pooled_rows`: shared by the eager
executor and the CUDA-graph runner, which captures exactly this function), then the heads, on gathered rows only
(never on every token).

Each head takes pooled trunk outputs `rows [n, H]` (one per scored item) and returns scores `[n, k]`. Classifier heads
are the model's own modules (the support matrix names them), so a head is never re-implemented here. Scores are
computed so they stay finite for every finite temperature > 0: softmax subtracts the maximum before dividing by the
temperature (in float64), so a tiny temperature tends to the arg-max one-hot and a huge one to the uniform
distribution, instead of overflowing to inf - inf = NaN."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

from scorekeeper_worker.engine.runner.packing import ForwardInputs
from scorekeeper_worker.model.loader import HeadModules, ScoringModel
from scorekeeper_worker.model.sentence_transformers import Similarity
from scorekeeper_worker.model.trunk_patches import only_rows, per_token_tables


class PaddedTrunk(Protocol):
    """The backend boundary: a trunk run on one right-padded block of rows, called with `input_ids`,
    `attention_mask`, `position_ids` (and `token_type_ids`), returning an object with `.last_hidden_state`. A model's
    own torch module is one; the int8 runtime (engine/runner/int8_trunk.py) is another."""

    def __call__(self, **inputs: torch.Tensor) -> Any: ...


def padded_hidden(trunk: PaddedTrunk, inputs: ForwardInputs, pad_token: int) -> torch.Tensor:
    """Models whose attention does not go through transformers' AttentionInterface (support matrix: padded): each
    block of similar-length sequences runs as an ordinary right-padded batch with an attention mask, so the model's
    own attention keeps sequences apart. Padding is `pad_token` (as transformers pads a batch), never a copy of
    another request's token: the model's attention multiplies masked keys by 0, and 0 × inf is NaN. Returns the
    packed hidden states [T, H], as the packed path does."""
    ids, types = inputs.input_ids[0], inputs.token_type_ids
    hidden: torch.Tensor | None = None
    for block in inputs.layout.context_blocks:
        mask = torch.arange(block.token_index.shape[1], device=ids.device)[None, :] < block.lengths[:, None]
        extra = {} if types is None else {"token_type_ids": types[0][block.token_index]}
        out = trunk(input_ids=ids[block.token_index].masked_fill(~mask, pad_token), attention_mask=mask.long(),
                    position_ids=block.positions, **extra).last_hidden_state
        if hidden is None:
            hidden = out.new_empty(inputs.num_tokens + 1, out.shape[-1])  # the last row takes padding
        hidden.index_copy_(0, block.write_index, out.reshape(-1, out.shape[-1]))
    assert hidden is not None, "a batch has at least one sequence"
    return hidden[:-1]


def pooled_rows(model: ScoringModel, inputs: ForwardInputs, trunk: PaddedTrunk | None = None) -> torch.Tensor:
    """Forward the packed batch and pool it: [P, H] float32, one row per Pool of the units (graph-shaped inputs:
    one row per slot of the bucket, the live ones first). Reads no device value on the host for graph-shaped inputs,
    so it can be captured.
    `trunk`: another backend for the trunk, run on padded blocks (int8)."""
    inputs.layout.reset()  # masks are rebuilt from the tensors' current values in every pass
    token_index = inputs.pool_token_index
    pad_token = getattr(model.model.config, "pad_token_id", None) or 0
    if trunk is not None:
        hidden = padded_hidden(trunk, inputs, pad_token)
    elif model.packed:
        extra = {} if inputs.token_type_ids is None else {"token_type_ids": inputs.token_type_ids}
        rows = None
        selected = inputs.pooled_tokens  # row blocks only (found on the host): graph buckets keep their shapes
        if model.selects_rows and selected is not None and len(selected) < inputs.num_tokens:
            rows, token_index = selected, inputs.pooled_index  # the trunk then returns these tokens only
        with per_token_tables(inputs.rope_table), only_rows(rows):
            output = model.trunk(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                 scorekeeper_layout=inputs.layout, use_cache=False, **extra)
        hidden = output.last_hidden_state[0]
    else:
        hidden = padded_hidden(model.trunk, inputs, pad_token)
    contributions = hidden[token_index].float() * inputs.pool_weight[:, None]
    pooled = torch.zeros(inputs.pool_rows or len(inputs.readouts), hidden.shape[-1], dtype=torch.float32,
                         device=hidden.device)
    return pooled.index_add_(0, inputs.pool_slot, contributions)


def _apply(modules: HeadModules, x: torch.Tensor) -> torch.Tensor:
    for module, reads_sequence in modules:
        x = module(x[:, None, :]) if reads_sequence else module(x)
    return x


# Logits the full-vocabulary normaliser materialises at once: rows are taken in chunks of this many logits in all
# (16 M: 64 MB of float32, ~110 rows of a 150k vocabulary), so its memory does not grow with the items of a job.
NORMALISER_ELEMENTS = 1 << 24


def pre_head(model: ScoringModel, rows: torch.Tensor) -> torch.Tensor:
    """The vector the head consumes (what `return_pooled_hidden_states` returns): the trunk's pooled row, through
    the trunk's own pooler where the classifier reads that (BERT)."""
    return _apply(model.pre_head, rows)


def classifier_logits(model: ScoringModel, features: torch.Tensor) -> torch.Tensor:
    """The model's own head modules on pre-head features → float32 logits [n, num_labels]."""
    return _apply(model.head, features).float()


def _softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    shifted = logits.double() - logits.double().amax(dim=-1, keepdim=True)  # ≤ 0, and exactly 0 at the maximum
    return torch.softmax(shifted / temperature, dim=-1)


def classifier_scores(logits: torch.Tensor, apply_softmax: bool, temperature: float,
                      multi_label: bool = False) -> torch.Tensor:
    """Raw logits, or probabilities: over classes, or one sigmoid per class for a single logit (not SGLang's
    constant 1.0) and for multi-label classifiers (transformers' multi_label_classification: classes are not
    exclusive)."""
    if not apply_softmax:
        return logits
    if logits.shape[-1] == 1 or multi_label:
        return torch.sigmoid(logits.double() / temperature)  # ±inf for extreme temperatures: sigmoid is 0 or 1
    return _softmax(logits, temperature)


def _softcap(model: ScoringModel, logits: torch.Tensor) -> torch.Tensor:
    cap = getattr(model.model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def causal_lm_scores(model: ScoringModel, rows: torch.Tensor, labels: torch.Tensor, apply_softmax: bool,
                     temperature: float) -> torch.Tensor:
    """`rows [n, H]` against one label list `labels [k]` → `[n, k]`. apply_softmax: softmax over the label logits
    only (needs the k label rows of the output embedding, once for every row: `rows @ W[labels].T`, never an
    [n, k, H] gather); otherwise true probabilities exp(log_softmax)[labels], whose normaliser needs the full
    vocabulary."""
    head = model.model.get_output_embeddings()
    label_logits = (rows @ head.weight.index_select(0, labels).T).float()
    if head.bias is not None:
        label_logits = label_logits + head.bias.index_select(0, labels).float()
    label_logits = _softcap(model, label_logits)
    if apply_softmax:
        return _softmax(label_logits, temperature)
    return torch.exp(label_logits - _log_normaliser(model, head, rows))


def token_log_probs(model: ScoringModel, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[i] | row i) [n] in float32: a log-softmax over the full vocabulary (after Gemma2's final
    softcapping), a chunk of rows at a time so memory does not grow with the rows of a job."""
    head = model.model.get_output_embeddings()
    step = max(1, NORMALISER_ELEMENTS // model.logit_size)
    out = []
    for i in range(0, rows.shape[0], step):
        logits = _softcap(model, head(rows[i:i + step]).float())
        out.append(torch.log_softmax(logits, dim=-1).gather(1, targets[i:i + step, None])[:, 0])
    return torch.cat(out)


def _log_normaliser(model: ScoringModel, head: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """logsumexp over the full vocabulary [n, 1], a chunk of rows at a time."""
    step = max(1, NORMALISER_ELEMENTS // model.logit_size)
    return torch.cat([torch.logsumexp(_softcap(model, head(rows[i:i + step]).float()), dim=-1, keepdim=True)
                      for i in range(0, rows.shape[0], step)])


def embeddings(model: ScoringModel, pooled: torch.Tensor) -> torch.Tensor:
    """What `SentenceTransformer.encode` returns: the pooled rows, L2-normalised when the model's modules.json ends
    with Normalize, then cut to its truncate_dim."""
    config = model.sentence_config
    vectors = F.normalize(pooled.float(), p=2.0, dim=-1) if config.normalize else pooled.float()
    return vectors if config.truncate_dim is None else vectors[:, :config.truncate_dim]


def similarity_scores(similarity: Similarity, query: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """[H] and [n, H] embeddings → [n, 1] float32 scores, as the model's `similarity_fn_name` defines them
    (sentence-transformers' cos_sim, dot_score, and minus the euclidean or manhattan distance)."""
    query, items = query.float()[None, :], items.float()
    if similarity == Similarity.COSINE:
        scores = F.cosine_similarity(items, query, dim=-1)
    elif similarity == Similarity.DOT:
        scores = (items * query).sum(dim=-1)
    else:
        scores = -torch.linalg.vector_norm(items - query, ord=2 if similarity == Similarity.EUCLIDEAN else 1, dim=-1)
    return scores[:, None]
