"""The typed spec: same defaults as the CRD, the CRD's rules repeated, and the checks only the operator can make."""

from __future__ import annotations

from typing import Any

import crd_tools
import pytest
from harness import scoring_model
from scorekeeper_operator.spec.model import InvalidSpec, RolloutStrategy, ScoringModel, ScoringModelSpec
from scorekeeper_operator.spec.settings import DEFAULT_WORKER_IMAGE, OperatorSettings

VALID = crd_tools.valid_samples()
INVALID = crd_tools.invalid_samples()


@pytest.mark.parametrize("doc", VALID, ids=lambda d: d["metadata"]["name"])
def test_crd_defaults_equal_the_operator_defaults(doc: dict[str, Any]) -> None:
    """Whether the API server filled the defaults in or not, the operator sees the same spec."""
    defaulted = crd_tools.apply_defaults(crd_tools.version_schema(), doc)
    assert ScoringModelSpec.model_validate(defaulted["spec"]) == ScoringModelSpec.model_validate(doc["spec"])


@pytest.mark.parametrize("doc", INVALID, ids=lambda d: d["metadata"]["name"])
def test_operator_repeats_the_crd_rules(doc: dict[str, Any]) -> None:
    """An object that got past the API anyway (older CRD, validation off) still becomes InvalidSpec."""
    with pytest.raises(InvalidSpec):
        ScoringModel.from_body(doc)


@pytest.mark.parametrize(("spec", "message"), [
    ({"extraArgs": ["--served", "x"]}, "abbreviates) --served-name"),
    ({"extraArgs": ["--cuda-graph-max=9"]}, "--cuda-graph-max-tokens"),
    ({"scheduling": {"affinity": {"nodeAfinity": {}}}}, "unknown keys ['nodeAfinity']"),
    ({"scoring": {"multiItem": {"maxItemsPerRequest": 0}}}, "spec.scoring.multiItem.maxItemsPerRequest"),
    ({"model": {"uri": "hf://just-a-name"}}, "hf://org/name"),
    ({"model": {"uri": "pvc://models/x"}, "surprise": 1}, "spec.surprise: Extra inputs are not permitted"),
    ({"scoring": {"promptTemplate": "{query}{item}{item}"}}, "spec.scoring: scoring.promptTemplate must be"),
    ({"scoring": {"labelTokens": [" yes", " yes"]}}, "scoring.labelTokens must be distinct"),
    ({"scoring": {"labelTokens": ["yes,no"]}}, "spec.scoring.labelTokens.0: String should match pattern"),
    ({"scoring": {"labelTokens": " yes, no"}}, "spec.scoring.labelTokens: Input should be a valid"),
])
def test_what_the_schema_cannot_catch_is_named_precisely(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        ScoringModel.from_body(scoring_model(**spec))
    assert message in str(caught.value)


def test_these_pass_the_crd_but_not_the_operator() -> None:
    """The API accepts these (argparse abbreviations; affinity is passed through unchecked): ConfigValid=False is
    their only signal."""
    for spec in ({"extraArgs": ["--served", "x"]}, {"scheduling": {"affinity": {"nodeAfinity": {}}}}):
        crd_tools.admit(scoring_model(**spec))
        with pytest.raises(InvalidSpec):
            ScoringModel.from_body(scoring_model(**spec))


@pytest.mark.parametrize(("spec", "strategy"), [
    ({"resources": {"gpu": {"count": 1}}}, RolloutStrategy.RECREATE),
    ({"resources": {"gpu": {"count": 1}}, "replicas": 3}, RolloutStrategy.ROLLING_UPDATE),
    ({"resources": {"gpu": {"count": 1}}, "autoscaling": {"enabled": True}}, RolloutStrategy.ROLLING_UPDATE),
    ({}, RolloutStrategy.ROLLING_UPDATE),
    ({"rollout": {"strategy": "Recreate"}}, RolloutStrategy.RECREATE),
])
def test_rollout_strategy_default(spec: dict[str, Any], strategy: RolloutStrategy) -> None:
    assert ScoringModel.from_body(scoring_model(**spec)).spec.rollout_strategy is strategy


def test_cuda_graphs_default_to_on_exactly_with_a_gpu() -> None:
    assert ScoringModel.from_body(scoring_model(resources={"gpu": {"count": 1}})).spec.cuda_graph_enabled
    assert not ScoringModel.from_body(scoring_model()).spec.cuda_graph_enabled
    assert ScoringModel.from_body(scoring_model(cudaGraph={"enabled": True})).spec.cuda_graph_enabled


def test_identity_and_served_name() -> None:
    body = scoring_model("m1")
    body["metadata"].update(uid="u", generation=4)
    model = ScoringModel.from_body(body)
    assert (model.name, model.namespace, model.uid, model.generation, model.served_name) == ("m1", "ml", "u", 4, "m1")
    named = ScoringModel.from_body(scoring_model(model={"uri": "pvc://m", "servedName": "public"}))
    assert named.served_name == "public"


def test_integer_quantities_become_strings() -> None:
    spec = ScoringModel.from_body(scoring_model(resources={"cpu": 4, "memory": "8Gi"})).spec
    assert (spec.resources.cpu, spec.resources.memory) == ("4", "8Gi")


def test_settings_from_env() -> None:
    assert OperatorSettings.from_env({}).worker_image == DEFAULT_WORKER_IMAGE
    settings = OperatorSettings.from_env({"SCOREKEEPER_WORKER_IMAGE": "r/w:2", "SCOREKEEPER_NAMESPACE": "a, b",
                                          "SCOREKEEPER_ALLOW_HF_DOWNLOAD": "false",
                                          "SCOREKEEPER_RETRY_BASE_SECONDS": "1", "SCOREKEEPER_RETRY_MAX_SECONDS": "5",
                                          "SCOREKEEPER_RESYNC_SECONDS": "120", "SCOREKEEPER_POLL_SECONDS": "10"})
    assert settings.worker_image == "r/w:2" and settings.namespaces == ("a", "b")
    assert not settings.allow_hf_download
    assert [settings.retry_delay(n) for n in range(5)] == [1, 2, 4, 5, 5]
    assert (settings.resync_seconds, settings.poll_seconds) == (120, 10)
    assert (OperatorSettings().resync_seconds, OperatorSettings().poll_seconds) == (600, 30)
