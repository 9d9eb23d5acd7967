"""Truncation-aware tokenization (issue 23 target: a 500,000-character document truncated to 512 tokens costs ≤ 5 ms
of tokenization): the worker's bounded tokenization (planning/bounded_tokens.py) against tokenizing the whole text
and then cutting, for WordPiece (all-MiniLM-L6-v2), byte-level BPE (SmolLM2-135M) and SentencePiece (the test zoo's
Unigram and byte-fallback BPE), both truncation directions, in CPU time; checks that the ids are identical.

    .venv/bin/python bench/cpu/bench_tokenize.py            # median of 9 runs each, one thread
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support"), str(REPO / "tests" / "worker" / "planning")]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.harness.common import markdown_table  # noqa: E402


def tokenizers() -> dict[str, Callable[[], Any]]:
    import tiny_tokenizers
    from scorekeeper_worker.library import (
        fix_gguf_tokenizer,
        gguf_tokenizer_metadata,
        minilm_path,
        smollm2_gguf_path,
    )
    from transformers import AutoTokenizer

    def smollm2() -> Any:
        path = smollm2_gguf_path()
        return fix_gguf_tokenizer(AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name),
                                  gguf_tokenizer_metadata(path))

    return {"WordPiece (all-MiniLM-L6-v2)": lambda: AutoTokenizer.from_pretrained(minilm_path()),
            "byte-level BPE (SmolLM2-135M)": smollm2,
            "SentencePiece Unigram (test zoo)": lambda: tiny_tokenizers.sentencepiece("unigram"),
            "SentencePiece BPE, Llama-style (test zoo)": lambda: tiny_tokenizers.sentencepiece("bpe")}


def document(chars: int) -> str:
    from test_bounded_tokens import _document

    return _document(1, chars)


def timed(run: Callable[[], Any], reps: int) -> tuple[float, Any]:
    """Median CPU time of the process (all threads): what the tokenization costs, whatever the machine's load."""
    result = run()
    times = []
    for _ in range(reps):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", type=int, default=500_000)
    parser.add_argument("--keep", type=int, default=512)
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    from scorekeeper_worker.library import bounded_ids

    text = document(args.chars)
    rows = []
    for name, make in tokenizers().items():
        tokenizer = make()
        whole_seconds, whole = timed(lambda t=tokenizer: t(text, add_special_tokens=False)["input_ids"], args.reps)
        for from_end in (False, True):
            seconds, got = timed(lambda t=tokenizer, e=from_end: bounded_ids(t, [text], [args.keep + 1], e), args.reps)
            cut = whole[len(whole) - args.keep - 1:] if from_end else whole[:args.keep + 1]
            rows.append([name, "left" if from_end else "right", f"{len(whole):,}", f"{1000 * whole_seconds:.1f}",
                         f"{1000 * seconds:.2f}", f"{whole_seconds / seconds:.0f}×",
                         "yes" if got[0].ids == cut else "NO"])
    print(f"\n{args.chars:,}-character document, {args.keep} tokens kept (+1 to tell it is longer), "
          f"medians of {args.reps}; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print(markdown_table(["tokenizer", "truncation", "tokens in all", "whole then cut, CPU ms", "bounded, CPU ms",
                          "speed-up", "ids identical"], rows))


if __name__ == "__main__":
    main()
