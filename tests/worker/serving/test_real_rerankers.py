"""Real weights (installed offline): SmolLM2-135M-Instruct as an LLM reranker behind a prompt template of our own,
against transformers on the fully rendered prompt; all-MiniLM-L6-v2 through /v1/embeddings against
sentence-transformers' `encode`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
from scorekeeper_worker.model import files as model_files
from serving import RunningServer

pytestmark = pytest.mark.slow

# Our own reranker prompt for SmolLM2's chat markup: an instruction in the system turn, the answer read as the
# first assistant token ("Yes" / "No", one token each in its vocabulary).
SMOLLM2_TEMPLATE = ("<|im_start|>system\nYou judge search results. {instruct}<|im_end|>\n<|im_start|>user\n"
                    "Query: {query}\nDocument: {item}\nIs the document relevant to the query? Answer Yes or No."
                    "<|im_end|>\n<|im_start|>assistant\n")
QUERY = "What is the capital of France?"
DOCUMENTS = ["The capital of France is Paris.", "Berlin is the capital of Germany.", "",
             "Bananas are yellow and sweet; my dog likes to run in the park.", " Paris, France"]


@pytest.fixture(scope="module")
def smollm2(smollm2_converted: Path, server_for: Callable[..., RunningServer],
            tmp_path_factory: pytest.TempPathFactory) -> tuple[RunningServer, Any, Any]:
    template = tmp_path_factory.mktemp("template") / "smollm2-reranker.txt"
    template.write_text(SMOLLM2_TEMPLATE)
    server = server_for(smollm2_converted, prompt_template=str(template), label_tokens=("Yes", "No"),
                        multi_item_scoring=True)
    model, tok, _ = reference.load_model(smollm2_converted)
    return server, model, tok


@pytest.mark.parametrize("instruct", [None, "Only an answer that names the city counts."],
                         ids=["no-instruct", "instruct"])
@pytest.mark.parametrize("multi_item", [False, True], ids=["single-item", "multi-item"])
def test_smollm2_template_scores_equal_transformers_on_the_rendered_prompt(
        smollm2: tuple[RunningServer, Any, Any], instruct: str | None, multi_item: bool) -> None:
    server, model, tok = smollm2
    body: dict[str, Any] = {"query": QUERY, "items": DOCUMENTS, "apply_softmax": True,
                            "multi_item_scoring": multi_item}
    if instruct is not None:
        body["instruct"] = instruct
    response = server.score(**body)
    assert response.status_code == 200, response.text
    labels = tok.convert_tokens_to_ids(["Yes", "No"])
    prompts = [SMOLLM2_TEMPLATE.replace("{instruct}", instruct or "").replace("{query}", QUERY).replace("{item}", d)
               for d in DOCUMENTS]
    expected = [reference.causal_lm_scores(model, tok(p)["input_ids"], labels, True) for p in prompts]
    np.testing.assert_allclose(response.json()["scores"], expected, rtol=1e-4, atol=1e-6)
    ranked = httpx.post(server.url + "/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS[:2],
                                                         **({"instruct": instruct} if instruct else {})}, timeout=120)
    assert [r["index"] for r in ranked.json()["results"]] == sorted([0, 1], key=lambda i: -expected[i][0])


@pytest.fixture(scope="module")
def minilm(server_for: Callable[..., RunningServer]) -> RunningServer:
    return server_for(model_files.minilm_path())


def test_minilm_embeddings_equal_sentence_transformers(minilm: RunningServer) -> None:
    from sentence_transformers import SentenceTransformer

    texts = ["What is the capital of California?", "Sacramento is the capital of California.", "",
             "Ünïcödé, émojis 🙂 and ümlauts: straße, naïve, café.", " ".join(["a long document"] * 120)]
    encoder = SentenceTransformer(str(model_files.minilm_path()), device="cpu")
    expected = encoder.encode(texts, convert_to_numpy=True)  # truncated at max_seq_length (256), unit length
    response = httpx.post(minilm.url + "/v1/embeddings", json={"input": texts, "model": "all-MiniLM-L6-v2",
                                                               "truncate": True}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    got = np.array([row["embedding"] for row in body["data"]])
    assert got.shape == expected.shape == (5, 384)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert body["usage"]["prompt_tokens"] == sum(min(256, len(encoder.tokenizer(t)["input_ids"])) for t in texts)
    assert httpx.get(minilm.url + "/v1/models", timeout=10).json()["data"][0]["max_positions"] == 256
