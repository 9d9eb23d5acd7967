"""Independent reference for /v1/decisions and /v1/systemone: the documented prompt (docs/decisions.md) rendered with
the tokenizer's own `apply_chat_template`, and each option's answer scored as plain transformers would score a
continuation: the flat sequence `prompt + option`, batch 1, no server code; the sum of the option tokens'
log-softmax over the full vocabulary, then a softmax over the options (float64)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def question_text(kind: str, instructions: str, options: list[tuple[str, str | None]]) -> str:
    """The built-in wording of one question, as docs/decisions.md documents it."""
    if kind == "predicate":
        lines = [f"Statement: {instructions}", "Is the statement true?"]
    else:
        lines = [f"Question: {instructions}"]
    lines.append("Options, from the lowest to the highest:" if kind == "score" else "Options:")
    lines += [f"- {name}: {description}" if description else f"- {name}" for name, description in options]
    lines.append("Answer with one of the options, exactly as written.")
    return "\n".join(lines)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], text: str,
               chat_template: str | None = None) -> list[int]:
    """The question as the last user turn (appended to a last user message after a blank line), through the chat
    template with a generation prompt and thinking off."""
    turns = [dict(m) for m in messages]
    if turns and turns[-1]["role"] == "user":
        turns[-1]["content"] += "\n\n" + text
    else:
        turns.append({"role": "user", "content": text})
    rendered = tokenizer.apply_chat_template(turns, chat_template=chat_template, add_generation_prompt=True,
                                             tokenize=False, enable_thinking=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def option_probabilities(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: list[int],
                         names: list[str]) -> list[float]:
    import torch

    totals = []
    with torch.inference_mode():
        for name in names:
            option = list(tokenizer(name, add_special_tokens=False)["input_ids"])
            logits = model(input_ids=torch.tensor([prompt + option[:-1]])).logits[0, len(prompt) - 1:].double()
            totals.append(torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(option)[:, None]).sum())
    return torch.softmax(torch.stack(totals), dim=0).tolist()


def openai_question(question: dict[str, Any]) -> tuple[str, str, list[tuple[str, str | None]]]:
    """(kind, instructions, options) of an OpenAI decisions question with text instructions."""
    if question["type"] == "predicate":
        return "predicate", question["instructions"], [("yes", None), ("no", None)]
    if question["type"] == "choice":
        return "choice", question["instructions"], [
            (("true" if c["value"] else "false") if isinstance(c["value"], bool) else c["value"], c.get("description"))
            for c in question["choices"]]
    return "score", question["instructions"], [(level["label"], level.get("description"))
                                               for level in question["levels"]]
