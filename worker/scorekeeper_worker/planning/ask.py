"""What planning reads of a scoring request: its own type, never a wire model. The HTTP routes map /v1/score,
/v1/rerank and /v1/embeddings bodies onto it (api/wire/); start-up probes, benchmarks and tests build it directly."""

from __future__ import annotations

from dataclasses import dataclass, field

from scorekeeper_worker.planning.encoding import LengthRules


@dataclass(frozen=True)
class ScoreAsk:
    """One validated scoring request: a query and its items, all text or all token ids."""

    query: str | list[int]
    items: list[str] | list[list[int]]
    label_token_ids: list[int] | list[list[int]] | None = None  # causal LMs: one list, or one list per item
    apply_softmax: bool = False
    temperature: float = 1.0
    item_first: bool = False
    return_pooled_hidden_states: bool = False
    multi_item_scoring: bool | None = None  # None: the server's setting
    instruct: str | None = None  # fills the prompt template's {instruct}
    rules: LengthRules = field(default_factory=LengthRules)  # long inputs, and the field that names the items
    prompt_name: str | None = None  # embedding models: the sentence-transformers prompt instead of the default one
    embed: bool = False  # the items' embeddings alone, as pooled rows (/v1/embeddings): no query row
    model_name: str = "default"  # echoed in the response, so it counts in the response's size

    @property
    def text(self) -> bool:
        return isinstance(self.query, str)
