"""What one reconcile pass costs the API server on the steady path (nothing changed, nothing to do): the real
operator against the emulator, whose call log counts every GET and LIST the operator made during the pass."""

from __future__ import annotations

import pytest
from cluster_actors import add_worker_pod, set_deployment_status, timestamp
from harness import Cluster
from model_checks import condition, created

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
MAX_READS = 4


async def test_a_steady_pass_reads_at_most_four_times_and_no_child_twice(operator: Cluster) -> None:
    """Issue 25: one pass made 13 reads, the same Deployment three times; a wave of image upgrades made every waiting
    model list every Deployment in the cluster. Children, pods and the HPA now come from the watches."""
    await created(operator, replicas=2, autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 4},
                  networkPolicy={"enabled": True})
    for name in ("reranker-0", "reranker-1"):
        await add_worker_pod(operator, name, ready_since=timestamp(60))
    await set_deployment_status(operator, ready=2)
    await operator.wait_for(lambda: condition(operator, "Ready") == ("True", "AllReplicasReady"), what="Ready")
    while (await operator.reconciled()).wrote:  # settled: a pass with nothing left to do
        pass
    before = len(operator.emulator.calls)
    report = await operator.reconciled()
    reads = [(c.resource, c.verb) for c in operator.emulator.calls[before:] if c.verb in ("get", "list")]
    assert report.wrote == [] and report.error is None
    assert len(reads) <= MAX_READS, (len(reads), reads)
    assert len(reads) == len(set(reads))  # nothing read twice
    assert ("deployments", "get") not in reads and ("pods", "list") not in reads
