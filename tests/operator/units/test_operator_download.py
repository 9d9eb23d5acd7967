"""The hf:// init container as the operator renders it, run for real: its command and environment, with the pod's
paths moved under a temporary directory, against a fake Hub on loopback. One commit, only the files a model needs,
the size limit checked before any download, a complete cache reused without a request, pods racing on one cache,
private repositories, air-gapped operators, and errors a user can act on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_hub import FakeHub
from render_cases import container, model_from
from scorekeeper_operator.render.manifests import render
from scorekeeper_operator.spec.settings import OperatorSettings
from scorekeeper_worker.model.hub_download import COMPLETE_MARKER, DownloadError, select_files

# A sentence-transformers repository as the Hub has it: one model in five formats, plus everything else.
MINILM_REPO = {
    ".gitattributes": b"*.bin filter=lfs", "README.md": b"# MiniLM", "config.json": b'{"model_type": "bert"}',
    "config_sentence_transformers.json": b"{}", "data_config.json": b"[]", "modules.json": b"[]",
    "sentence_bert_config.json": b"{}", "special_tokens_map.json": b"{}", "tokenizer.json": b"{}",
    "tokenizer_config.json": b"{}", "vocab.txt": b"[PAD]\n", "train_script.py": b"print()",
    "1_Pooling/config.json": b"{}", "model.safetensors": b"S" * 4000, "pytorch_model.bin": b"B" * 4000,
    "tf_model.h5": b"H" * 4000, "rust_model.ot": b"R" * 4000, "onnx/model.onnx": b"O" * 4000,
    "onnx/config.json": b"{}", "openvino/openvino_model.bin": b"V" * 4000,
}
NEEDED = {"config.json", "config_sentence_transformers.json", "data_config.json", "modules.json",
          "sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
          "vocab.txt", "1_Pooling/config.json", "model.safetensors"}
POD_PATHS = {"/models": "models", "/var/cache/scorekeeper": "cache", "/tmp": "tmp"}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub().running() as running:
        yield running


def init_container(hub: FakeHub, source: dict[str, Any], **settings: Any) -> dict[str, Any]:
    model = model_from({"model": source})
    rendered = render(model, OperatorSettings(hf_endpoint=hub.url, **settings), service_monitor_api=False)
    return container(rendered, "download-model")


def pod_env(init: dict[str, Any], root: Path, **secrets: str) -> dict[str, str]:
    """The container's environment with the pod's paths under `root`, and `secrets` as the kubelet would resolve
    valueFrom entries."""
    def local(value: str) -> str:
        for pod_path, directory in POD_PATHS.items():
            if value == pod_path or value.startswith(pod_path + "/"):
                return str(root / directory) + value[len(pod_path):]
        return value

    env = {e["name"]: local(e["value"]) for e in init["env"] if "value" in e}
    return {**env, **secrets, "PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def command(init: dict[str, Any]) -> list[str]:
    assert init["command"][0] == "python"
    return [sys.executable, *init["command"][1:]]


def run(init: dict[str, Any], root: Path, **secrets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(init), env=pod_env(init, root, **secrets), capture_output=True, text=True,
                          timeout=120, check=False)


def snapshot(root: Path, repo: str, commit: str) -> Path:
    return root / "models" / repo / commit


def files_in(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {COMPLETE_MARKER}


def test_downloads_only_the_needed_files_of_the_pinned_commit(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.commit("sentence-transformers/minilm", MINILM_REPO)
    hub.commit("sentence-transformers/minilm", {**MINILM_REPO, "model.safetensors": b"moved on"})  # main moves
    init = init_container(hub, {"uri": "hf://sentence-transformers/minilm", "revision": commit})
    result = run(init, tmp_path)
    assert result.returncode == 0, result.stderr
    target = snapshot(tmp_path, "sentence-transformers/minilm", commit)
    assert files_in(target) == NEEDED
    assert (target / "model.safetensors").read_bytes() == MINILM_REPO["model.safetensors"]  # the pinned commit's
    fetched = {path.split(f"/resolve/{commit}/", 1)[1] for method, path in hub.requests
               if method == "GET" and "/resolve/" in path}
    assert fetched == NEEDED
    assert all(commit in path for _, path in hub.requests if "/resolve/" in path or "/revision/" in path)
    assert [p.name for p in target.parent.iterdir()] == [commit]  # no partial directory left behind


def test_a_complete_cache_is_used_without_a_request(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.commit("org/name", MINILM_REPO)
    init = init_container(hub, {"uri": "hf://org/name", "revision": commit, "cache": {"claimName": "hub"}})
    assert run(init, tmp_path).returncode == 0
    before = len(hub.requests)
    again = run(init, tmp_path)  # the next pod, a restart, another ScoringModel of the same commit
    assert again.returncode == 0 and "already in" in again.stdout
    assert len(hub.requests) == before


def test_pods_racing_to_fill_one_cache_both_succeed(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.commit("org/name", MINILM_REPO)
    init = init_container(hub, {"uri": "hf://org/name", "revision": commit, "cache": {"claimName": "hub"}})
    processes = [subprocess.Popen(command(init), env=pod_env(init, tmp_path), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in processes]
    assert [code for code, _ in results] == [0, 0], results
    target = snapshot(tmp_path, "org/name", commit)
    assert files_in(target) == NEEDED and (target / COMPLETE_MARKER).is_file()
    assert [p.name for p in target.parent.iterdir()] == [commit]


def test_the_size_limit_is_checked_before_anything_is_downloaded(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.commit("org/name", MINILM_REPO)
    init = init_container(hub, {"uri": "hf://org/name", "revision": commit, "downloadSizeLimit": "3000"})
    result = run(init, tmp_path)
    assert result.returncode == 1
    assert "exceed model.downloadSizeLimit" in result.stderr and "model.cache" in result.stderr
    assert not any("/resolve/" in path for _, path in hub.requests)
    assert not (tmp_path / "models").exists()  # not even a partial directory


def test_one_gguf_file_of_a_repository(hub: FakeHub, tmp_path: Path) -> None:
    files = {"README.md": b"#", "m-Q4_K_M.gguf": b"G" * 100, "m-Q8_0.gguf": b"G" * 200, "m-f16.gguf": b"G" * 400}
    commit = hub.commit("org/m-GGUF", files)
    result = run(init_container(hub, {"uri": "hf://org/m-GGUF/m-Q4_K_M.gguf", "revision": commit}), tmp_path)
    assert result.returncode == 0, result.stderr
    assert files_in(snapshot(tmp_path, "org/m-GGUF", commit)) == {"m-Q4_K_M.gguf"}


def test_a_private_repository_downloads_with_the_models_token_only(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.commit("org/secret", MINILM_REPO, private=True)
    init = init_container(hub, {"uri": "hf://org/secret", "revision": commit, "tokenSecretRef": {"name": "hf"}})
    (token,) = [e for e in init["env"] if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    refused = run(init, tmp_path)
    assert refused.returncode == 1 and "downloading org/secret@" in refused.stderr
    assert run(init, tmp_path, HF_TOKEN=hub.token).returncode == 0


def test_an_air_gapped_pod_only_checks_the_cache(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.commit("org/name", MINILM_REPO)
    source = {"uri": "hf://org/name", "revision": commit, "cache": {"claimName": "hub"}}
    offline = init_container(hub, source, allow_hf_download=False)
    missing = run(offline, tmp_path)
    assert missing.returncode == 1 and "not in the model cache" in missing.stderr and hub.requests == []
    assert run(init_container(hub, source), tmp_path).returncode == 0  # seeded where the Hub is reachable
    seeded = len(hub.requests)
    assert run(offline, tmp_path).returncode == 0 and len(hub.requests) == seeded


def test_a_cache_the_pod_cannot_write_is_named_before_the_hub_is_asked(hub: FakeHub, tmp_path: Path) -> None:
    """Most CSI drivers do not apply fsGroup to ReadWriteMany volumes: a root-owned shared cache."""
    commit = hub.commit("org/name", MINILM_REPO)
    init = init_container(hub, {"uri": "hf://org/name", "revision": commit, "cache": {"claimName": "hub-cache"}})
    # sysfs refuses to create files for every user, root included (tests may run as root, which permission bits
    # do not stop)
    env = pod_env(init, tmp_path) | {"HF_TARGET": f"/sys/kernel/org/name/{commit}"}
    result = subprocess.run(command(init), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert "/sys/kernel/org/name is not writable by uid" in result.stderr
    assert "fsGroup" in result.stderr and "examples/reranker-gpu.yaml" in result.stderr
    assert hub.requests == []


# -- the file selection itself -----------------------------------------------------------------------------------------
def test_select_files_for_sharded_and_sentence_transformers_models() -> None:
    assert set(select_files(list(MINILM_REPO))) == NEEDED
    sharded = ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
               "merges.txt", "vocab.json", "tokenizer.model", "chat_template.jinja", "pytorch_model-00001.bin",
               "original/consolidated.00.pth", "original/params.json", "2_Dense/model.safetensors",
               "2_Dense/config.json", "images/logo.png"]
    assert set(select_files(sharded)) == set(sharded) - {"pytorch_model-00001.bin", "original/consolidated.00.pth",
                                                         "original/params.json", "images/logo.png"}


@pytest.mark.parametrize(("files", "gguf", "message"), [
    (["config.json", "pytorch_model.bin"], None, "no .safetensors weights; convert the weights"),
    (["README.md", "a.Q4.gguf", "a.Q8.gguf"], None, "name one as hf://<org>/<name>/a.Q4.gguf"),
    (["model.safetensors", "tokenizer.json"], None, "no config.json"),
    (["a.Q4.gguf"], "a.Q5.gguf", "no file 'a.Q5.gguf'"),
])
def test_select_files_explains_what_is_missing(files: list[str], gguf: str | None, message: str) -> None:
    with pytest.raises(DownloadError, match=message.replace(".", r"\.")):
        select_files(files, gguf)
