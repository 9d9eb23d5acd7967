"""`--quantization-float32-modules`: the linear layers of the named trunk modules stay float32 in the int8 model
(no quantizer on their inputs), every other linear layer is quantized; a pattern that is not a regular expression is
refused with the flag's name."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError
from scorekeeper_worker.base.config import DType, WorkerConfig
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.engine.runner.int8_trunk import (
    FLOAT32_FFN_LAYERS,
    Int8Unavailable,
    RecordingTrunk,
    ffn_output_modules,
    quantized_model,
)
from scorekeeper_worker.model.loader import load_model
from scorekeeper_worker.serving.startup.probe_texts import calibration_requests
from scorekeeper_worker.serving.startup.quantization import text_scores

pytest.importorskip("nncf")  # the cpu-int8 extra, installed by the test set-up


def _quantized_linears(name: str, tiny_model: Callable[[str], Path], keep: tuple[str, ...] | None
                       ) -> dict[str, bool]:
    """Module path → whether its MatMul reads a quantized activation."""
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    recording = RecordingTrunk(model.hidden_size)
    text_scores(model, Executor(model, trunk=recording), calibration_requests()[:2], 8192)
    quantized, _ = quantized_model(model, recording.blocks, keep)
    linears = {}
    for op in quantized.get_ops():
        if op.get_type_name() == "MatMul" and "aten::linear" in op.get_friendly_name():
            path = op.get_friendly_name().removeprefix("__module.trunk.").split("/")[0]
            inputs = [op.input_value(i).get_node().get_type_name() for i in range(op.get_input_size())]
            linears[path] = "FakeQuantize" in inputs
    return linears


def test_named_modules_stay_float32(tiny_model: Callable[[str], Path]) -> None:
    everything = _quantized_linears("bert-cross", tiny_model, ())
    kept = _quantized_linears("bert-cross", tiny_model, (r"encoder.layer.[0].output.dense",
                                                         r"encoder.layer.1.attention.self.(query|key)"))
    assert everything["encoder.layer.0.output.dense"] and everything["encoder.layer.1.output.dense"]
    assert everything["encoder.layer.1.attention.self.query"] and everything["encoder.layer.1.attention.self.key"]
    assert not kept["encoder.layer.0.output.dense"]
    assert not kept["encoder.layer.1.attention.self.query"] and not kept["encoder.layer.1.attention.self.key"]
    assert kept["encoder.layer.1.output.dense"] and kept["encoder.layer.1.attention.self.value"]
    assert sum(kept.values()) < sum(everything.values())


@pytest.mark.parametrize(("name", "projections"), [
    ("bert-cross", ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]),
    ("xlmr-cross", ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]),
    ("deberta-v2-cross", ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]),
    ("modernbert-cross", ["layers.0.mlp.Wo", "layers.1.mlp.Wo", "layers.2.mlp.Wo"]),
    ("bert-embed", ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]),
])
def test_the_default_finds_the_feed_forward_output_projections(name: str, projections: list[str],
                                                                tiny_model: Callable[[str], Path]) -> None:
    """By shape (a wider width back to the model's), in layer order, one per layer: not by a BERT name."""
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    assert ffn_output_modules(model.trunk, model.hidden_size, layers=9) == tuple(re.escape(p) for p in projections)
    assert ffn_output_modules(model.trunk, model.hidden_size, layers=1) == (re.escape(projections[0]),)
    assert ffn_output_modules(model.trunk, model.hidden_size) == \
        tuple(re.escape(p) for p in projections[:FLOAT32_FFN_LAYERS])


def test_unset_keeps_the_default_and_empty_keeps_nothing(tiny_model: Callable[[str], Path]) -> None:
    default = _quantized_linears("bert-cross", tiny_model, None)
    nothing = _quantized_linears("bert-cross", tiny_model, ())
    assert not default["encoder.layer.0.output.dense"] and not default["encoder.layer.1.output.dense"]
    assert default["encoder.layer.0.intermediate.dense"] and default["encoder.layer.1.attention.output.dense"]
    assert all(nothing.values())
    assert WorkerConfig(model=Path("m")).quantization_float32_modules is None
    assert WorkerConfig(model=Path("m"), quantization_float32_modules="").quantization_float32_modules == ()


def test_a_pattern_that_matches_no_linear_layer_is_refused(tiny_model: Callable[[str], Path]) -> None:
    with pytest.raises(Int8Unavailable, match=r"'encoder.layers.0.output.dense' matches no linear layer"):
        _quantized_linears("bert-cross", tiny_model, ("encoder.layers.0.output.dense",))  # "layers": a typo


def test_a_pattern_must_be_a_regular_expression() -> None:
    assert WorkerConfig(model=Path("m"), quantization_float32_modules="a.b, c.[0-2].d").quantization_float32_modules \
        == ("a.b", "c.[0-2].d")
    with pytest.raises(ValidationError, match=r"quantization_float32_modules.*not a regular expression"):
        WorkerConfig(model=Path("m"), quantization_float32_modules="encoder.layer.[0")
