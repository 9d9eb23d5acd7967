"""Property-based fuzzing of the HTTP contract from the worker's own OpenAPI schema (schemathesis).

Whatever the body, the worker answers with a documented status and never a 500."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from serving import RunningServer


@pytest.fixture(scope="module")
def fuzzed_server(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> RunningServer:
    return server_for(tiny_model("qwen3-cls3"), max_items_per_request=64)


def test_no_input_causes_a_server_error(fuzzed_server: RunningServer) -> None:
    schema = schemathesis.openapi.from_url(fuzzed_server.url + "/openapi.json")
    statuses: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)  # the same examples every run: CI never flakes on a lucky draw
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=fuzzed_server.url, timeout=60)
            case.validate_response(response, checks=[not_a_server_error])
            assert response.status_code in {200, 400, 413, 429, 503}, (response.status_code, response.text)
            statuses.setdefault(case.path, set()).add(response.status_code)

        check()
    # The fuzzer reached the scoring routes with both valid and invalid bodies.
    assert 400 in statuses["/v1/score"] and 200 in statuses["/v1/score"] | statuses["/v1/rerank"], statuses


def test_openapi_document_and_docs_page_are_served(fuzzed_server: RunningServer) -> None:
    spec = httpx.get(fuzzed_server.url + "/openapi.json", timeout=10).json()
    assert {"/v1/score", "/v1/rerank", "/v1/models", "/health", "/ready", "/metrics"} <= set(spec["paths"])
    assert httpx.get(fuzzed_server.url + "/docs", timeout=10).status_code == 200
