"""64 concurrent clients over mixed model kinds and lengths get the scores they get when alone."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from serving import RunningServer


def test_concurrent_clients_get_their_own_scores(tiny_model: Callable[[str], Path],
                                                 server_for: Callable[..., RunningServer]) -> None:
    servers = {
        "classifier-mis": server_for(tiny_model("qwen3-cls3"), multi_item_scoring=True, max_batch_tokens=512),
        "causal": server_for(tiny_model("llama-causal"), max_batch_tokens=512),
        "embedding": server_for(tiny_model("bert-embed"), max_batch_tokens=512),
    }
    rng = random.Random(11)
    words = ["the", "river", "city", "mountain", "capital", "banana", "music", "theory", "garden"]
    jobs: list[tuple[RunningServer, dict[str, Any]]] = []
    for i in range(64):
        kind = list(servers)[i % 3]
        items = [" ".join(rng.choices(words, k=rng.randint(1, 40))) for _ in range(rng.randint(1, 12))]
        body: dict[str, Any] = {"query": " ".join(rng.choices(words, k=rng.randint(0, 20))), "items": items,
                                "apply_softmax": i % 2 == 0}
        if kind == "causal":
            body["label_token_ids"] = [5, 9]
        jobs.append((servers[kind], body))

    alone = [server.score(**body).json()["scores"] for server, body in jobs]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(client.post(s.url + "/v1/score", json=b) for s, b in jobs))

    for expected, response in zip(alone, asyncio.run(together()), strict=True):
        assert response.status_code == 200, response.text
        # Batches mix requests differently together than alone (GEMMs over other row counts): float32 logits of
        # unit scale then differ by ~1e-6, so the absolute tolerance follows their scale, not that of the smallest.
        np.testing.assert_allclose(response.json()["scores"], expected, rtol=1e-5, atol=1e-5)
