"""A decision request (either wire format, mapped by api/) → one prompt per question, tokenized whole, and the
tokens of each option's answer.

Each question becomes the last user turn of the conversation: appended to the input's last user message (so chat
templates that require alternating roles accept it), or as a user message of its own after any other. The
conversation goes through the decision template (model/templates/decision_template.py: the model's chat template unless
`--decision-template` replaces it) with a generation prompt, thinking turned off (`enable_thinking=False`: Qwen3's
template then closes an empty think block), and the rendered text is tokenized whole without added specials, as
`tokenizer.apply_chat_template(..., tokenize=True)` does: exactly the input a plain transformers user would run. The
questions of a request share the part of their prompts that is the same tokens (planning/decision_plan.py).

An option's answer is its name (`yes`/`no`, a choice's value, a level's label) as the model would write it right
after the prompt: the name tokenized alone. The prompt lists every option by that name."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from jinja2 import TemplateError

from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.model.templates.decision_template import DecisionTemplate

QUESTION_SEPARATOR = "\n\n"  # between the input's last user message and the question appended to it


class QuestionKind(StrEnum):
    PREDICATE = "predicate"  # a statement: true or false (OpenAI)
    YES_NO = "yes_no"  # a question answered yes or no (System One's noul)
    CHOICE = "choice"
    SCORE = "score"  # options are levels, lowest first


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class Option:
    name: str  # the answer's text: what the model writes, and what the prompt lists
    description: str | None = None


@dataclass(frozen=True)
class DecisionQuestion:
    kind: QuestionKind
    instructions: str
    options: tuple[Option, ...]
    field: str  # names the question in messages: "questions[3]", "questions.urgency"


@dataclass(frozen=True)
class DecisionAsk:
    """One request of either wire format, as the model will read it."""

    messages: tuple[ChatMessage, ...]
    questions: tuple[DecisionQuestion, ...]


@dataclass(frozen=True)
class DecisionTokens:
    prompts: list[list[int]]  # per question: the whole prompt
    options: list[list[list[int]]]  # per question, per option: the answer's tokens


def json_text(value: Any) -> str:
    """A JSON value as the model reads it: text as is, anything else as compact JSON (keys in their order)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def options(described: Iterable[tuple[str, str | None]]) -> tuple[Option, ...]:
    """Options from (name, description) pairs, in their order."""
    return tuple(Option(name, description) for name, description in described)


def yes_no(yes: str | None = None, no: str | None = None) -> tuple[Option, ...]:
    """A predicate's or a noul's options, with what counts as yes and as no when the request says."""
    return Option("yes", yes), Option("no", no)


def question_text(question: DecisionQuestion) -> str:
    """The built-in wording of one question (what the last user turn ends with)."""
    if question.kind == QuestionKind.PREDICATE:
        lines = [f"Statement: {question.instructions}", "Is the statement true?"]
    else:
        lines = [f"Question: {question.instructions}"]
    lines.append("Options, from the lowest to the highest:" if question.kind == QuestionKind.SCORE else "Options:")
    lines += [f"- {o.name}: {o.description}" if o.description else f"- {o.name}" for o in question.options]
    lines.append("Answer with one of the options, exactly as written.")
    return "\n".join(lines)


def conversation(messages: tuple[ChatMessage, ...], text: str) -> list[dict[str, str]]:
    """The input's messages with the question as the last user turn."""
    turns = [{"role": m.role, "content": m.content} for m in messages]
    if turns and turns[-1]["role"] == "user":
        turns[-1] = {"role": "user", "content": turns[-1]["content"] + QUESTION_SEPARATOR + text}
    else:
        turns.append({"role": "user", "content": text})
    return turns


def _variables(question: DecisionQuestion, text: str) -> dict[str, Any]:
    """What a decision template may read besides `messages` (docs/decisions.md)."""
    return {"type": question.kind.value, "instructions": question.instructions, "text": text,
            "options": [{"name": o.name, "description": o.description} for o in question.options]}


def render(model: ScoringModel, template: DecisionTemplate, messages: tuple[ChatMessage, ...],
           question: DecisionQuestion) -> str:
    text = question_text(question)
    try:
        return model.tokenizer.apply_chat_template(  # type: ignore[no-any-return]
            conversation(messages, text), chat_template=template.source, add_generation_prompt=True, tokenize=False,
            enable_thinking=False, question=_variables(question, text))
    except (TemplateError, ValueError, TypeError, KeyError, IndexError) as error:
        raise Invalid("input", f"the decision template ({template.name}) cannot render this conversation: "
                         f"{type(error).__name__}: {error}") from None


def token_lists(model: ScoringModel, texts: list[str]) -> list[list[int]]:
    """Each text's tokens, without added specials."""
    return [list(ids) for ids in model.tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def input_tokens(model: ScoringModel, ask: DecisionAsk) -> int:
    """The input's own tokens (its messages' texts), before any prompt is rendered: a lower bound of every prompt."""
    return sum(len(ids) for ids in token_lists(model, [m.content for m in ask.messages]))


def option_tokens(model: ScoringModel, question: DecisionQuestion) -> list[list[int]]:
    """Each option's answer tokens; options the model could not tell apart are the request's 400."""
    tokens = token_lists(model, [option.name for option in question.options])
    seen: dict[tuple[int, ...], int] = {}
    for index, ids in enumerate(tokens):
        if not ids:
            raise Invalid(question.field, f"option {question.options[index].name!r} has no tokens in this "
                             "model's tokenizer")
        if tuple(ids) in seen:
            raise Invalid(question.field, f"options {seen[tuple(ids)]} and {index} "
                             f"({question.options[index].name!r}) are the same text to the model")
        seen[tuple(ids)] = index
    return tokens


def tokenize(model: ScoringModel, template: DecisionTemplate, ask: DecisionAsk,
             options: list[list[list[int]]]) -> DecisionTokens:
    """Every question's whole prompt, tokenized; `options`: each question's `option_tokens`."""
    prompts = token_lists(model, [render(model, template, ask.messages, question) for question in ask.questions])
    return DecisionTokens(prompts, options)
