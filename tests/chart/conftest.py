"""Fixtures for the chart tests: one parametrized fixture per values set, each rendered once (chart_render.render)."""

from __future__ import annotations

import pytest
from chart_render import VALUES, Rendered, render


@pytest.fixture(params=sorted(VALUES))
def values_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def rendered(values_name: str) -> Rendered:
    return render(VALUES[values_name])
