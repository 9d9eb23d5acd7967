"""The images' names, read from the one place that sets them: the chart (values.yaml repositories, Chart.yaml
appVersion, which must equal pyproject.toml's version); and the torch CPU build that the CPU worker gets (the
project's torch pin, +cpu). Prints shell assignments for scripts/images.sh.

Usage: python scripts/image_names.py [REGISTRY]  (REGISTRY, e.g. registry.example.com/ml, replaces the repositories'
registry and path, keeping the image names)
"""

from __future__ import annotations

import shlex
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "scorekeeper"
CPU_SUFFIX = "-cpu"  # the worker built with torch's CPU build (scripts/images.sh) is tagged <version>-cpu


def version() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    if chart != project:
        raise SystemExit(f"Chart.yaml appVersion {chart} != pyproject.toml version {project}: make them equal")
    return str(chart)


def torch_cpu_version() -> str:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["worker"]
    pin = next(dep for dep in extra if dep.startswith("torch=="))
    return pin.removeprefix("torch==") + "+cpu"


def repositories(registry: str | None = None) -> dict[str, str]:
    """{"operator": repository, "worker": repository}: the chart's defaults, or the same names under `registry`."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    found = {"operator": values["image"]["repository"], "worker": values["workerImage"]["repository"]}
    if registry:
        found = {key: f"{registry.rstrip('/')}/{repo.rsplit('/', 1)[1]}" for key, repo in found.items()}
    return found


def main(argv: list[str]) -> None:
    repos = repositories(argv[0] if argv else None)
    tag = version()
    names = {"VERSION": tag, "OPERATOR_IMAGE": f"{repos['operator']}:{tag}",
             "WORKER_IMAGE": f"{repos['worker']}:{tag}{CPU_SUFFIX}", "TORCH_CPU_VERSION": torch_cpu_version()}
    for key, value in names.items():
        print(f"{key}={shlex.quote(value)}")


if __name__ == "__main__":
    main(sys.argv[1:])
