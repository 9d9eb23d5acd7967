"""The decision template (/v1/decisions, /v1/systemone): the Jinja template that turns a conversation ending in one
question into the prompt the model answers. Built in: the model's own chat template (`tokenizer.chat_template`), or,
for a tokenizer without one, `PLAIN_TEMPLATE`. `--decision-template FILE` replaces it: a template in the chat-template
language (the variables are listed in docs/decisions.md), so a model's chat template file is itself a valid one.

How a request becomes prompts, and which tokens answer: planning/decision_prompts.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI checks the template file before anything heavy is imported
    from transformers import PreTrainedTokenizerBase

# For tokenizers without a chat template (base models): each message on its own, then the answer on a new line.
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:\n{% endif %}"
)


class DecisionTemplateError(ValueError):
    """A --decision-template that cannot be used; the message names the flag."""


@dataclass(frozen=True)
class DecisionTemplate:
    name: str  # "the model's chat template", "the plain template", or the file's path
    source: str | None  # Jinja text; None: the tokenizer's own chat template


def load_decision_template(path: Path) -> DecisionTemplate:
    """A UTF-8 Jinja file, checked for syntax (a template that fails on a request's content is that request's 400)."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        source = path.read_text(encoding="utf-8")
        ImmutableSandboxedEnvironment().parse(source)
    except (OSError, UnicodeDecodeError) as error:
        raise DecisionTemplateError(f"--decision-template {path}: not a readable UTF-8 file "
                                    f"({type(error).__name__}: {error})") from None
    except TemplateSyntaxError as error:
        raise DecisionTemplateError(f"--decision-template {path}: not a valid Jinja template (line {error.lineno}: "
                                    f"{error.message})") from None
    return DecisionTemplate(str(path), source)


def resolve_decision_template(tokenizer: PreTrainedTokenizerBase, path: Path | None) -> DecisionTemplate:
    """The file when given, else the model's chat template, else the plain one."""
    if path is not None:
        return load_decision_template(path)
    if tokenizer.chat_template:
        return DecisionTemplate("the model's chat template", None)
    return DecisionTemplate("the plain template (the tokenizer has no chat template)", PLAIN_TEMPLATE)
