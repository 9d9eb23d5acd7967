"""How much one request raises a real worker's peak resident memory (issue 48, defect 1: 4,096 one-token items ×
290 label tokens on a tiny qwen3 causal LM of hidden 512 took +2.4 GiB, for 4.5 MiB of scores). Target: ≤ 100 MiB.

A worker (default flags, float32) serves the tiny qwen3 causal LM rebuilt at hidden 512 (tests/support/tiny_models.py)
from the worker source given by --worker-path (this checkout by default; pass an older checkout's worker/ to compare).
After a warm-up with 8 items, three requests are sent once each: one item (little of anything), the same 4,096 items
with 2 labels (the trunk's full batch: 8,192 tokens, at most --max-batch-tokens, as any full batch of any request
takes), then with 290 labels. Before each, the worker's peak-RSS mark (VmHWM) is read and reset
(`/proc/PID/clear_refs`: 5); the table gives the peak during the request against the RSS before it, and how far it
raised the worker's peak so far. With --cold the 2-label request is left out, so the 290-label one also pays
for the worker's first full batch.

    python bench/http/bench_request_peak.py [--worker-path /path/to/other/checkout/worker] [--labels 290] [--cold]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import REPO, Worker, log, machine_note, markdown_table

HIDDEN = 512
QUERY, FIRST_ITEM_ID = [5], 10


def _status_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _body(items: int, labels: int) -> dict[str, Any]:
    return {"query": QUERY, "items": [[FIRST_ITEM_ID + i % 200] for i in range(items)],
            "label_token_ids": list(range(labels)), "apply_softmax": True}


def _peak_of(worker: Worker, body: dict[str, Any]) -> tuple[float, float, float, int]:
    """(RSS before, the worker's peak RSS before, the peak RSS during the request, status), in MiB."""
    pid = worker.proc.pid
    peak_before = _status_mib(pid, "VmHWM")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak mark (VmHWM) := the current RSS
    before = _status_mib(pid, "VmRSS")
    response = worker.client.post("/v1/score", json=body)
    return before, peak_before, _status_mib(pid, "VmHWM"), response.status_code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker-path", type=Path, default=REPO / "worker")
    parser.add_argument("--items", type=int, default=4096)
    parser.add_argument("--labels", type=int, default=290, help="label tokens per item (the tiny vocabulary: 300)")
    parser.add_argument("--cold", action="store_true", help="leave out the full batch with 2 labels: the label "
                        "request then also pays for the first full batch through the trunk")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests" / "support"))
    import tiny_models

    path = tiny_models.build("qwen3-causal", tempfile.mkdtemp(prefix="request-peak-"), variant=f"hidden{HIDDEN}",
                             config_edits={"hidden_size": HIDDEN})
    worker = Worker(path, "float32", env={"PYTHONPATH": str(args.worker_path.resolve())})
    rows = []
    try:
        worker.client.post("/v1/score", json=_body(8, args.labels))  # warm-up: a small request of the same kind
        full_batch = [] if args.cold else [(args.items, 2)]
        for items, labels in [(1, args.labels), *full_batch, (args.items, args.labels)]:
            before, peak_before, peak, status = _peak_of(worker, _body(items, labels))
            log(f"{items} items × {labels} labels: RSS {before:.0f} MiB, peak {peak:.0f} MiB ({status})")
            rows.append([f"{items:,} items × {labels} labels", f"{items * labels * 8 / 2**20:.1f}", f"{before:.0f}",
                         f"{peak:.0f}", f"{peak - before:+.0f}", f"{peak_before:.0f}",
                         f"{max(0.0, peak - peak_before):+.0f}", str(status)])
    finally:
        worker.close()
    print(machine_note())
    print(f"worker source: {args.worker_path} (load: {os.getloadavg()[0]:.1f}); model: tiny qwen3 causal LM, "
          f"hidden {HIDDEN}, float32")
    print(markdown_table(["request", "scores (MiB, float64)", "RSS before", "peak during it", "peak − RSS before",
                          "worker's peak before", "worker's peak raised by", "status"], rows))
    print("(MiB; each request once, in this order, after a warm-up of 8 items)")


if __name__ == "__main__":
    main()
