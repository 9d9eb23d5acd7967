"""Fixtures of the conformance suite: one directory for every variant's checkpoint, built once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def variants_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conformance")
