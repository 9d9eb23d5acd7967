"""Independent reference scorer: plain transformers forwards, one sequence at a time, no server code.

Everything here runs batch 1 without padding, so there is no attention mask, padding side or packing to get wrong;
the server's batched / multi-item results are compared against these numbers. Post-processing (softmax, sigmoid,
cosine) is done in float64 so that the reference adds no rounding of its own.

Token-level join (spec "Score semantics"):
- decoders: `tokenizer(query)` and `tokenizer(item)` without special tokens, joined, then the tokenizer's own
  single-sequence template applied to the joined ids (its post-processor: BOS before, EOS after where it adds them);
  with item_first the roles swap.
- cross-encoders: the tokenizer's own pair encoding of (query, item) (CLS/SEP template, token_type_ids), called in
  batch form `tokenizer([query], [item])` because the single form drops an empty item (see encode_pair).
- embedding models: every text alone with default special tokens.

The score functions take token ids, so token-id requests can be checked with the same code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ENCODER_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "electra", "modernbert", "deberta-v2"}
FIRST_TOKEN_HEADS = {"roberta", "xlm-roberta", "electra", "deberta-v2"}  # their heads read the first token


# ----------------------------------------------------------------------------------------------------- loading


def model_kind(path: Path | str) -> str:
    """The model kind, "causal_lm", "classifier" or "embedding", from config.architectures and modules.json (a
    sentence-transformers pipeline with a Pooling module is an embedding model whatever its class, as
    Qwen3-Embedding's Qwen3ForCausalLM)."""
    path = Path(path)
    architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    arch = architectures[0] if architectures else ""
    modules = json.loads((path / "modules.json").read_text()) if (path / "modules.json").is_file() else []
    if any(m["type"].endswith("Pooling") for m in modules):
        return "embedding"
    if arch.endswith("ForCausalLM"):
        return "causal_lm"
    if arch.endswith("ForSequenceClassification"):
        return "classifier"
    if (path / "modules.json").is_file() or arch.endswith("Model"):
        return "embedding"
    raise ValueError(f"cannot tell the model kind of {path} (architectures={architectures})")


def load_model(
    path: Path | str, attn_implementation: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """Load (model in eval mode, float32, on CPU; tokenizer; kind) the plain transformers way.

    The attention implementation is transformers' default ("sdpa"), except for models with attention logit
    softcapping (Gemma2): transformers 5.18's sdpa path silently drops the softcap, which moves tiny-Gemma2 scores by
    ~1e-3, so the reference uses "eager", the implementation that matches the model's definition.
    """
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    kind = model_kind(path)
    if attn_implementation is None and getattr(AutoConfig.from_pretrained(path), "attn_logit_softcapping", None):
        attn_implementation = "eager"
    auto_class: Any = {
        "causal_lm": AutoModelForCausalLM,
        "classifier": AutoModelForSequenceClassification,
        "embedding": AutoModel,
    }[kind]
    kwargs: dict[str, Any] = {"dtype": "float32"}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = auto_class.from_pretrained(path, **kwargs).eval()
    return model, AutoTokenizer.from_pretrained(path), kind


# ----------------------------------------------------------------------------------------------------- encoding


def encode_decoder(tokenizer: PreTrainedTokenizerBase, query_text: str, item_text: str, item_first: bool) -> list[int]:
    """Decoder join: both texts without specials, joined, then the tokenizer's template for one sequence (BOS first
    and, for tokenizers that append one, EOS at the very end)."""
    from tokenizers import Encoding

    first, second = (item_text, query_text) if item_first else (query_text, item_text)
    backend = tokenizer.backend_tokenizer
    joined = Encoding.merge([backend.encode(text, add_special_tokens=False) for text in (first, second)])
    return list(backend.post_processor.process(joined).ids if backend.post_processor else joined.ids)


def encode_pair(
    tokenizer: PreTrainedTokenizerBase, query_text: str, item_text: str, item_first: bool
) -> tuple[list[int], list[int] | None]:
    """Cross-encoder join: the tokenizer's own pair encoding. token_type_ids is None when the tokenizer has none
    (XLM-R).

    Called in batch form on purpose: transformers 5.18's `tokenizer(a, "")` treats an empty text_pair as "no pair"
    and returns `[CLS] a [SEP]`, while the pair template gives `[CLS] a [SEP] [SEP]` (what `tokenizer([a], [""])`,
    sentence-transformers' CrossEncoder and separate tokenization joined with the template all give).
    """
    first, second = (item_text, query_text) if item_first else (query_text, item_text)
    enc = tokenizer([first], [second])
    token_type_ids = enc.get("token_type_ids")
    return list(enc["input_ids"][0]), (list(token_type_ids[0]) if token_type_ids is not None else None)


def encode_single(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Embedding models: each text alone, with the tokenizer's default special tokens."""
    return list(tokenizer(text)["input_ids"])


# ----------------------------------------------------------------------------------------------------- forwards


def _tensor(ids: list[int], model: PreTrainedModel) -> torch.Tensor:
    import torch

    if not ids:
        raise ValueError("a sequence needs at least one token")
    return torch.tensor([ids], dtype=torch.long, device=model.device)


def _is_encoder(model: PreTrainedModel) -> bool:
    return model.config.model_type in ENCODER_MODEL_TYPES


def _check_temperature(apply_softmax: bool, temperature: float) -> None:
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    if not apply_softmax and temperature != 1.0:
        raise ValueError("temperature != 1 requires apply_softmax (spec)")


def causal_lm_scores(
    model: PreTrainedModel, ids: list[int], label_ids: list[int], apply_softmax: bool, temperature: float = 1.0
) -> list[float]:
    """Label-token scores at the last position.

    apply_softmax=False: exp(log_softmax(logits over the full vocab))[labels] (true probabilities).
    apply_softmax=True: softmax(logits[labels] / temperature) over the label set.
    """
    import torch

    _check_temperature(apply_softmax, temperature)
    with torch.no_grad():
        logits = model(input_ids=_tensor(ids, model)).logits[0, -1].double()
    labels = torch.tensor(label_ids, dtype=torch.long, device=logits.device)
    if apply_softmax:
        return torch.softmax(logits[labels] / temperature, dim=-1).tolist()
    return torch.log_softmax(logits, dim=-1)[labels].exp().tolist()


def _pooled_tensor(model: PreTrainedModel, ids: list[int], token_type_ids: list[int] | None) -> torch.Tensor:
    """The classifier head's input for one sequence (see classifier_pooled)."""
    import torch

    input_ids = _tensor(ids, model)
    kwargs: dict[str, Any] = {}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = torch.tensor([token_type_ids], dtype=torch.long, device=model.device)
    with torch.no_grad():
        out = model.base_model(input_ids=input_ids, **kwargs)
    model_type = model.config.model_type
    if model_type == "bert":
        return out.pooler_output[0]  # BertForSequenceClassification: classifier(dropout(pooler_output))
    if model_type in FIRST_TOKEN_HEADS:
        return out.last_hidden_state[0, 0]  # their heads take features[:, 0, :] (the <s> / [CLS] token)
    if model_type == "modernbert":  # ModernBertForSequenceClassification pools by config.classifier_pooling
        hidden = out.last_hidden_state[0]
        return hidden[0] if model.config.classifier_pooling == "cls" else hidden.mean(dim=0)
    # Decoder SeqCls: final hidden state (after the final norm) at the last token that is not pad_token_id, by
    # transformers' own formula (GenericForSequenceClassification).
    pad = model.config.pad_token_id
    if pad is None:
        return out.last_hidden_state[0, -1]
    index = (torch.arange(input_ids.shape[-1]) * (input_ids[0] != pad).int()).argmax()
    return out.last_hidden_state[0, index]


def classifier_pooled(model: PreTrainedModel, ids: list[int], token_type_ids: list[int] | None = None) -> list[float]:
    """Pre-head vector: decoder SeqCls -> final-norm hidden state at the last token that is not pad; BERT -> pooler
    output; RoBERTa, XLM-R, ELECTRA, DeBERTa-v2 -> hidden state of the first token; ModernBERT -> its classifier
    pooling."""
    return _pooled_tensor(model, ids, token_type_ids).double().tolist()


def classifier_scores(
    model: PreTrainedModel,
    ids: list[int],
    token_type_ids: list[int] | None,
    apply_softmax: bool,
    temperature: float = 1.0,
) -> list[float]:
    """The model's own head output for one sequence.

    apply_softmax=False: raw logits. True: softmax(logits / T) over classes, or sigmoid(logit / T) for num_labels=1.

    Every kind through the model's own forward: decoder SeqCls models pool at the rightmost token that is not
    pad_token_id (position 0 when every token is pad), encoders number positions their own way.
    """
    import torch

    _check_temperature(apply_softmax, temperature)
    kwargs: dict[str, Any] = {}
    if token_type_ids is not None and _is_encoder(model):
        kwargs["token_type_ids"] = torch.tensor([token_type_ids], dtype=torch.long, device=model.device)
    with torch.no_grad():
        logits = model(input_ids=_tensor(ids, model), **kwargs).logits[0]
    logits = logits.double()
    if not apply_softmax:
        return logits.tolist()
    if logits.numel() == 1:
        return torch.sigmoid(logits / temperature).tolist()
    return torch.softmax(logits / temperature, dim=-1).tolist()


def sentence_pooling(path: Path | str) -> str:
    """A sentence-transformers directory's pooling: "cls", "mean" or "lasttoken" (mean without 1_Pooling)."""
    config = Path(path) / "1_Pooling" / "config.json"
    if not config.is_file():
        return "mean"
    settings = json.loads(config.read_text())
    return next(name for name in ("cls", "mean", "lasttoken")
                if settings.get({"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                                 "lasttoken": "pooling_mode_lasttoken"}[name]))


def _pooled(model: PreTrainedModel, ids: list[int], pooling: str) -> torch.Tensor:
    import torch

    with torch.no_grad():
        hidden = model(input_ids=_tensor(ids, model)).last_hidden_state[0]
    hidden = hidden.double()
    return {"cls": hidden[0], "mean": hidden.mean(dim=0), "lasttoken": hidden[-1]}[pooling]


def embedding_pooled(model: PreTrainedModel, ids: list[int], pooling: str = "mean") -> list[float]:
    """The pooled last hidden state (not normalized): mean over all tokens, the first, or the last token."""
    return _pooled(model, ids, pooling).tolist()


def embedding_scores(model: PreTrainedModel, query_ids: list[int], item_ids: list[int],
                     pooling: str = "mean") -> list[float]:
    """[cosine(pooled query, pooled item)]."""
    import torch

    query, item = _pooled(model, query_ids, pooling), _pooled(model, item_ids, pooling)
    return [torch.nn.functional.cosine_similarity(query, item, dim=0).item()]


# ----------------------------------------------------------------------------------------------------- requests


def expected_scores(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, kind: str, query: str,
                    items: list[str], *, item_first: bool = False, apply_softmax: bool = False,
                    temperature: float = 1.0, labels: list[int] | None = None,
                    pooled: bool = False) -> list[list[float]]:
    """What /v1/score should return for a text request (`pooled`: its pooled_hidden_states instead), item by item:
    the joins above, one plain forward per sequence. `kind` as `model_kind` returns it."""
    rows = []
    for item in items:
        if kind == "causal_lm":
            ids = encode_decoder(tokenizer, query, item, item_first)
            rows.append(causal_lm_scores(model, ids, labels or [], apply_softmax, temperature))
        elif kind == "embedding":
            pooling = sentence_pooling(model.name_or_path)
            item_ids, query_ids = encode_single(tokenizer, item), encode_single(tokenizer, query)
            rows.append(embedding_pooled(model, item_ids, pooling) if pooled
                        else embedding_scores(model, query_ids, item_ids, pooling))
        else:
            if _is_encoder(model):
                ids, types = encode_pair(tokenizer, query, item, item_first)
            else:
                ids, types = encode_decoder(tokenizer, query, item, item_first), None
            rows.append(classifier_pooled(model, ids, types) if pooled
                        else classifier_scores(model, ids, types, apply_softmax, temperature))
    return rows
