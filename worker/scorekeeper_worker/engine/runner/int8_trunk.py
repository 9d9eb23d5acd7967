"""`--quantization int8`: the model's trunk as an OpenVINO int8 model, behind the same interface as a padded trunk.

The engine runs a trunk on right-padded blocks of similar-length rows (engine/runner/forward.padded_hidden): called with
`input_ids`, `attention_mask`, `position_ids` (and `token_type_ids`), it returns `.last_hidden_state`. `Int8Trunk`
answers that call from an OpenVINO model, so packing, batching, pooling and the model's own heads (float32 torch, on
gathered rows) stay the engine's. Quantization is post-training and static (NNCF, transformer preset): weights int8
per channel, activations int8 with ranges measured on calibration blocks that went through the engine itself
(`RecordingTrunk`), so they have exactly the shapes and inputs served blocks have. Everything that is not int8
runs in float32 (OpenVINO's CPU default would be bfloat16 on CPUs that have it). OpenVINO and NNCF are the optional
`cpu-int8` extra; docs/operations.md says why OpenVINO rather than ONNX Runtime.

Accuracy first (docs/benchmarks.md, "int8 accuracy"): by default the feed-forward output projections of the first
`FLOAT32_FFN_LAYERS` layers stay float32 (their inputs, the activation function's outputs, are the activations int8
handles worst), found by role rather than by name so any encoder gets them (`ffn_output_modules`), and SmoothQuant
moves less of each activation's range into the weights than NNCF's transformer preset does
(`SMOOTH_QUANT_ALPHA` 0.8 instead of 0.95). `--quantization-float32-modules` replaces the default modules."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scorekeeper_worker.model.loader import ScoringModel

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "position_ids", "token_type_ids")
FLOAT32_FFN_LAYERS = 3  # the first layers whose feed-forward output projection stays float32 by default
SMOOTH_QUANT_ALPHA = 0.8  # SmoothQuant's migration strength for matrix products (NNCF's transformer preset: 0.95)


class Int8Unavailable(RuntimeError):
    """The model cannot run in int8 here (the extra is not installed, or its trunk does not convert)."""


@dataclass
class TrunkOutput:
    last_hidden_state: torch.Tensor


class _Hidden(torch.nn.Module):
    """The trunk with the padded call signature, returning only the hidden states (what is converted)."""

    def __init__(self, trunk: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.trunk, self.names = trunk, names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.trunk(**dict(zip(self.names, tensors, strict=True))).last_hidden_state


class RecordingTrunk:
    """Records every block the engine would run (calibration data in the exact form served blocks take) and
    answers zeros: only the inputs are wanted."""

    def __init__(self, hidden_size: int) -> None:
        self.hidden_size = hidden_size
        self.blocks: list[dict[str, np.ndarray]] = []

    def __call__(self, **inputs: torch.Tensor) -> TrunkOutput:
        self.blocks.append({name: tensor.numpy().copy() for name, tensor in inputs.items()})
        return TrunkOutput(torch.zeros(*inputs["input_ids"].shape, self.hidden_size))


class Int8Trunk:
    """A compiled OpenVINO model called like a padded trunk (torch tensors in, torch hidden states out)."""

    def __init__(self, compiled: Any, names: tuple[str, ...]) -> None:
        self.compiled, self.names = compiled, names
        self.request = compiled.create_infer_request()  # the model thread is its only caller

    def __call__(self, **inputs: torch.Tensor) -> TrunkOutput:
        feed = [inputs[name].numpy() for name in self.names]
        hidden = self.request.infer(feed)[0]
        return TrunkOutput(torch.from_numpy(np.array(hidden, dtype=np.float32)))


def _imports() -> tuple[Any, Any]:
    try:
        import nncf
        import openvino
    except ImportError as error:
        raise Int8Unavailable("--quantization int8 needs OpenVINO and NNCF, the worker's cpu-int8 extra "
                              f"(pip install 'scorekeeper[cpu-int8]'): {error}") from None
    return openvino, nncf


def ffn_output_modules(trunk: torch.nn.Module, hidden_size: int, layers: int = FLOAT32_FFN_LAYERS
                       ) -> tuple[str, ...]:
    """The module paths (as exact patterns) of the feed-forward output projections of the trunk's first `layers`
    layers: the linear layers that project a wider width back to the model's width (BERT's `output.dense`,
    ModernBERT's `mlp.Wo`, DistilBERT's `ffn.lin2`), in the trunk's module order, one per layer. Empty when the trunk
    has no such layer (then every linear layer is int8)."""
    found = [name for name, module in trunk.named_modules() if isinstance(module, torch.nn.Linear)
             and module.out_features == hidden_size and module.in_features > hidden_size]
    return tuple(re.escape(name) for name in found[:layers])


def quantized_model(model: ScoringModel, calibration: list[dict[str, np.ndarray]],
                    float32_modules: tuple[str, ...] | None = None) -> tuple[Any, tuple[str, ...]]:
    """Convert the float32 trunk (with torch's SDPA attention, which converts) and quantize it on the calibration
    blocks: the OpenVINO model and its input names. `float32_modules`: regular expressions of trunk module paths
    (`encoder.layer.[0-2].output.dense`) whose linear layers stay float32; None: `ffn_output_modules`."""
    openvino, nncf = _imports()
    if float32_modules is None:
        float32_modules = ffn_output_modules(model.trunk, model.hidden_size)
    names = tuple(name for name in INPUTS if name in calibration[0])
    example = tuple(torch.from_numpy(calibration[0][name]) for name in names)
    wrapper = _Hidden(model.trunk, names).eval()
    restore = model.model.config._attn_implementation
    model.model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode(False), torch.no_grad():
            converted = openvino.convert_model(wrapper, example_input=example)
    except Exception as error:  # the converter's failures are many and specific to architectures
        raise Int8Unavailable(f"the {type(model.trunk).__name__} trunk does not convert to OpenVINO: "
                              f"{type(error).__name__}: {error}") from None
    finally:
        model.model.set_attn_implementation(restore)
    for port, name in zip(converted.inputs, names, strict=True):
        port.get_tensor().set_names({name})
    dataset = nncf.Dataset(calibration, lambda block: tuple(block[name] for name in names))
    # Converted nodes are named after the module path: "__module.trunk.encoder.layer.0.output.dense/aten::linear/…"
    patterns = [rf"__module\.trunk\.(?:{path})/.*" for path in float32_modules]
    linears = [op.get_friendly_name() for op in converted.get_ops() if op.get_type_name() == "MatMul"]
    for path, pattern in zip(float32_modules, patterns, strict=True):
        if not any(re.fullmatch(pattern, name) for name in linears):
            modules = sorted({name.removeprefix("__module.trunk.").split("/")[0] for name in linears})
            raise Int8Unavailable(f"--quantization-float32-modules: {path!r} matches no linear layer of the trunk; "
                                  f"its linear layers are {modules[:4]} … ({len(modules)} in all)")
    ignored = nncf.IgnoredScope(patterns=patterns, validate=False)
    advanced = nncf.AdvancedQuantizationParameters(
        smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=SMOOTH_QUANT_ALPHA))
    quantized = nncf.quantize(converted, dataset, model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(calibration), ignored_scope=ignored, advanced_parameters=advanced)
    return quantized, names


def quantize(model: ScoringModel, calibration: list[dict[str, np.ndarray]], threads: int,
             float32_modules: tuple[str, ...] | None = None) -> Int8Trunk:
    """`quantized_model`, compiled for this CPU with `threads` threads."""
    openvino, _ = _imports()
    if float32_modules is None:  # resolved here too: the start-up log names the modules kept float32
        float32_modules = ffn_output_modules(model.trunk, model.hidden_size)
    quantized, names = quantized_model(model, calibration, float32_modules)
    compiled = openvino.Core().compile_model(quantized, "CPU", {
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
    log.info("int8 trunk: %s quantized on %d calibration blocks (float32 kept: %s), %d threads",
             type(model.trunk).__name__, len(calibration), list(float32_modules) or "none", threads)
    return Int8Trunk(compiled, names)
