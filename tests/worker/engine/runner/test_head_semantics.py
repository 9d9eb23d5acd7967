"""What a head's scores mean, as the model's own library defines it: /v1/rerank applies the activation a
cross-encoder declares (sentence-transformers' CrossEncoder, every place it reads it from; sigmoid by default),
multi-label classifiers get a sigmoid per class (transformers' text-classification pipeline), and a single label
token, which would give every item 1.0 under softmax, is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
from serving import RunningServer, free_port

QUERY = "what is the capital of france?"
DOCUMENTS = ["paris is the capital of france.", "a banana is yellow.", "berlin is a large city.", ""]
CONFIG_EXIT = 2  # the CLI refuses a flag before loading anything


def _rerank(server: RunningServer, documents: list[str] = DOCUMENTS) -> list[float]:
    response = httpx.post(server.url + "/v1/rerank", json={"query": QUERY, "documents": documents}, timeout=60)
    assert response.status_code == 200, response.text
    by_index = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
    return [by_index[i] for i in range(len(documents))]


def _edit_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))


def _saved_by_cross_encoder(base: Path, out: Path, activation: str) -> Path:
    """sentence-transformers 6.x saves the activation in config_sentence_transformers.json."""
    import torch
    from sentence_transformers import CrossEncoder

    CrossEncoder(str(base), device="cpu", activation_fn=getattr(torch.nn, activation)()).save(str(out))
    return out


@pytest.mark.parametrize("declared", ["default", "Identity", "Tanh", "config.json", "legacy"])
def test_rerank_applies_the_activation_the_cross_encoder_declares(
        declared: str, tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer],
        tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder

    base = tiny_model("bert-cross")
    path = tmp_path / declared
    if declared in ("Identity", "Tanh"):
        _saved_by_cross_encoder(base, path, declared)
    else:
        shutil.copytree(base, path)
        if declared == "config.json":  # sentence-transformers 4 and 5
            _edit_config(path, sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity",
                                                      "version": "5.1.0"})
        elif declared == "legacy":  # before sentence-transformers 4
            _edit_config(path, sbert_ce_default_activation_function="torch.nn.modules.activation.Tanh")
    expected = CrossEncoder(str(path), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    server = server_for(path)
    np.testing.assert_allclose(_rerank(server), expected, rtol=1e-4, atol=1e-5)
    # /v1/score keeps SGLang's meaning: apply_softmax is a sigmoid of a single logit, whatever the declaration.
    model, tok, _ = reference.load_model(path)
    score = server.score(query=QUERY, items=DOCUMENTS[:1], apply_softmax=True).json()["scores"][0]
    np.testing.assert_allclose(score, reference.classifier_scores(
        model, *reference.encode_pair(tok, QUERY, DOCUMENTS[0], False), apply_softmax=True), rtol=1e-4)


def test_identity_and_sigmoid_differ_as_in_the_issue(tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer], tmp_path: Path) -> None:
    """The same weights: relevance is the raw logit under Identity, its sigmoid by default."""
    sigmoid = np.array(_rerank(server_for(tiny_model("bert-cross"))))
    identity = np.array(_rerank(server_for(_saved_by_cross_encoder(tiny_model("bert-cross"), tmp_path / "id",
                                                                   "Identity"))))
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-identity)), rtol=1e-5)
    assert not np.allclose(sigmoid, identity, atol=1e-2)


def test_an_activation_the_engine_cannot_apply_is_refused(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    path = tmp_path / "custom"
    shutil.copytree(tiny_model("bert-cross"), path)
    _edit_config(path, sentence_transformers={"activation_fn": "my_package.Softplus2"})
    with pytest.raises(RuntimeError, match="failed to load") as failure:
        RunningServer(model=path)
    assert "sentence_transformers.activation_fn 'my_package.Softplus2'" in str(failure.value)


@pytest.fixture(scope="module")
def multi_label(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("multi-label") / "roberta-multi-label"
    shutil.copytree(tiny_model("roberta-cross"), path)
    _edit_config(path, problem_type="multi_label_classification")
    return path


def test_multi_label_classifiers_get_a_sigmoid_per_class(multi_label: Path,
                                                         server_for: Callable[..., RunningServer]) -> None:
    """transformers' text-classification pipeline on a multi_label_classification model: sigmoid per class. (Not
    with an empty document: the pipeline drops an empty text_pair, see reference.encode_pair.)"""
    from transformers import pipeline

    model, tok, _ = reference.load_model(multi_label)
    classify = pipeline("text-classification", model=model, tokenizer=tok, top_k=None, device="cpu")
    server = server_for(multi_label)
    documents = [d for d in DOCUMENTS if d]
    response = server.score(query=QUERY, items=documents, apply_softmax=True)
    assert response.status_code == 200, response.text
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    for document, row in zip(documents, response.json()["scores"], strict=True):
        by_label = {r["label"]: r["score"] for r in classify({"text": QUERY, "text_pair": document})}
        np.testing.assert_allclose(row, [by_label[label] for label in labels], rtol=1e-4, atol=1e-6)
    assert not np.allclose(np.sum(response.json()["scores"], axis=1), 1.0)  # not a softmax
    np.testing.assert_allclose(_rerank(server, documents), [row[-1] for row in response.json()["scores"]], rtol=1e-5)


def test_a_single_label_token_flag_is_refused(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-reranker")),
         "--label-tokens", "yes", "--port", str(free_port()), "--termination-log", str(tmp_path / "log")],
        capture_output=True, text=True, timeout=300)
    assert process.returncode == CONFIG_EXIT, process.stderr[-3000:]
    assert "--label-tokens" in process.stderr and "would make every /v1/rerank relevance 1.0" in process.stderr


def test_a_single_label_token_under_softmax_is_a_400(tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-causal"))
    for labels, where in [([7], "label_token_ids"), ([[7, 9], [7]], "label_token_ids[1]")]:
        response = server.score(query="q", items=["a", "b"], label_token_ids=labels, apply_softmax=True)
        assert response.status_code == 400, response.text
        assert response.json()["message"].startswith(f"{where}: a single label token under apply_softmax")
    # Without softmax one label is its true next-token probability, which is meaningful.
    model, tok, _ = reference.load_model(tiny_model("qwen3-causal"))
    response = server.score(query="q", items=["a"], label_token_ids=[7])
    assert response.status_code == 200
    expected = reference.causal_lm_scores(model, reference.encode_decoder(tok, "q", "a", False), [7], False)
    np.testing.assert_allclose(response.json()["scores"][0], expected, rtol=1e-4)
