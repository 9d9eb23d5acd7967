"""Fixtures for the operator tests: an emulated cluster (KMock + kmock_ext), the real operator running against it,
and the record of every API call the operator makes (for deriving RBAC rules)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from harness import Cluster, running_cluster, running_operator
from kmock_ext import ApiCall
from operator_scenario import record_operator_api_calls


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """The emulated API server with the CRD registered and the ServiceMonitor API served."""
    async with running_cluster(service_monitor_api=True) as emulated:
        yield emulated


@pytest_asyncio.fixture
async def operator(cluster: Cluster) -> AsyncIterator[Cluster]:
    """The same cluster, with scorekeeper-operator's handlers running under kopf in this event loop."""
    async with running_operator(cluster):
        yield cluster


@pytest.fixture(scope="session")
def operator_api_calls() -> frozenset[ApiCall]:
    """Every distinct API call the real operator made while walking all of its code paths against the emulator:
    ApiCall(method, api_group, resource, subresource, verb). Turn it into RBAC rules with
    `operator_scenario.rbac_rules(operator_api_calls)`."""
    return record_operator_api_calls()
