"""spec.compile: the worker's --compile flags, and start-up time allowed for the compile where the worker compiles."""

from __future__ import annotations

from typing import Any

import pytest
from scorekeeper_operator.spec.flags import worker_config
from scorekeeper_operator.spec.model import InvalidSpec
from spec_helpers import deployment_of, model_from

GPU = {"resources": {"gpu": {"count": 1}}}


def startup_failures(deployment: dict[str, Any]) -> int:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return int(container["startupProbe"]["failureThreshold"])


def test_the_default_leaves_the_choice_to_the_worker() -> None:
    config = worker_config(model_from(**GPU))
    assert config["compile"] == "auto" and config["compile_budget_seconds"] == 600
    assert "compile_cache_dir" not in config  # the pod's cache emptyDir (TORCHINDUCTOR_CACHE_DIR)


def test_on_renders_the_flags_and_allows_the_budget_at_start_up() -> None:
    spec = {**GPU, "rollout": {"maxStartupSeconds": 600, "schedulingDeadlineSeconds": 120},
            "compile": {"mode": "on", "budgetSeconds": 300, "cacheDir": "/compile-cache"}}
    config = worker_config(model_from(**spec))
    assert (config["compile"], config["compile_budget_seconds"], config["compile_cache_dir"]) == \
        ("on", 300, "/compile-cache")
    deployment = deployment_of(**spec)
    assert startup_failures(deployment) == 90  # (600 + 300) s / 10 s
    assert deployment["spec"]["progressDeadlineSeconds"] == 600 + 300 + 120


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_no_allowance_where_the_worker_does_not_compile(mode: str) -> None:
    # auto: the worker keeps compiling off until a GPU run proves it (AUTO_COMPILES_ON_GPU)
    deployment = deployment_of(**GPU, rollout={"maxStartupSeconds": 600}, compile={"mode": mode})
    assert startup_failures(deployment) == 60


def test_the_cache_dir_is_an_absolute_path() -> None:
    with pytest.raises(InvalidSpec, match=r"compile\.cacheDir"):
        model_from(compile={"cacheDir": "relative/dir"})
