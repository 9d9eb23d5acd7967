"""The command line: every setting is a documented flag, and also settable from a config file or environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from scorekeeper_worker.cli import parse_config
from scorekeeper_worker.config import WorkerConfig


def test_help_documents_every_setting() -> None:
    result = subprocess.run([sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--help"],
                            capture_output=True, text=True, check=True)
    for name in WorkerConfig.model_fields:
        assert "--" + name.replace("_", "-") in result.stdout, name
        assert "SCOREKEEPER_" + name.upper() in result.stdout, name


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
