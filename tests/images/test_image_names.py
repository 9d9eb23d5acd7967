"""One set of image names: the chart's repositories and appVersion (the one place that sets them) agree with
pyproject.toml's version, the Dockerfile's labels and build commands, the operator's default worker image, what
scripts/images.sh builds and pushes, and the commands in the README and docs/deploy.md."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from scorekeeper_operator.spec import settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "scorekeeper"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
REPOSITORIES = {"operator": VALUES["image"]["repository"], "worker": VALUES["workerImage"]["repository"]}


def image_names(*registry: str) -> dict[str, str]:
    """What scripts/image_names.py tells scripts/images.sh to build (or push, under `registry`)."""
    printed = subprocess.run([sys.executable, str(REPO / "scripts" / "image_names.py"), *registry],
                             capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in printed.split())


def stage_labels() -> dict[str, dict[str, str]]:
    """LABELs per stage of the Dockerfile (values with their ${ARG} references unexpanded)."""
    parser = DockerfileParser(str(REPO / "Dockerfile"))
    labels: dict[str, dict[str, str]] = {}
    stage = ""
    for item in parser.structure:
        if item["instruction"] == "FROM":
            stage = item["value"].split()[-1]
        elif item["instruction"] == "LABEL":
            for key, value in re.findall(r'(\S+)="([^"]*)"', item["value"]):
                labels.setdefault(stage, {})[key] = value
    return labels


def test_the_release_version_is_the_same_everywhere() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    dockerfile = re.search(r"^ARG VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert dockerfile
    assert APP_VERSION == project == dockerfile.group(1)
    assert image_names()["VERSION"] == APP_VERSION


@pytest.mark.parametrize("target", ["operator", "worker"])
def test_the_image_labels_name_the_charts_images(target: str) -> None:
    labels = stage_labels()[target]
    assert labels["org.opencontainers.image.title"] == REPOSITORIES[target].rsplit("/", 1)[1]
    assert labels["org.opencontainers.image.version"] == "${VERSION}"  # scripts/images.sh passes the version


def test_the_operators_default_worker_image_is_the_charts() -> None:
    assert f"{REPOSITORIES['worker']}:{APP_VERSION}" == settings.DEFAULT_WORKER_IMAGE


@pytest.mark.parametrize("path", ["Dockerfile", "docs/deploy.md"])
def test_the_build_commands_tag_the_charts_images(path: str) -> None:
    text = (REPO / path).read_text()
    for target, repository in REPOSITORIES.items():
        tags = re.findall(rf"--target {target}\s+(?:--build-arg \S+ )*-t (\S+)", text)
        assert tags, f"{path}: no build command for {target}"
        assert all(tag.startswith(f"{repository}:{APP_VERSION}") for tag in tags), tags


def test_images_sh_builds_the_charts_images() -> None:
    names = image_names()
    assert names["OPERATOR_IMAGE"] == f"{REPOSITORIES['operator']}:{APP_VERSION}"
    assert names["WORKER_IMAGE"] == f"{REPOSITORIES['worker']}:{APP_VERSION}-cpu"


@pytest.mark.parametrize("path", ["README.md", "docs/deploy.md"])
def test_the_documented_install_takes_the_images_images_sh_pushed(path: str) -> None:
    """`scripts/images.sh push REGISTRY`, then `helm install --set ...`: the values name exactly what was pushed."""
    text = (REPO / path).read_text()
    registry = re.search(r"scripts/images\.sh push (\S+)", text)
    assert registry, f"{path} does not show how to push the images"
    pushed = image_names(registry.group(1))
    given = dict(re.findall(r"--set (image\.repository|workerImage\.repository|workerImage\.tag)=(\S+)", text))
    assert f"{given['image.repository']}:{APP_VERSION}" == pushed["OPERATOR_IMAGE"]
    assert f"{given['workerImage.repository']}:{given['workerImage.tag']}" == pushed["WORKER_IMAGE"]


def test_the_examples_run_the_charts_worker_image() -> None:
    for path in (REPO / "examples").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "ScoringModel":
                assert "image" not in doc["spec"], f"{path.name}: examples use the chart's default worker image"
