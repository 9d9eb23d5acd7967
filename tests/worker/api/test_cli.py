"""The command line: every setting is a documented flag, and also settable from a config file or environment."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scorekeeper_worker.base.config import WorkerConfig
from scorekeeper_worker.cli import build_parser, parse_config


def test_help_documents_every_setting() -> None:
    result = subprocess.run([sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--help"],
                            capture_output=True, text=True, check=True)
    for name in WorkerConfig.model_fields:
        assert "--" + name.replace("_", "-") in result.stdout, name
        assert "SCOREKEEPER_" + name.upper() in result.stdout, name


def test_help_states_each_default_once_and_in_words() -> None:
    """No `PydanticUndefined` for the required --model, no Python `None`, and a flag whose text says its default in
    its own words (`(default: no timeout)`) gets no second one."""
    result = subprocess.run([sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--help"],
                            capture_output=True, text=True, check=True)
    assert "PydanticUndefined" not in result.stdout and "default: None" not in result.stdout
    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    helps = {action.option_strings[0]: action.help or "" for action in serve._actions if action.option_strings}
    twice = {flag: text for flag, text in helps.items() if text.count("(default") > 1}
    assert twice == {}
    assert helps["--model"].endswith("(required; env SCOREKEEPER_MODEL)")
    assert helps["--request-timeout-seconds"].endswith(
        "(default: no timeout) (env SCOREKEEPER_REQUEST_TIMEOUT_SECONDS)")
    assert helps["--metrics-port"].endswith("(default: none; env SCOREKEEPER_METRICS_PORT)")


def test_precedence_flag_over_environment_over_file(tmp_path: Path) -> None:
    config_file = tmp_path / "worker.yaml"
    config_file.write_text("max_batch_tokens: 1000\nmax_queue_tokens: 5000\nport: 9000\ncuda_graph: true\n")
    environ = {"SCOREKEEPER_MAX_QUEUE_TOKENS": "6000", "SCOREKEEPER_PORT": "9100", "SCOREKEEPER_MODEL": "/m"}
    config = parse_config(["serve", "--config", str(config_file), "--port", "9200",
                           "--cuda-graph-token-buckets", "64,128"], environ)
    assert config.model == Path("/m")
    assert config.max_batch_tokens == 1000  # file
    assert config.max_queue_tokens == 6000  # environment beats file
    assert config.port == 9200  # flag beats both
    assert config.cuda_graph is True
    assert config.cuda_graph_token_buckets == (64, 128)


def test_delimiter_implies_multi_item_scoring() -> None:
    config = parse_config(["serve", "--model", "/m", "--multi-item-scoring-delimiter", "151643"], {})
    assert config.mis_enabled and not config.multi_item_scoring


@pytest.mark.parametrize("args", [
    ["--cuda-graph-token-buckets", "512,256"],
    ["--cuda-graph-token-buckets", "256,99999"],
    ["--dtype", "float64"],
    ["--port", "0"],
])
def test_invalid_settings_are_refused(args: list[str]) -> None:
    with pytest.raises((SystemExit, ValueError)):
        parse_config(["serve", "--model", "/m", *args], {})


@pytest.mark.parametrize(("spelling", "expected"), [("on", True), ("ON", True), ("yes", True), ("1", True),
                                                    ("true", True), ("off", False), ("no", False), ("0", False),
                                                    ("False", False)])
def test_boolean_environment_values_accept_the_usual_spellings(spelling: str, expected: bool) -> None:
    config = parse_config(["serve", "--model", "/m"], {"SCOREKEEPER_CUDA_GRAPH": spelling})
    assert config.cuda_graph is expected


def _serve(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SCOREKEEPER_")}
    return subprocess.run([sys.executable, "-m", "scorekeeper_worker.cli", "serve", *args],
                          capture_output=True, text=True, env={**environ, **(env or {})}, timeout=120)


@pytest.mark.parametrize(("args", "env", "named"), [
    ([], {"SCOREKEEPER_LOG_LEVEL": "verbose"}, "SCOREKEEPER_LOG_LEVEL"),
    ([], {"SCOREKEEPER_CUDA_GRAPH": "maybe"}, "SCOREKEEPER_CUDA_GRAPH"),
    ([], {"SCOREKEEPER_PORT": "eighty"}, "SCOREKEEPER_PORT"),
    (["--port", "eighty"], {}, "--port"),
    (["--max-batch-tokens", "4"], {}, "--max-batch-tokens"),
    (["--no-such-flag"], {}, "--no-such-flag"),
    (["--metrics-port", "8000", "--port", "8000"], {}, "--metrics-port"),
    (["--api-key-file", "/nonexistent/keys"], {}, "/nonexistent/keys"),
], ids=["log level", "boolean env", "int env", "int flag", "bound", "unknown flag", "port clash", "key file"])
def test_configuration_errors_are_one_line_and_exit_2(args: list[str], env: dict[str, str], named: str) -> None:
    result = _serve(["--model", "/m", *args], env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("scorekeeper-worker: error: ") and named in lines[0], lines[0]


def test_config_file_errors_name_the_file(tmp_path: Path) -> None:
    config_file = tmp_path / "worker.yaml"
    config_file.write_text("max_batch_tokens: 1000\nmax_batch_tokenz: 2000\n")
    result = _serve(["--model", "/m", "--config", str(config_file)])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert str(config_file) in result.stderr and "max_batch_tokenz" in result.stderr


def test_empty_api_key_file_refuses_to_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# no key yet\n\n")
    result = _serve(["--model", "/m", "--api-key-file", str(keys)])
    assert result.returncode == 2 and "no key" in result.stderr, result.stderr


def test_default_bind_address_is_loopback() -> None:
    assert parse_config(["serve", "--model", "/m"], {}).host == "127.0.0.1"


def test_the_worker_bounds_onednn_s_and_ideep_s_caches_before_torch_loads() -> None:
    """Set by the CLI itself (a variable in the Dockerfile alone would miss pip installs), before torch is imported:
    oneDNN reads it once. An operator's own value wins. The server module is replaced by a probe that reports what
    it finds when `serve` hands over."""
    probe = ("import os, sys, types\n"
             "report = lambda config: print('capacity', os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'),"
             " 'ideep', os.environ.get('LRU_CACHE_CAPACITY'), 'torch', 'torch' in sys.modules)\n"
             "sys.modules['scorekeeper_worker.api.server'] = types.SimpleNamespace(run=report)\n"
             "from scorekeeper_worker import cli\n"
             "cli.main(['serve', '--model', 'm'])\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    for given, expected in ((None, ("64", "128")), ("0", ("0", "0"))):
        if given is not None:
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = env["LRU_CACHE_CAPACITY"] = given
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["capacity", expected[0], "ideep", expected[1], "torch", "False"], out.stdout
