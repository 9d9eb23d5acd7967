"""What a /v1/rerank body must return, computed without the engine: every document's relevance from the reference's
/v1/score rows of the same query and documents (expected.py) by docs/api.md's table: a single logit through the
activation sentence-transformers' CrossEncoder reads from the directory (sigmoid by default, identity, tanh), the
last class's probability for several classes (transformers' pipeline: softmax, or a sigmoid per class for a
multi-label classifier), the first label token's share for a causal LM (its label tokens, from the template), the
model's similarity for an embedding model; and the ranking that follows (highest first, `top_n`, ids, documents).

Returns one relevance per document, in request order, or a `Refused` (the body must get a 400)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from compare import ATOL, RTOL, Refused, served_as_expected
from expected import expected
from subjects import Subject


def _single_logit(subject: Subject) -> bool:
    return subject.kind == "classifier" and subject.hf.config.num_labels == 1


def relevance(subject: Subject, body: dict[str, Any]) -> list[float] | Refused:
    causal = subject.kind == "causal_lm"
    if causal and subject.engine.default_labels is None:
        return Refused("a causal LM without label tokens")
    texts = [document if isinstance(document, str) else document["text"] for document in body["documents"]]
    score: dict[str, Any] = {"query": body["query"], "items": texts, "apply_softmax": not _single_logit(subject)}
    for key, renamed in [("truncate", "truncate"), ("truncation_direction", "truncation_direction"),
                         ("max_tokens_per_doc", "max_tokens_per_item")]:
        if key in body:
            score[renamed] = body[key]
    rows = expected(subject, score)
    if isinstance(rows, Refused):
        return rows
    if _single_logit(subject):
        activation = subject.cross_encoder.activation_fn
        return [float(activation(torch.tensor(row[0], dtype=torch.float64))) for row in rows]
    return [row[0] if causal else row[-1] for row in rows]


def check_ranking(body: dict[str, Any], served: dict[str, Any] | None, refusal: str | None,
                  want: list[float] | Refused) -> None:
    """`served`: the body of a 200; `refusal`: the message of a 400 (one of them is None)."""
    if not served_as_expected(body, refusal, want, "ranked"):
        return
    assert served is not None and not isinstance(want, Refused)
    results = served["results"]
    kept = [result["index"] for result in results]
    assert len(kept) == min(body.get("top_n") or len(want), len(want)) == len(set(kept)), (kept, body)
    scores = [result["relevance_score"] for result in results]
    np.testing.assert_allclose(scores, [want[i] for i in kept], rtol=RTOL, atol=ATOL, err_msg=str(body))
    assert scores == sorted(scores, reverse=True), (scores, body)
    left_out = [want[i] for i in range(len(want)) if i not in kept]
    if left_out:  # the best top_n: no document left out is more relevant than the last one kept
        last = want[kept[-1]]
        assert max(left_out) <= last + ATOL + RTOL * abs(last), (want, kept, body)
    for result in results:
        document = body["documents"][result["index"]]
        text, doc_id = (document, None) if isinstance(document, str) else (document["text"], document["id"])
        assert result.get("id") == doc_id, (result, body)
        assert result.get("document") == ({"text": text} if body.get("return_documents") else None), (result, body)
