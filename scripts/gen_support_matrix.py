#!/usr/bin/env python3
"""Generate docs/support-matrix.md from the worker's support matrix (worker/scorekeeper_worker/model/support.py).

    python scripts/gen_support_matrix.py           # rewrite docs/support-matrix.md
    python scripts/gen_support_matrix.py --check   # exit 1 if the committed file differs from what would be generated
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "worker") not in sys.path:  # importable without an installed package
    sys.path.insert(0, str(REPO / "worker"))

from scorekeeper_worker.model.config_keys import CONFIG_KEYS, ConfigKey  # noqa: E402
from scorekeeper_worker.model.support import MATRIX, HeadStep, KindSupport, PoolingSource  # noqa: E402

OUTPUT = REPO / "docs" / "support-matrix.md"
REGENERATE = "python scripts/gen_support_matrix.py"

INTRO = f"""# Support matrix

<!-- Generated from worker/scorekeeper_worker/model/support.py and model/config_keys.py by `{REGENERATE}`; do not
edit. -->

The worker serves exactly these architectures, as exactly these kinds, and refuses to start on anything else with a
message that names the model's architecture and this list. "Supported" means three things: the engine implements
everything the architecture needs (its attention features, pooling and head), a tiny random model of every row is
scored in CI against plain transformers forwards (`tests/support/tiny_models.py`,
`tests/worker/serving/test_score_equivalence.py`, `tests/worker/model/test_support_matrix.py`: equal to 1e-4 in
float32, alone and packed with other requests' sequences,
and multi-item = single-item for decoders), and every worker proves its own model at start-up against transformers
on the same weights (the self-check, [operations.md](operations.md#start-up-refusals-and-the-self-check)).

The kind comes from `config.architectures[0]` (the class the checkpoint was saved with). A checkpoint is also refused
when transformers would initialise any parameter at random or could not load it as saved (missing, mismatched, or a
head stored under other names, e.g. a `*ForRewardModel` head), and when its sentence-transformers configuration asks
for anything the engine does not implement (Dense layers, max pooling, a chat-template modality, ...: the file and key
are named). The head column lists the model's own modules, applied in order to the pooled rows; "(sequence)" marks a
module that reads the first token of a sequence. Within an architecture, the config values the engine implements are
listed [below](#config-keys-unknown-means-refused): any other value is refused at start-up, naming the key. The
conformance suite (`tests/conformance/`) generates tiny models over these variations and compares every score with
transformers.
"""

CONFIG_INTRO = """
## Config keys: unknown means refused

The config keys each architecture's forward depends on, and the values the engine implements. A checkpoint with
another value is refused at start-up: `config key KEY = VALUE is not implemented by the engine for MODEL_TYPE
(implemented: ...)`. "any": the engine implements every value. `a.b` is key `b` of the dict `a`; `a.*.b`, of each
per-layer-type dict.

| model_type | key | implemented values (default when absent) | what the engine does |
| --- | --- | --- | --- |
"""

KIND_NAMES = {"causal_lm": "causal LM (label tokens)", "classifier": "classifier / reward",
              "cross_encoder": "cross-encoder", "embedding": "embedding (bi-encoder)"}

NOTES = """
## Notes

- **Attention.** Packed architectures run the engine's attention (`model/kernels/attention.py`) through transformers'
  `AttentionInterface`: one packed row per batch, sequences kept apart by the layout, causal or bidirectional, with
  sliding windows (one-sided for decoders, symmetric `|i - j| < window` for ModernBERT's local layers), Gemma2's
  logit soft-capping and grouped-query heads. Multi-item scoring applies to decoders only. Gemma2 causal LMs also
  get their final logit soft-capping on the label logits (`engine/runner/forward.py`).
- **DeBERTa-v2 / v3** computes disentangled relative-position attention inside its own modules, which never reach
  `AttentionInterface`, so a packed row would let sequences see each other. The worker runs it *padded*: every
  block of similar-length sequences is an ordinary right-padded batch with an attention mask, which is exact. CUDA
  graphs (`--cuda-graph`) are refused for it.
- **ModernBERT** cross-encoders pool by `config.classifier_pooling` (`cls` or `mean`) and apply `head`, `drop` and
  `classifier`; its global and local (sliding-window) layers and rotary positions restart for every sequence of a
  packed batch. Its pair template (`[CLS] query [SEP] item [SEP]`) comes from the tokenizer.
- **Embedding models** are served as `SentenceTransformer(path)` applies its configuration
  (`model/sentence_transformers.py`, as sentence-transformers 6.2 reads it): the pooling of `1_Pooling/config.json`
  in either format (the classic `pooling_mode_*_tokens` flags or 6.2's `pooling_mode`: `cls`, `mean` or `lasttoken`)
  with `include_prompt`; without one, encoders mean-pool and decoders take the last token. `prompts` and
  `default_prompt_name` (config_sentence_transformers.json) prepend the prompt to every text (a request may name
  another, /v1/embeddings `prompt_name`); `max_seq_length` from sentence_bert_config.json or, as 6.x saves it, the
  tokenizer's `model_max_length`; `do_lower_case`; `Normalize`; `similarity_fn_name` (cosine, dot, euclidean,
  manhattan) and `truncate_dim`. A checkpoint whose `config.architectures` names a causal LM (Qwen3-Embedding's
  `Qwen3ForCausalLM`) is an embedding model when its directory holds a sentence-transformers pipeline with a Pooling
  module, and a causal LM otherwise. Any other module, pooling mode or setting is refused, naming the file and key.
- **Cross-encoders** rerank with the activation sentence-transformers' CrossEncoder applies to a single logit:
  `activation_fn` from config_sentence_transformers.json, config.json's `sentence_transformers`, or
  `sbert_ce_default_activation_function` (sigmoid, identity or tanh; sigmoid by default). Multi-label classifiers
  (`problem_type: multi_label_classification`) get a sigmoid per class under `apply_softmax`.
- **Refused, among others:** DistilBERT (its classifier runs `pre_classifier` and ReLU before the classifier and no
  tiny model covers it yet), `*ForRewardModel` remote-code classes, any architecture not in the table.
"""


def _steps(steps: tuple[HeadStep, ...]) -> str:
    return " → ".join(f"`{s.module}`" + (" (sequence)" if s.sequence else "") for s in steps)


def _head(kind: KindSupport) -> str:
    if kind.kind == "causal_lm":
        return "output embedding (label-token logits)"
    if kind.kind == "embedding":
        return "similarity of pooled query and item (similarity_fn_name, cosine by default)"
    return _steps(kind.pre_head + kind.head)


def _kind(kind: KindSupport) -> str:
    if kind.sentence_transformers:
        return f"{KIND_NAMES[kind.kind]}, with a sentence-transformers pipeline (modules.json with Pooling)"
    return KIND_NAMES[kind.kind]


def _pooling(kind: KindSupport) -> str:
    if kind.pooling_source == PoolingSource.CLASSIFIER_POOLING:
        return "`classifier_pooling` (cls or mean)"
    if kind.pooling_source == PoolingSource.SENTENCE_TRANSFORMERS:
        return f"sentence-transformers (default {kind.pooling})"
    return {"cls": "first token", "mean": "mean", "last": "last token"}[kind.pooling]


def _values(key: ConfigKey) -> str:
    if key.values is None:
        return "any"
    listed = ", ".join(f"`{value!r}`" if not isinstance(value, str) else f"`{value}`" for value in key.values)
    return listed + (f" (`{key.default}`)" if key.default is not None else "")


def _config_keys() -> str:
    rows = [f"| `{model_type}` | `{key.key}` | {_values(key)} | {key.meaning} |"
            for model_type, keys in CONFIG_KEYS.items() for key in keys]
    return CONFIG_INTRO + "\n".join(rows) + "\n"


def render() -> str:
    lines = [INTRO, "| model_type | architecture | kind | pooling | head | attention | execution |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for arch in MATRIX:
        for kind in arch.kinds:
            lines.append(f"| `{arch.model_type}` | `{arch.class_prefix}{kind.class_suffix}` | "
                         f"{_kind(kind)} | {_pooling(kind)} | {_head(kind)} | "
                         f"{', '.join(arch.attention)} | {arch.execution} |")
    return "\n".join(lines) + "\n" + _config_keys() + NOTES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/support-matrix.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            sys.exit(f"{OUTPUT.relative_to(REPO)} is stale; regenerate it with: {REGENERATE}")
        return
    OUTPUT.write_text(text)


if __name__ == "__main__":
    main()
