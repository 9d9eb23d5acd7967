"""A ScoringModel parsed from the harness's spec, and the Deployment rendered from it (pure render tests)."""

from __future__ import annotations

from typing import Any

from harness import scoring_model
from scorekeeper_operator.render.manifests import render
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings


def model_from(**spec: Any) -> ScoringModel:
    body = scoring_model(**spec)
    body["metadata"].update(uid="u", generation=1)
    return ScoringModel.from_body(body)


def deployment_of(**spec: Any) -> dict[str, Any]:
    manifests = render(model_from(**spec), OperatorSettings(), service_monitor_api=False).manifests
    found: dict[str, Any] = next(m for m in manifests if m["kind"] == "Deployment")
    return found
