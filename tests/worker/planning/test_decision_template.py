"""The decision template: `--decision-template FILE` replaces the model's chat template (and may phrase the question
itself from `question`); a tokenizer without a chat template gets the documented plain one; a template that refuses a
conversation is that request's 400; a file that cannot be a template stops the CLI (exit 2); and the start-up
self-check covers the decision path: a broken option readout keeps the worker from becoming ready."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import decision_reference
import httpx
import pytest
import reference
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner import forward
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.loader import load_model
from scorekeeper_worker.model.templates.decision_template import PLAIN_TEMPLATE, resolve_decision_template
from scorekeeper_worker.serving.startup import decision_selfcheck
from scorekeeper_worker.serving.startup.selfcheck import SelfCheckFailed
from serving import RunningServer

QUESTIONS = [{"type": "predicate", "instructions": "The sky is blue."},
             {"type": "choice", "instructions": "Which city?", "choices": [{"value": "Paris"}, {"value": "Berlin"},
                                                                          {"value": "Los Angeles"}]}]
OWN_WORDING = ("{% for m in messages[:-1] %}{{ m.role }}> {{ m.content }}\n{% endfor %}"
               "TASK ({{ question.type }}): {{ question.instructions }}\n"
               "{% for o in question.options %}* {{ o.name }}\n{% endfor %}ANSWER:\n")


def _probabilities(answers: list[dict[str, object]]) -> list[list[float]]:
    return [[a["probability"]] if a["type"] == "predicate" else [p["probability"] for p in a["probabilities"]]
            for a in answers]  # type: ignore[index, union-attr]


def _expected(path: Path, messages: list[dict[str, str]], rendered: Callable[[dict[str, object]], list[int]]
              ) -> list[list[float]]:
    model, tok, _ = reference.load_model(path)
    out = []
    for question in QUESTIONS:
        kind, _, options = decision_reference.openai_question(question)
        probabilities = decision_reference.option_probabilities(model, tok, rendered(question),
                                                                [name for name, _ in options])
        out.append(probabilities[:1] if kind == "predicate" else probabilities)
    return out


def _decide(server: RunningServer, messages: list[dict[str, str]]) -> list[list[float]]:
    response = httpx.post(server.url + "/v1/decisions", json={"model": "m", "input": messages,
                                                              "questions": QUESTIONS}, timeout=120)
    assert response.status_code == 200, response.text
    return _probabilities(response.json()["answers"])


def _close(got: list[list[float]], expected: list[list[float]]) -> None:
    for a, b in zip(got, expected, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= 1e-4, (a, b)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "I live in Paris."}]


def test_a_template_file_replaces_the_chat_template(tiny_model: Callable[[str], Path], tmp_path: Path,
                                                    server_for: Callable[..., RunningServer]) -> None:
    """A file in the chat-template language that writes its own question from `question`: the prompt is exactly that
    file's rendering (multi-item or not)."""
    template = tmp_path / "decision.jinja"
    template.write_text(OWN_WORDING)
    path = tiny_model("qwen3-causal")
    tok = reference.load_model(path)[1]

    def rendered(question: dict[str, object]) -> list[int]:
        kind, instructions, options = decision_reference.openai_question(question)
        text = f"system> Be brief.\nTASK ({kind}): {instructions}\n" + "".join(f"* {n}\n" for n, _ in options)
        return list(tok(text + "ANSWER:", add_special_tokens=False)["input_ids"])  # Jinja drops a final newline

    expected = _expected(path, MESSAGES, rendered)
    for multi_item in (True, False):
        _close(_decide(server_for(path, decision_template=template, multi_item_scoring=multi_item), MESSAGES), expected)
    _close(_decide(server_for(path), MESSAGES), _expected(path, MESSAGES, lambda q: decision_reference.prompt_ids(
        tok, MESSAGES, decision_reference.question_text(*decision_reference.openai_question(q)))))  # the built-in


def test_a_tokenizer_without_chat_template_gets_the_plain_one(tiny_model: Callable[[str], Path], tmp_path: Path,
                                                              server_for: Callable[..., RunningServer]) -> None:
    path = tmp_path / "no-chat-template"
    shutil.copytree(tiny_model("llama-causal"), path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    tok = reference.load_model(path)[1]
    assert not tok.chat_template
    assert resolve_decision_template(tok, None).source == PLAIN_TEMPLATE
    expected = _expected(path, MESSAGES, lambda q: decision_reference.prompt_ids(
        tok, MESSAGES, decision_reference.question_text(*decision_reference.openai_question(q)), PLAIN_TEMPLATE))
    _close(_decide(server_for(path, multi_item_scoring=True), MESSAGES), expected)


def test_a_template_that_refuses_the_conversation_is_a_400(tiny_model: Callable[[str], Path], tmp_path: Path,
                                                           server_for: Callable[..., RunningServer]) -> None:
    template = tmp_path / "strict.jinja"
    template.write_text("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
                        "{% endif %}{{ messages[-1].content }}\n")
    server = server_for(tiny_model("qwen3-causal"), decision_template=template)
    response = httpx.post(server.url + "/v1/decisions", json={"model": "m", "input": MESSAGES, "questions": QUESTIONS},
                          timeout=60)
    assert response.status_code == 400, response.text
    assert "input: the decision template" in response.json()["message"]
    assert "System role not supported" in response.json()["message"]


@pytest.mark.parametrize(("text", "named"), [(None, "not a readable UTF-8 file"),
                                             ("{% for m in messages %}", "not a valid Jinja template")])
def test_unusable_template_files_stop_the_cli(text: str | None, named: str, tmp_path: Path) -> None:
    path = tmp_path / "decision.jinja"
    if text is not None:
        path.write_text(text)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SCOREKEEPER_")}
    result = subprocess.run([sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", "/m",
                             "--decision-template", str(path)], capture_output=True, text=True, env=environ,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"scorekeeper-worker: error: --decision-template {path}: {named}"), result.stderr


def test_a_template_for_another_model_kind_stops_the_worker(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    template = tmp_path / "decision.jinja"
    template.write_text(OWN_WORDING)
    with pytest.raises(RuntimeError, match="--decision-template: decisions are read from a causal LM"):
        RunningServer(model=tiny_model("qwen3-cls3"), decision_template=template)


def test_self_check_catches_a_broken_option_readout(tiny_model: Callable[[str], Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(tiny_model("mistral-causal"), DType.FLOAT32, "cpu", "t")
    executor = Executor(model)
    template = resolve_decision_template(model.tokenizer, None)
    assert decision_selfcheck.run(model, executor, template, multi_item=True) < 1e-5
    # An option's later tokens read at the wrong row: only the multi-token options move.
    original = forward.token_log_probs
    monkeypatch.setattr(forward, "token_log_probs", lambda m, rows, targets: original(m, rows.flip(0), targets))
    with pytest.raises(SelfCheckFailed, match=r"decision answers deviate from plain transformers by \d"):
        decision_selfcheck.run(model, executor, template, multi_item=True)
    with pytest.raises(RuntimeError, match="decision answers deviate"):  # and the worker never becomes ready
        RunningServer(model=tiny_model("mistral-causal"), multi_item_scoring=True)
