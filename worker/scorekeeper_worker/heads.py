"""Heads applied to gathered rows only (never to every token): pure functions over tensors.

Each takes pooled trunk outputs `rows [n, H]` (one per scored item) and returns float32 scores `[n, k]`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scorekeeper_worker.loader import ModelKind, ScoringModel


def pre_head(model: ScoringModel, rows: torch.Tensor) -> torch.Tensor:
    """The vector the head consumes (what `return_pooled_hidden_states` returns): the trunk's pooled row, passed
    through BERT's pooler for BERT cross-encoders (their classifier reads the pooler output)."""
    pooler = getattr(model.trunk, "pooler", None)
    if model.kind == ModelKind.CROSS_ENCODER and pooler is not None:
        return pooler(rows[:, None, :])
    return rows


def classifier_logits(model: ScoringModel, features: torch.Tensor) -> torch.Tensor:
    """The model's own head on pre-head features: `score` (decoders), `classifier` (encoders; RoBERTa's head
    reads the first token of a sequence, so it gets a length-1 sequence)."""
    head = getattr(model.model, "score", None)
    if head is None:
        head = model.model.classifier
    if isinstance(head, torch.nn.Linear):
        return head(features).float()
    return head(features[:, None, :]).float()


def _softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # Subtract the maximum before dividing: a tiny temperature then tends to the arg-max one-hot instead of inf - inf.
    shifted = logits.double() - logits.double().amax(dim=-1, keepdim=True)
    return torch.softmax(shifted / temperature, dim=-1)


def classifier_scores(logits: torch.Tensor, apply_softmax: bool, temperature: float) -> torch.Tensor:
    """Raw logits, or probabilities over classes; a single-logit model gets sigmoid (not SGLang's constant 1.0)."""
    if not apply_softmax:
        return logits
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits / temperature)
    return _softmax(logits, temperature)


def _softcap(model: ScoringModel, logits: torch.Tensor) -> torch.Tensor:
    cap = getattr(model.model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def causal_lm_scores(model: ScoringModel, rows: torch.Tensor, labels: torch.Tensor, apply_softmax: bool,
                     temperature: float) -> torch.Tensor:
    """`labels [n, k]`. apply_softmax: softmax over the label logits only (needs k rows of the output embedding);
    otherwise true probabilities exp(log_softmax)[labels], whose normaliser needs the full vocabulary."""
    head = model.model.get_output_embeddings()
    weight = head.weight[labels]  # [n, k, H]
    label_logits = torch.einsum("nh,nkh->nk", rows, weight).float()
    if head.bias is not None:
        label_logits = label_logits + head.bias[labels].float()
    label_logits = _softcap(model, label_logits)
    if apply_softmax:
        return _softmax(label_logits, temperature)
    normaliser = torch.logsumexp(_softcap(model, head(rows).float()), dim=-1, keepdim=True)
    return torch.exp(label_logits - normaliser)


def cosine_scores(query: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """[H] and [n, H] → [n, 1] cosine similarities, computed in float32."""
    return F.cosine_similarity(items.float(), query.float()[None, :], dim=-1)[:, None]
