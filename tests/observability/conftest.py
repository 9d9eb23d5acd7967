"""`observed`: the cluster the live observability modules read (observed_cluster.observe), built once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from obs_harness import prometheus_binary
from observed_cluster import Observed, observe


@pytest.fixture(scope="session")
def observed(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip("the `prometheus` binary is missing (apt-get install -y prometheus): the dashboard and alert "
                    "queries were NOT checked against a real Prometheus")
    yield from observe(binary, tiny_model("qwen3-cls3"), tmp_path_factory.mktemp("prometheus"))
