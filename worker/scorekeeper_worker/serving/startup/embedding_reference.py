"""The self-check's reference for embedding models: `SentenceTransformer.encode` re-done with plain transformers, from
a second, independent reading of the model directory's sentence-transformers files (not
model/sentence_transformers.py, whose reading it checks; sentence-transformers itself is not a dependency of the
worker image and would load the weights a second time).

encode: the prompt (a request's, else `default_prompt_name`) prepended to the text, lower-cased with
`do_lower_case`, `tokenizer(..., truncation=True, max_length=max_seq_length)`, the model's own forward alone, the
pooling of 1_Pooling/config.json (prompt tokens left out with `include_prompt: false`), Normalize, `truncate_dim`;
scores by `similarity_fn_name`. tests/worker/serving/startup/test_self_check_embeddings.py holds it equal to
sentence-transformers on every configuration variant. The self-check also runs text probes (every prompt, a text
over max_seq_length) through the engine and this reference (`engine_rows`, `reference_rows`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.planning.encoding import LengthRules
from scorekeeper_worker.planning.planner import ScoreAsk
from scorekeeper_worker.serving.direct import score_now, scored

PROBE_QUERY = "What is the capital of France?"
PROBE_ITEMS = ("Paris is the capital of France.", "", "My Dog likes to run in the Park.")
_LONG_SENTENCE = "The dog likes to run in the park, and the server scores every item of the batch. "
LONG_PROBE_LIMIT = 1024  # a text past max_seq_length is probed when the model's maximum is at most this long
_LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else {}


class ReferenceEncoder:
    """One model directory read the way sentence-transformers reads it, encoding with the given transformers model
    (its trunk: last_hidden_state). `default_pooling` applies without modules.json (the support matrix's default)."""

    def __init__(self, path: Path, model: torch.nn.Module, default_pooling: str = "mean") -> None:
        self.model = model
        self.tokenizer = AutoTokenizer.from_pretrained(path)  # its own: the engine's may carry a Lowercase step
        modules = {m["type"].rsplit(".", 1)[-1]: path / m["path"] for m in _json(path / "modules.json") or []}
        pipeline = _json(path / "config_sentence_transformers.json") if modules else {}
        pooling = _json(modules["Pooling"] / "config.json") if "Pooling" in modules else {}
        mode = pooling.get("pooling_mode") or [v for k, v in _LEGACY_MODES.items() if pooling.get(k)] or "mean"
        self.pooling = (mode if isinstance(mode, str) else mode[0]) if modules else default_pooling
        self.include_prompt = pooling.get("include_prompt", True)
        self.normalize = "Normalize" in modules
        names = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                 "sentence_camembert_config.json", "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                 "sentence_xlnet_config.json")
        transformer = next((_json(path / n) for n in names if (path / n).is_file()), {}) if modules else {}
        self.lowercase = bool(transformer.get("do_lower_case"))
        tokenizer_kwargs = transformer.get("processor_kwargs") or transformer.get("tokenizer_args") or {}
        limit = tokenizer_kwargs.get("model_max_length") or transformer.get("max_seq_length")
        positions = _json(path / "config.json").get("max_position_embeddings", -1)
        self.max_length = limit or (self.tokenizer.model_max_length if positions == -1
                                    else min(self.tokenizer.model_max_length, positions))
        self.prompts = {"query": "", "document": "", **(pipeline.get("prompts") or {})}
        self.default_prompt = pipeline.get("default_prompt_name")
        self.similarity_name = pipeline.get("similarity_fn_name") or "cosine"
        self.truncate_dim = pipeline.get("truncate_dim")

    def prompt(self, name: str | None) -> str:
        return (self.prompts[name] if name is not None else self.prompts.get(self.default_prompt or "")) or ""

    def _text(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    @torch.inference_mode()
    def embed_ids(self, ids: list[int], skip: int = 0) -> torch.Tensor:
        """The embedding of one token sequence; `skip` leading tokens are not pooled."""
        hidden = self.model(input_ids=torch.tensor([ids], device=self.model.device)).last_hidden_state[0].double()
        pooled = {"cls": lambda: hidden[skip], "mean": lambda: hidden[skip:].mean(0),
                  "lasttoken": lambda: hidden[-1]}[self.pooling]()
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=0)
        return pooled if self.truncate_dim is None else pooled[:self.truncate_dim]

    def embed(self, text: str, prompt_name: str | None = None) -> torch.Tensor:
        prompt = self.prompt(prompt_name)
        ids = self.tokenizer(self._text(prompt + text), truncation=True, max_length=self.max_length)["input_ids"]
        skip = 0
        if prompt and not self.include_prompt:  # sentence-transformers' prompt_length
            alone = self.tokenizer(self._text(prompt), truncation=True, max_length=self.max_length)["input_ids"]
            skip = len(alone) - (alone[-1] in self.tokenizer.all_special_ids)
        return self.embed_ids(list(ids), skip)

    def similarity(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """[n, H] × [m, H] → [n, m], as sentence-transformers' similarity functions."""
        if self.similarity_name == "cosine":
            return torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T
        if self.similarity_name == "dot":
            return a @ b.T
        return -torch.cdist(a, b, p=2.0 if self.similarity_name == "euclidean" else 1.0)


def reference_encoder(model: ScoringModel) -> ReferenceEncoder:
    return ReferenceEncoder(Path(model.model.name_or_path), model.model,
                            "lasttoken" if model.support.decoder else "mean")


@dataclass(frozen=True)
class TextProbes:
    long: str | None  # a text past max_seq_length, when the maximum is short enough to probe
    prompt_names: list[str | None]  # the default prompt (None), then every non-empty named prompt

    def items(self, name: str | None) -> list[str]:
        """The texts embedded under a prompt: the long one under the default prompt only (it costs the most)."""
        return [*PROBE_ITEMS, self.long] if name is None and self.long is not None else list(PROBE_ITEMS)


def text_probes(model: ScoringModel, reference: ReferenceEncoder) -> TextProbes:
    long = None
    if model.max_positions <= LONG_PROBE_LIMIT:
        long = _LONG_SENTENCE
        while len(model.tokenizer(long)["input_ids"]) <= model.max_positions:
            long += _LONG_SENTENCE
    return TextProbes(long, [None, *sorted(name for name, text in reference.prompts.items() if text)])


def reference_rows(reference: ReferenceEncoder, probes: TextProbes) -> list[list[list[float]]]:
    """Per prompt, every item's embedding; then the query's similarity to the short items (default prompt)."""
    rows = [[reference.embed(item, name).tolist() for item in probes.items(name)] for name in probes.prompt_names]
    query = reference.embed(PROBE_QUERY)
    rows.append([[reference.similarity(query[None], reference.embed(item)[None]).item()] for item in PROBE_ITEMS])
    return rows


def _engine(executor: Executor, ask: ScoreAsk) -> list[list[float]]:
    """One text request through the engine's tokenizer, planner and executor: embeddings, or scores."""
    job = scored(score_now(executor, [ask]))[0]
    return [list(row or []) for row in (job.pooled if ask.embed else job.scores)]


def engine_rows(model: ScoringModel, executor: Executor, probes: TextProbes) -> list[list[list[float]]]:
    """The same rows as `reference_rows`, from the engine (/v1/embeddings and /v1/score requests)."""
    rules = LengthRules(truncate=True, field="input")
    rows = [_engine(executor, ScoreAsk(query="", items=probes.items(name), rules=rules, prompt_name=name, embed=True))
            for name in probes.prompt_names]
    rows.append(_engine(executor, ScoreAsk(query=PROBE_QUERY, items=list(PROBE_ITEMS), rules=rules)))
    return rows
