"""bench/gpu/gpu_check.py and bench/gpu/gpu_mis.py on CPU: the scripts a lent GPU machine runs for minutes must not
fail there for reasons a CPU shows (their first GPU run found test batches with more items than slots)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tiny_models
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.library import token_batches
from scorekeeper_worker.model.loader import load_model

REPO = Path(__file__).resolve().parents[2]

from bench.gpu import gpu_mis  # noqa: E402


def test_mis_batch_is_the_single_item_sequences(tmp_path: Path) -> None:
    model = load_model(tiny_models.build("qwen3-cls3", tmp_path), DType.FLOAT32, "cpu", "qwen3-cls3")
    unit, singles = gpu_mis.mis_batch(model, query_len=20, items=7, item_len=5, delimiter=3)
    assert unit.num_tokens == 21 + 7 * 6 and [u.num_tokens for u in singles] == [25] * 7
    for i, single in enumerate(singles):  # the item's tokens, read at its last token, after the same query
        assert single.context == unit.context[:20] + unit.items[i][:-1]
    batches = token_batches(singles, 60, lambda unit: unit.num_tokens)
    assert [len(b) for b in batches] == [2, 2, 2, 1]
    with torch.inference_mode():
        mis = pooled_rows(model, build_inputs([unit], model.device))
        single = torch.cat([pooled_rows(model, build_inputs(b, model.device)) for b in batches])
    torch.testing.assert_close(mis, single, rtol=1e-5, atol=1e-5)


def test_cpu_dry_run_passes_every_check(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = subprocess.run([sys.executable, str(REPO / "bench" / "gpu" / "gpu_check.py"), "--cpu-dry-run", "--quick",
                             "--buckets", "64,256,512", "--out", str(out)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["failures"] == []
    (run,) = report["runs"]
    for layout in ("dense", "flex"):  # every bucket and batch kind compared, the multi-item batch included
        buckets = run[layout]["buckets"]
        assert sorted(buckets, key=int) == ["64", "256", "512"]
        assert all(b[kind]["ok"] for b in buckets.values() for kind in ("single", "multi-item", "mixed"))
    assert run["mis"]["64x10"]["ok"] and run["mis"]["64x10"]["mis_tokens"] == 65 + 10 * 17
