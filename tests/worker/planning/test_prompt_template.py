"""LLM rerankers behind a prompt template (--prompt-template, --label-tokens): a tiny Qwen3 with Qwen's chat markup
(ChatML specials, <think>/</think>), served with the built-in qwen3-reranker template, scores exactly what
transformers gives for the fully rendered prompt, `tokenizer(prompt)`, single-item and multi-item, with and
without `instruct`; label tokens resolve once, and a label that is not one token stops the worker."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
from scorekeeper_worker.api.termination import EXIT_LOAD_FAILED
from scorekeeper_worker.model.templates.prompt_template import BUILTIN, TemplateError, load_template, parse_template
from serving import RunningServer, free_port

RERANKER = "qwen3-reranker"
QWEN3 = BUILTIN["qwen3-reranker"]
QUERY = "What is the capital of France?"
# Items that begin right after "<Document>: " without a space of their own: the whole prompt merges the seam
# (": The" → ":", " The"), separately tokenized pieces would not. One empty item, one that starts with a space.
ITEMS = ["The capital of France is Paris.", "", "the dog likes to run in the park.", " Berlin is a large city."]
INSTRUCTS = [None, "Given a question, find the passage that names the city"]
# A template of our own for a decoder classifier: no {instruct}, a tail after the item, a literal brace.
CUSTOM = "Question: {query}\nPassage: {item}\nIs the passage {relevant}? Answer:"


@pytest.fixture(scope="module")
def reranker(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> RunningServer:
    return server_for(tiny_model(RERANKER), prompt_template="qwen3-reranker", multi_item_scoring=True,
                      max_batch_tokens=256)  # several multi-item chunks for the longer requests


@pytest.fixture(scope="module")
def loaded(tiny_model: Callable[[str], Path]) -> tuple[Any, Any]:
    model, tok, _ = reference.load_model(tiny_model(RERANKER))
    return model, tok


def _yes_no(tok: Any) -> list[int]:
    return tok.convert_tokens_to_ids(["yes", "no"])


def _score(server: RunningServer, **body: Any) -> dict[str, Any]:
    response = server.score(**body)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_seams_of_the_template_are_tokenized_as_in_the_whole_prompt(loaded: tuple[Any, Any]) -> None:
    """What makes this file's comparisons meaningful: pieces tokenized apart differ from the whole prompt."""
    _, tok = loaded
    item = ITEMS[0]
    whole = tok(QWEN3.render(QUERY, item, None))["input_ids"]
    pieces = tok(QWEN3.prefix(QUERY, None))["input_ids"] + tok(item + QWEN3.tail)["input_ids"]
    assert whole != pieces
    assert "<think>" in tok.convert_ids_to_tokens(whole) and "<|im_start|>" in tok.convert_ids_to_tokens(whole)


@pytest.mark.parametrize("instruct", INSTRUCTS, ids=["default-instruct", "instruct"])
@pytest.mark.parametrize("multi_item", [False, True], ids=["single-item", "multi-item"])
@pytest.mark.parametrize("apply_softmax", [True, False], ids=["softmax", "probabilities"])
def test_scores_equal_transformers_on_the_rendered_prompt(reranker: RunningServer, loaded: tuple[Any, Any],
                                                          instruct: str | None, multi_item: bool,
                                                          apply_softmax: bool) -> None:
    model, tok = loaded
    items = ITEMS * 6  # 24 items: over one 256-token chunk under multi-item scoring
    body: dict[str, Any] = {"query": QUERY, "items": items, "apply_softmax": apply_softmax,
                            "multi_item_scoring": multi_item}
    if instruct is not None:
        body["instruct"] = instruct
    got = _score(reranker, **body)  # no label_token_ids: the template's "yes", "no"
    prompts = [tok(QWEN3.render(QUERY, item, instruct))["input_ids"] for item in items]
    expected = [reference.causal_lm_scores(model, ids, _yes_no(tok), apply_softmax) for ids in prompts]
    np.testing.assert_allclose(got["scores"], expected, rtol=1e-4, atol=1e-6)
    if not multi_item:
        assert got["usage"]["prompt_tokens"] == sum(len(ids) for ids in prompts)
    else:  # the shared prefix once per chunk
        assert got["usage"]["prompt_tokens"] < sum(len(ids) for ids in prompts)


def test_explicit_labels_override_the_default(reranker: RunningServer, loaded: tuple[Any, Any]) -> None:
    model, tok = loaded
    labels = tok.convert_tokens_to_ids(["no", "yes", "<|im_end|>"])
    got = _score(reranker, query=QUERY, items=ITEMS[:2], label_token_ids=labels, apply_softmax=True)
    expected = [reference.causal_lm_scores(model, tok(QWEN3.render(QUERY, item, None))["input_ids"], labels, True)
                for item in ITEMS[:2]]
    np.testing.assert_allclose(got["scores"], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_rerank_on_a_causal_lm_is_the_probability_of_the_first_label(reranker: RunningServer,
                                                                     loaded: tuple[Any, Any], path: str) -> None:
    model, tok = loaded
    documents = [*ITEMS[:3], {"text": ITEMS[3], "id": "berlin"}]
    response = httpx.post(reranker.url + path, json={"query": QUERY, "documents": documents,
                                                     "instruct": INSTRUCTS[1]}, timeout=60)
    assert response.status_code == 200, response.text
    expected = [reference.causal_lm_scores(model, tok(QWEN3.render(QUERY, item, INSTRUCTS[1]))["input_ids"],
                                           _yes_no(tok), True)[0] for item in ITEMS]
    results = response.json()["results"]
    assert [r["index"] for r in results] == sorted(range(4), key=lambda i: -expected[i])
    np.testing.assert_allclose([r["relevance_score"] for r in results], sorted(expected, reverse=True), rtol=1e-4)
    assert [r.get("id") for r in results if r["index"] == 3] == ["berlin"]


def test_token_ids_are_verbatim_under_a_template(reranker: RunningServer, loaded: tuple[Any, Any]) -> None:
    model, tok = loaded
    query, item = tok(QUERY)["input_ids"], tok(ITEMS[0])["input_ids"]
    got = _score(reranker, query=query, items=[item])
    np.testing.assert_allclose(got["scores"], [reference.causal_lm_scores(model, query + item, _yes_no(tok), False)],
                               rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize(("body", "message"), [
    ({"query": QUERY, "items": ["a"], "item_first": True}, "item_first: this server's prompt template"),
    ({"query": [5], "items": [[6]], "instruct": "x"}, "instruct: token-id inputs are used verbatim"),
])
def test_requests_the_template_cannot_serve_are_refused(reranker: RunningServer, body: dict[str, Any],
                                                        message: str) -> None:
    response = reranker.score(**body)
    assert response.status_code == 400 and response.json()["message"].startswith(message), response.text


def test_instruct_needs_a_template_that_has_it(tiny_model: Callable[[str], Path],
                                               server_for: Callable[..., RunningServer], tmp_path_factory:
                                               pytest.TempPathFactory) -> None:
    plain = server_for(tiny_model("qwen3-causal"))
    response = plain.score(query="q", items=["a"], label_token_ids=[1], instruct="x")
    assert response.status_code == 400 and response.json()["message"].startswith("instruct: this server has no")
    template = tmp_path_factory.mktemp("template") / "custom.txt"
    template.write_text(CUSTOM)
    custom = server_for(tiny_model("qwen3-cls3"), prompt_template=str(template))
    response = custom.score(query="q", items=["a"], instruct="x")
    assert response.status_code == 400 and "has no {instruct}" in response.json()["message"]


@pytest.mark.parametrize("multi_item", [False, True], ids=["single-item", "multi-item"])
def test_a_decoder_classifier_behind_a_template_file(tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer],
                                                     tmp_path_factory: pytest.TempPathFactory,
                                                     multi_item: bool) -> None:
    """Converted rerankers (Qwen3-Reranker as a sequence classifier) need their prompt too."""
    template = tmp_path_factory.mktemp("template") / "custom.txt"
    template.write_text(CUSTOM)
    path = tiny_model("qwen3-cls3")
    server = server_for(path, prompt_template=str(template), multi_item_scoring=True)
    model, tok, _ = reference.load_model(path)
    got = _score(server, query=QUERY, items=ITEMS, multi_item_scoring=multi_item)
    rendered = [CUSTOM.replace("{query}", QUERY).replace("{item}", item) for item in ITEMS]
    assert "{relevant}" in rendered[0]  # an unknown brace is literal text
    expected = [reference.classifier_scores(model, tok(text)["input_ids"], None, False) for text in rendered]
    np.testing.assert_allclose(got["scores"], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("name", "flags", "expected"), [
    ("bert-cross", {"prompt_template": "qwen3-reranker"}, "a prompt template wraps (query, item) pairs for decoder"),
    ("qwen3-cls3", {"label_tokens": ("yes", "no")}, "--label-tokens: label tokens are read from a causal LM"),
    # The built-in template's labels on a vocabulary where "yes" is two tokens
    ("qwen3-causal", {"prompt_template": "qwen3-reranker"}, "the qwen3-reranker template's label tokens"),
])
def test_a_prompt_that_cannot_apply_stops_the_worker(tiny_model: Callable[[str], Path], name: str,
                                                     flags: dict[str, Any], expected: str) -> None:
    with pytest.raises(RuntimeError, match="failed to load") as failure:
        RunningServer(model=tiny_model(name), **flags)
    assert expected in str(failure.value)


def test_a_label_of_two_tokens_stops_the_cli_with_its_tokenization(tiny_model: Callable[[str], Path],
                                                                   loaded: tuple[Any, Any], tmp_path: Path) -> None:
    _, tok = loaded
    label = "maybe"
    tokens = tok(label, add_special_tokens=False)["input_ids"]
    assert len(tokens) > 1
    termination = tmp_path / "termination-log"
    process = subprocess.run(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model(RERANKER)),
         "--label-tokens", f"yes,{label}", "--port", str(free_port()), "--termination-log", str(termination),
         "--log-level", "warning"], capture_output=True, text=True, timeout=300)
    assert process.returncode == EXIT_LOAD_FAILED, process.stderr[-3000:]
    message = termination.read_text()
    assert f"--label-tokens: '{label}' is {len(tokens)} tokens in this model's tokenizer ({tokens} = " in message
    assert str(tok.convert_ids_to_tokens(tokens)) in message and "exactly one token" in process.stderr


def test_a_template_file_that_cannot_be_used_stops_the_cli_before_loading(tmp_path: Path) -> None:
    broken = tmp_path / "broken.txt"
    broken.write_text("{item} comes before {query}")
    for template, expected in [(broken, "must come before {item}"), (tmp_path / "missing.txt", "neither a built-in")]:
        process = subprocess.run([sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", "/nonexistent",
                                  "--prompt-template", str(template)], capture_output=True, text=True, timeout=120)
        assert process.returncode == 2 and expected in process.stderr, process.stderr


@pytest.mark.parametrize(("text", "problem"), [
    ("{query} only", "exactly once"), ("{query}{item}{item}", "exactly once"),
    ("{instruct}{instruct}{query}{item}", "at most once"), ("{item}{query}", "must come before"),
    ("{query}{item}{instruct}", "must come before"),
])
def test_template_rules(text: str, problem: str) -> None:
    with pytest.raises(TemplateError, match=problem):
        parse_template(text, "t")


def test_values_are_never_parsed_as_placeholders() -> None:
    template = parse_template("<{instruct}|{query}|{item}>", "t", default_instruct="d")
    assert template.render("{item}", "{query}", None) == "<d|{item}|{query}>"
    assert template.prefix("q", "") == "<|q|" and template.tail == ">"
    assert load_template("qwen3-reranker") is QWEN3 and QWEN3.label_tokens == ("yes", "no")
    assert QWEN3.render("Q", "D", "I").endswith("<Instruct>: I\n<Query>: Q\n<Document>: D<|im_end|>\n"
                                                "<|im_start|>assistant\n<think>\n\n</think>\n\n")
