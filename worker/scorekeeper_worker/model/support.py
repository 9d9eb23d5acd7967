"""The support matrix: the architectures the engine serves exactly, as which kinds, and what each needs.

Data, not code paths: the loader refuses every (model type, architecture class) pair not listed here, and
`scripts/gen_support_matrix.py` writes docs/support-matrix.md from it. Each listed pair has a tiny random model in
tests/support/tiny_models.py whose served scores are compared with plain transformers, and every worker proves its own
model at start-up (serving/startup/selfcheck.py). A head is a list of the model's OWN modules applied to the pooled
trunk rows, so a new encoder needs a row here, not new code."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ModelKind(StrEnum):
    CAUSAL_LM = "causal_lm"  # label-token probabilities at the sequence's last token
    CLASSIFIER = "classifier"  # decoder *ForSequenceClassification; reward models when num_labels == 1
    CROSS_ENCODER = "cross_encoder"  # encoder *ForSequenceClassification on (query, item) pairs
    EMBEDDING = "embedding"  # bi-encoder: cosine of pooled query and item embeddings


class Pooling(StrEnum):
    """Which trunk outputs feed the head: the first token, the mean of all tokens, or the last token."""

    CLS = "cls"
    MEAN = "mean"
    LAST = "last"


class PoolingSource(StrEnum):
    FIXED = "fixed"  # KindSupport.pooling, always
    CLASSIFIER_POOLING = "config.classifier_pooling"  # ModernBERT: "cls" or "mean"
    SENTENCE_TRANSFORMERS = "sentence-transformers"  # 1_Pooling/config.json; KindSupport.pooling without one


class Attention(StrEnum):
    """Attention features an architecture needs from the engine (model/kernels/attention.py implements each)."""

    CAUSAL = "causal"
    BIDIRECTIONAL = "bidirectional"
    GROUPED_QUERY = "grouped-query heads"
    SLIDING_WINDOW = "causal sliding window"
    LOCAL_WINDOW = "symmetric local window (global and local layers)"
    SOFTCAP = "attention logit soft-capping"
    ROTARY = "rotary positions"
    RELATIVE = "disentangled relative positions (the model's own attention)"


class Execution(StrEnum):
    PACKED = "packed"  # one row per batch, the engine's attention through transformers' AttentionInterface
    PADDED = "padded"  # the model's own attention on padded blocks of similar length (no cross-sequence mask)


@dataclass(frozen=True)
class HeadStep:
    """One of the model's own modules, by attribute path; `sequence`: it reads token 0 of a sequence, so the
    pooled rows are given to it as sequences of length 1."""

    module: str
    sequence: bool = False


@dataclass(frozen=True)
class KindSupport:
    kind: ModelKind
    class_suffix: str  # architectures[0] is the family's class prefix + this
    pooling: Pooling
    pooling_source: PoolingSource = PoolingSource.FIXED
    pre_head: tuple[HeadStep, ...] = ()  # rows → the vector `return_pooled_hidden_states` returns
    # that vector → logits (causal LMs: the output embedding, applied in engine/runner/forward.py)
    head: tuple[HeadStep, ...] = ()
    # Only for a sentence-transformers embedding directory (modules.json with Pooling), which sentence-transformers
    # loads with AutoModel whatever class the config names: the class loaded is the prefix + `loads_as`.
    sentence_transformers: bool = False
    loads_as: str | None = None

    @property
    def loaded_suffix(self) -> str:
        return self.loads_as or self.class_suffix


@dataclass(frozen=True)
class ArchitectureSupport:
    model_type: str  # config.model_type
    class_prefix: str  # e.g. "Qwen2" for Qwen2ForCausalLM
    decoder: bool
    attention: tuple[Attention, ...]
    kinds: tuple[KindSupport, ...]
    execution: Execution = Execution.PACKED
    position_offset: bool = False  # RoBERTa family: position ids start at pad_token_id + 1
    unused_in_embedding: tuple[str, ...] = ()  # parameter prefixes an embedding model never runs (may be missing)
    # The trunk module (`{last}`: the last layer's index) where the last layer's per-token tail starts, called with
    # (attention output, residual): from there on only pooled rows are computed (model/trunk_patches.py).
    pooled_rows_from: str | None = None

    def architectures(self) -> list[str]:
        return [self.class_prefix + kind.class_suffix for kind in self.kinds]


_CAUSAL_LM = KindSupport(ModelKind.CAUSAL_LM, "ForCausalLM", Pooling.LAST)
_DECODER_CLASSIFIER = KindSupport(ModelKind.CLASSIFIER, "ForSequenceClassification", Pooling.LAST,
                                  head=(HeadStep("score"),))
_DECODER_EMBEDDING = KindSupport(ModelKind.EMBEDDING, "Model", Pooling.LAST, PoolingSource.SENTENCE_TRANSFORMERS)
# Qwen3-Embedding: config.architectures says Qwen3ForCausalLM, its sentence-transformers pipeline last-token pools
# Qwen3Model (the lm_head, if saved, is unused).
_CAUSAL_LM_EMBEDDING = KindSupport(ModelKind.EMBEDDING, "ForCausalLM", Pooling.LAST,
                                   PoolingSource.SENTENCE_TRANSFORMERS, sentence_transformers=True, loads_as="Model")
_ENCODER_EMBEDDING = KindSupport(ModelKind.EMBEDDING, "Model", Pooling.MEAN, PoolingSource.SENTENCE_TRANSFORMERS)
# RobertaClassificationHead / ElectraClassificationHead read token 0 themselves: dense → activation → out_proj.
_FIRST_TOKEN_HEAD = KindSupport(ModelKind.CROSS_ENCODER, "ForSequenceClassification", Pooling.CLS,
                                head=(HeadStep("classifier", sequence=True),))
# BERT-style layers: attention.output(attention output, residual) → dense, norm; then the feed-forward.
_BERT_LAYER_TAIL = "encoder.layer.{last}.attention.output"
_DECODER = (Attention.CAUSAL, Attention.GROUPED_QUERY, Attention.ROTARY)
_ENCODER = (Attention.BIDIRECTIONAL,)

MATRIX: tuple[ArchitectureSupport, ...] = (
    ArchitectureSupport("qwen2", "Qwen2", True, (*_DECODER, Attention.SLIDING_WINDOW),
                        (_CAUSAL_LM, _DECODER_CLASSIFIER)),
    ArchitectureSupport("qwen3", "Qwen3", True, (*_DECODER, Attention.SLIDING_WINDOW),
                        (_CAUSAL_LM, _DECODER_CLASSIFIER, _DECODER_EMBEDDING, _CAUSAL_LM_EMBEDDING)),
    ArchitectureSupport("llama", "Llama", True, _DECODER, (_CAUSAL_LM, _DECODER_CLASSIFIER)),
    ArchitectureSupport("mistral", "Mistral", True, (*_DECODER, Attention.SLIDING_WINDOW),
                        (_CAUSAL_LM, _DECODER_CLASSIFIER)),
    ArchitectureSupport("gemma2", "Gemma2", True, (*_DECODER, Attention.SLIDING_WINDOW, Attention.SOFTCAP),
                        (_CAUSAL_LM, _DECODER_CLASSIFIER)),
    ArchitectureSupport("bert", "Bert", False, _ENCODER, (
        # BertForSequenceClassification: classifier(dropout(pooler(hidden)[token 0])); the pooler is BertModel's.
        KindSupport(ModelKind.CROSS_ENCODER, "ForSequenceClassification", Pooling.CLS,
                    pre_head=(HeadStep("base_model.pooler", sequence=True),),
                    head=(HeadStep("dropout"), HeadStep("classifier"))),
        _ENCODER_EMBEDDING), unused_in_embedding=("pooler.",), pooled_rows_from=_BERT_LAYER_TAIL),
    ArchitectureSupport("roberta", "Roberta", False, _ENCODER, (_FIRST_TOKEN_HEAD, _ENCODER_EMBEDDING),
                        position_offset=True, unused_in_embedding=("pooler.",), pooled_rows_from=_BERT_LAYER_TAIL),
    ArchitectureSupport("xlm-roberta", "XLMRoberta", False, _ENCODER, (_FIRST_TOKEN_HEAD, _ENCODER_EMBEDDING),
                        position_offset=True, unused_in_embedding=("pooler.",), pooled_rows_from=_BERT_LAYER_TAIL),
    ArchitectureSupport("electra", "Electra", False, _ENCODER, (_FIRST_TOKEN_HEAD, _ENCODER_EMBEDDING),
                        pooled_rows_from=_BERT_LAYER_TAIL),
    ArchitectureSupport("modernbert", "ModernBert", False,
                        (Attention.BIDIRECTIONAL, Attention.LOCAL_WINDOW, Attention.ROTARY), (
        # ModernBertForSequenceClassification: classifier(drop(head(pooled))), pooled by config.classifier_pooling.
        KindSupport(ModelKind.CROSS_ENCODER, "ForSequenceClassification", Pooling.CLS,
                    PoolingSource.CLASSIFIER_POOLING,
                    head=(HeadStep("head"), HeadStep("drop"), HeadStep("classifier"))),
        _ENCODER_EMBEDDING)),
    ArchitectureSupport("deberta-v2", "DebertaV2", False, (Attention.BIDIRECTIONAL, Attention.RELATIVE), (
        # DebertaV2ForSequenceClassification: classifier(dropout(ContextPooler(hidden)[token 0])).
        KindSupport(ModelKind.CROSS_ENCODER, "ForSequenceClassification", Pooling.CLS,
                    head=(HeadStep("pooler", sequence=True), HeadStep("dropout"), HeadStep("classifier"))),),
                        execution=Execution.PADDED),
)

_BY_TYPE = {arch.model_type: arch for arch in MATRIX}


class UnsupportedModel(ValueError):
    """The model is outside the support matrix: refused at start-up rather than scored wrongly."""


def supported_architectures() -> list[str]:
    return list(dict.fromkeys(name for arch in MATRIX for name in arch.architectures()))


def resolve(architecture: str, model_type: str, embedding_directory: bool = False
            ) -> tuple[ArchitectureSupport, KindSupport]:
    """The matrix entry for `config.architectures[0]` and `config.model_type`, or UnsupportedModel naming both and
    the supported list. `embedding_directory`: the directory holds a sentence-transformers embedding pipeline, served
    as an embedding model or not at all."""
    arch = _BY_TYPE.get(model_type)
    kinds = arch.kinds if arch is not None else ()
    matches = [kind for kind in kinds if arch is not None and architecture == arch.class_prefix + kind.class_suffix
               and (embedding_directory or not kind.sentence_transformers)]
    if arch is not None and matches:
        kind = max(matches, key=lambda kind: kind.sentence_transformers)
        if embedding_directory and kind.kind != ModelKind.EMBEDDING:
            raise UnsupportedModel(f"{architecture} with a sentence-transformers embedding pipeline (modules.json with "
                                   "a Pooling module): the engine serves it as a "
                                   f"{kind.kind.value} only, not as the embedding model it is (docs/support-matrix.md)")
        return arch, kind
    raise UnsupportedModel(
        f"unsupported architecture {architecture!r} (model_type {model_type!r}): the engine serves only what it "
        f"implements exactly and tests against transformers; supported: {', '.join(supported_architectures())} "
        "(docs/support-matrix.md)")
