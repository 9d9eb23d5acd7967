"""bench/gpu/gpu_attention.py on CPU: the layout, the plan, flex and the Triton kernel (under Triton's interpreter)
against the reference; a missing flashinfer is reported in the JSON, not fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import gpu_attention

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def test_cpu_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "attention.json"
    assert gpu_attention.main(["--cpu-dry-run", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["live"] == 4 * (25 + 3 * 31) and report["plan"]["requests"] == 5  # four groups and the padding
    assert report["flex"]["max_abs_diff"] < 1e-5 and report["triton"]["max_abs_diff"] < 1e-5
    assert "flashinfer" in report and ("error" in report["flashinfer"] or report["flashinfer"]["max_abs_diff"] < 1e-5)
