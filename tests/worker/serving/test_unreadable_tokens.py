"""A tokenizer that produces ids past the model's embedding rows (a token added without resize_token_embeddings):
the worker serves the checkpoint, and every request whose text, prompt, decision input or option reaches such an id
gets a 400 naming the field and the token (planning/readable_ids.py); every other request, concurrent with those,
gets its 200 with the numbers transformers gives (issue 35). A special token every request carries past the rows is
refused at start-up (model/vocabulary.py). With the check taken away, the real IndexError of the forward fails that
request alone (engine/queue/isolation.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import decision_reference
import httpx
import numpy as np
import pytest
import reference
import tiny_models
from scorekeeper_worker.model.templates.special_tokens import SpecialTokens
from scorekeeper_worker.model.vocabulary import Vocabulary, check_specials
from serving import BatchGate, RunningServer, wait_until

EXTRA = "<extra_tok>"
LABELS = [10, 20, 30]
TEXTS = ["alpha beta", "the quick brown fox", "gamma", "jumps over the lazy dog", "delta epsilon zeta", "eta"]
RTOL, ATOL = 1e-4, 1e-6
QUESTION = {"type": "choice", "instructions": "Pick one.", "choices": [{"value": "red"}, {"value": "blue green"}]}


@pytest.fixture(scope="module")
def unembedded(tiny_dir: Path) -> Iterator[tuple[RunningServer, Any, Any]]:
    path = tiny_models.unembedded("qwen3-causal", tiny_dir)
    server = RunningServer(model=path, max_batch_tokens=4096, max_queue_tokens=1 << 20)
    model, tok, _ = reference.load_model(path)
    assert len(tok) == model.get_input_embeddings().num_embeddings + 1  # 301 ids, 300 rows
    yield server, model, tok
    server.stop()


def _score(server: RunningServer, query: str, items: list[str]) -> httpx.Response:
    return server.score(query=query, items=items, label_token_ids=LABELS)


def _decide(server: RunningServer, text: str, question: dict[str, Any] = QUESTION) -> httpx.Response:
    return httpx.post(server.url + "/v1/decisions", json={"model": "m", "input": text, "questions": [question]},
                      timeout=120)


def _refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert message.startswith(f"{field}:") and EXTRA in message and "id 300" in message, message


def test_each_field_that_holds_the_token_is_named(unembedded: tuple[RunningServer, Any, Any]) -> None:
    server, _, _ = unembedded
    assert httpx.get(server.url + "/ready", timeout=30).status_code == 200  # served: the 400 path
    _refused(_score(server, f"hi {EXTRA}", ["a", "b"]), "query")
    _refused(_score(server, "hi", ["a", f"b {EXTRA} c"]), "items[1]")
    _refused(_decide(server, f"the input {EXTRA}"), "input")
    choice = {"type": "choice", "instructions": "Pick.", "choices": [{"value": "red"}, {"value": EXTRA}]}
    _refused(_decide(server, "x", choice), "questions[0]: option '<extra_tok>'")
    predicate = {"type": "predicate", "instructions": f"It says {EXTRA}."}
    _refused(_decide(server, "x", predicate), "questions[0]")
    # Token ids past the rows, sent as ids: refused as they are read (as before issue 35).
    assert server.score(query=[300], items=[[5]], label_token_ids=LABELS).status_code == 400


def test_mixed_with_bad_clients_every_other_request_is_exact(unembedded: tuple[RunningServer, Any, Any]) -> None:
    """200 requests from 32 concurrent clients, every 7th holding the token: 29 get a 400, the 171 others a 200
    equal to transformers (scores, and decisions against tests/support/decision_reference.py)."""
    server, model, tok = unembedded
    prompt = {t: decision_reference.prompt_ids(tok, [{"role": "user", "content": t}], decision_reference.question_text(
        "choice", "Pick one.", [("red", None), ("blue green", None)])) for t in TEXTS}
    expected_decision = {t: decision_reference.option_probabilities(model, tok, p, ["red", "blue green"])
                         for t, p in prompt.items()}

    def request(i: int) -> tuple[int, httpx.Response]:
        text = TEXTS[i % len(TEXTS)]
        if i % 7 == 3:
            return i, _score(server, text, [f"{text} {EXTRA}"]) if i % 2 else _decide(server, f"{EXTRA} {text}")
        return i, _decide(server, text) if i % 5 == 0 else _score(server, text, [TEXTS[(i + 1) % 6], "omega"])

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(request, range(200)))
    bad = [i for i, _ in results if i % 7 == 3]
    assert len(bad) == 29
    for i, response in results:
        text = TEXTS[i % len(TEXTS)]
        if i % 7 == 3:
            assert response.status_code == 400 and EXTRA in response.json()["message"], response.text
        elif i % 5 == 0:
            assert response.status_code == 200, response.text
            got = [p["probability"] for p in response.json()["answers"][0]["probabilities"]]
            np.testing.assert_allclose(got, expected_decision[text], rtol=0, atol=1e-4)
        else:
            assert response.status_code == 200, response.text
            expected = reference.expected_scores(model, tok, "causal_lm", text, [TEXTS[(i + 1) % 6], "omega"],
                                                 labels=LABELS)
            np.testing.assert_allclose(response.json()["scores"], expected, rtol=RTOL, atol=ATOL)


def test_without_the_check_the_forward_error_fails_that_request_alone(tiny_dir: Path) -> None:
    """The defect as it was: the id reaches the embedding (IndexError). Isolation alone keeps the co-batched
    requests exact: 1 error, the others' results."""
    path = tiny_models.unembedded("qwen3-causal", tiny_dir)
    server = RunningServer(model=path, max_batch_tokens=4096, max_queue_tokens=1 << 20)
    try:
        model = server.app.state.service.model
        object.__setattr__(model, "vocabulary", None)  # as before issue 35: nothing compares ids with the rows
        good = [_score(server, t, ["x", "y"]).json()["scores"] for t in TEXTS]
        with ThreadPoolExecutor(16) as pool, BatchGate(server.scheduler, hold=True) as gate:
            primer = pool.submit(_score, server, "primer", ["x"])
            gate.wait_held()
            futures = [pool.submit(_score, server, t, ["x", "y"]) for t in TEXTS[:3]]
            futures.append(pool.submit(_score, server, f"hi {EXTRA}", ["x"]))
            futures += [pool.submit(_score, server, t, ["x", "y"]) for t in TEXTS[3:]]
            wait_until("8 requests queued", lambda: server.scheduler.open_requests == 8)
            gate.release()
            responses = [future.result() for future in futures]
            assert primer.result().status_code == 200
        assert len(gate.batches) == 2 and len({id(job) for job, _ in gate.batches[1]}) == 7
        assert responses[3].status_code == 500 and "IndexError" in responses[3].json()["message"]
        others = responses[:3] + responses[4:]
        assert [r.status_code for r in others] == [200] * 6
        for response, expected in zip(others, good, strict=True):
            np.testing.assert_allclose(response.json()["scores"], expected, rtol=RTOL, atol=ATOL)
    finally:
        server.stop()


def test_a_special_token_past_the_rows_refuses_the_model() -> None:
    vocab = Vocabulary(input_rows=300, tokenizer_ids=301, unreadable={300: "<bos>"})
    check_specials(vocab, SpecialTokens(prefix=[1], suffix=[]), None)  # fine
    with pytest.raises(ValueError, match=r"special token '<bos>' \(id 300\) is past the model's 300 embedding rows"):
        check_specials(vocab, SpecialTokens(prefix=[300], suffix=[]), None)


def test_a_complete_vocabulary_checks_nothing(tiny_model: Callable[[str], Path]) -> None:
    from scorekeeper_worker.model.vocabulary import vocabulary
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model("qwen3-causal"))
    vocab = vocabulary(tok, len(tok))
    assert vocab.complete and not vocab.unreadable
