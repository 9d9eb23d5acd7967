"""Schemathesis hooks for fuzzing the worker (tests/fuzz/schemathesis.toml loads them).

A schema-valid body may still be refused for a reason that depends on the model being served, which the OpenAPI
document does not state: sequences beyond its maximum length, the label tokens only a causal LM reads, the prompt
template the server was started with. (What it does state, as loaded: the routes the model serves, the queries and
items that would make a sequence of no tokens, token ids bounded by its vocabulary and label tokens by its output
rows, and `instruct` only where a prompt template has one to fill.) The
config lets the scoring routes answer such bodies with 400; this check makes sure that every such 400 is one of those
reasons, so any other refusal of a valid body (a schema that says less than the validation does) still fails the run.
"""

from __future__ import annotations

import re

import schemathesis

MODEL_DEPENDENT = re.compile("|".join([
    r"exceeds the model's maximum of \d+",  # its maximum sequence length
    r"label_token_ids: required for causal LM models",  # a causal LM scores label tokens, which others ignore
    r"label_token_ids: (must not (be empty|contain duplicates)|\d+ lists for \d+ items)",
    r"a single label token under apply_softmax",  # a causal LM's softmax over one label (others ignore labels)
    r"not supported for causal LM models",
    r"/v1/rerank on a causal LM needs label tokens",  # the server was started without --label-tokens
    r"dimensions: this model's embeddings have \d+ dimensions",
    r"the (query|model's prompt) leaves no room for a window",  # its maximum sequence length (and prompt), again
    r"^item_first: this server's prompt template",
    r"images are not supported: the served model reads text only",  # a text model (OpenAI's schema has images)
    r"has no tokens in this model's tokenizer|are the same text to the model",  # its tokenizer
    r"^input: the decision template \(.*\) cannot render this conversation",  # its chat template (roles it refuses)
    # Unique choice values and level labels: JSON Schema's uniqueItems compares whole objects, not one of their fields.
    r"repeats \[\d+\]\.(value|label); each (choice|level) must be unique",
]))


@schemathesis.check
def refusals_of_valid_bodies_depend_on_the_model(ctx: schemathesis.CheckContext, response: schemathesis.Response,
                                                 case: schemathesis.Case) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    message = str(response.json().get("message", ""))
    if not MODEL_DEPENDENT.search(message):
        raise AssertionError(f"a schema-valid body was refused for a reason the schema could state: {message}")
    return None
