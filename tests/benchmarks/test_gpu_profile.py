"""bench/gpu/gpu_profile.py on CPU (`--cpu-dry-run`): every step the next GPU run takes first works here, and the
kernel-name classification that compiled kernels fall back to puts the issue's kernels where the profile put them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import gpu_profile

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def test_cpu_dry_run_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.json"
    assert gpu_profile.main(["--cpu-dry-run", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (arm,) = report["arms"]
    assert arm["arm"] == "plain" and arm["requests"] == 4 and arm["kernels_per_pass"] > 50
    assert set(arm["ms_per_category"]) == set(gpu_profile.CATEGORIES)
    assert all(arm["ms_per_category"][c] > 0 for c in ("gemm", "attention", "norms", "rotary", "other"))
    tiles = report["tiles"]
    assert tiles["visited"] == tiles["full"] + tiles["partial"] and 0 < tiles["allowed_share"] <= 1
    assert tiles["visited"] < tiles["tiles_in_bucket"]
    printed = capsys.readouterr().out
    assert "| whole pass (ms, median) |" in printed and "tiles:" in printed
    # SGLang's benchmark bucket, counted with Qwen3-0.6B's geometry: the Triton kernel computes about half of what
    # flex's 128×128 tiles do, and never fewer pairs than the mask allows (the figures docs/gpu.md quotes).
    real = report["attention_work"]["8192"]
    assert real["allowed_pairs_per_head"] <= real["kernel_pairs_per_head"] < 0.6 * real["flex_pairs_per_head"]
    assert real["kernel_tflop"] <= 0.5 < real["flex_tflop"]


@pytest.mark.parametrize(("kernel", "category"), [
    ("triton_tem_fused_flex_attention_0", "attention"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("triton_red_fused__to_copy_add_cat_mean_mul_neg_pow_rsqrt_0", "rotary"),  # q/k norm fused with the rotary
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "norms"),
    ("triton_poi_fused_mul_silu_2", "other"),
])
def test_compiled_kernels_are_classified_by_name(kernel: str, category: str) -> None:
    assert gpu_profile.by_name(kernel) == category
