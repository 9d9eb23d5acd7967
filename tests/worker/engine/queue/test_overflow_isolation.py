"""In float16 one request's overflow fails only that request (issue 48, defect 2), end to end: over HTTP, through the
scheduler's batching and the executor, eager (row blocks) and with `--cuda-graph` (graph buckets: on CPU the
GraphRunner's padded path, dense tiles over the whole bucket).

As the issue reproduced it: a tiny RoBERTa whose token OVERFLOWING has an embedding of 70,000, served with
`--dtype float16`, where it is inf. Tenant A's query holds that token, so A's activations are inf and NaN from the
first layer on; tenant B's do not. Both are queued behind a held batch, so they form one batch, A packed first:
padding used to read A's first token, and dense tiles multiply every token of the bucket, masked or not (0 × inf
is NaN). B must get its 200 with the very scores it gets beside a clean A' of the same shape; A gets its 500."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.torch import load_file, save_file
from serving import BatchGate, RunningServer, wait_until

OVERFLOWING, CLEAN = 170, 171  # ids of the tiny vocabulary (178) no other request here holds
A_ITEMS = [[30, 31, 32, 33], [34, 35, 36, 37, 38]]
B_QUERY, B_ITEMS = [20, 21, 22], [[40], [50, 51, 52, 53]]  # rows shorter than A's: padded in A's row blocks
GRAPHS = {"cuda_graph": True, "cuda_graph_token_buckets": (64, 256), "cuda_graph_max_tokens": 256,
          "cuda_graph_max_seqs": 16}
MODES: dict[str, dict[str, object]] = {"eager": {}, "graphs": GRAPHS}


@pytest.fixture(scope="module")
def overflowing(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("overflow") / "roberta-cross"
    shutil.copytree(tiny_model("roberta-cross"), path)
    weights = load_file(path / "model.safetensors")
    name = next(n for n in weights if n.endswith("word_embeddings.weight"))
    weights[name][OVERFLOWING] = 70_000.0  # float32 on disk; inf once loaded in float16
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module", params=list(MODES))
def server(request: pytest.FixtureRequest, overflowing: Path) -> Iterator[RunningServer]:
    # Without the start-up self-check, which would refuse the model: its probes may hold the token.
    running = RunningServer(model=overflowing, dtype="float16", max_batch_tokens=4096, self_check=False,
                            **MODES[request.param])
    yield running
    running.stop()


def _co_batched(server: RunningServer, first: int) -> tuple[httpx.Response, httpx.Response]:
    """Tenant A (its query led by token `first`) and tenant B in one batch, A first; their responses."""
    with BatchGate(server.scheduler, hold=True) as gate, ThreadPoolExecutor(3) as pool:
        primer = pool.submit(server.score, query=[60, 61], items=[[62]])
        gate.wait_held()
        a: Future[httpx.Response] = pool.submit(server.score, query=[first, 23, 24], items=A_ITEMS)
        wait_until("A queued", lambda: server.scheduler.open_requests == 2)
        b = pool.submit(server.score, query=B_QUERY, items=B_ITEMS)
        wait_until("B queued", lambda: server.scheduler.open_requests == 3)
        gate.release()
        assert primer.result().status_code == 200
        responses = a.result(), b.result()
    together = [batch for batch in gate.batches if len({id(job) for job, _ in batch}) == 2]
    assert together, [len(batch) for batch in gate.batches]  # A and B did share a batch
    return responses


def _scores(response: httpx.Response) -> list[list[float]]:
    assert response.status_code == 200, response.text
    scores: list[list[float]] = response.json()["scores"]
    return scores


def test_a_tenant_s_float16_overflow_leaves_its_co_batched_neighbour_exact(server: RunningServer) -> None:
    alone = _scores(server.score(query=B_QUERY, items=B_ITEMS))
    a_clean, b_beside_clean = _co_batched(server, CLEAN)
    a_inf, b_beside_inf = _co_batched(server, OVERFLOWING)
    assert a_inf.status_code == 500 and "non-finite" in a_inf.json()["message"], a_inf.text
    assert _scores(a_clean)
    assert _scores(b_beside_inf) == _scores(b_beside_clean)  # bit for bit: the same batch shape
    np.testing.assert_allclose(_scores(b_beside_inf), alone, rtol=1e-3, atol=1e-3)  # other shapes round otherwise
