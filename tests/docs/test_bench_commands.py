"""Every `bench/…` command the documents name still runs: the path exists in the current layout
(`bench/<group>/<script>`), the script answers `--help` (exit 0, a usage line, no GPU or model needed) and knows every
flag the documents pass it. A script the documents name by its file name alone, with arguments, must be named by its
path. Each distinct script is run once, in a subprocess, with a timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", REPO / "bench" / "README.md", REPO / "tests" / "README.md",
               *(REPO / "docs").rglob("*.md")])
HELP_TIMEOUT_S = 300  # torch's import alone takes seconds on a loaded 2-core machine

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_SPAN = re.compile(r"(`+)((?:(?!\1).)+?)\1", re.S)
_PATH = re.compile(r"(?<![\w./-])bench/[\w./-]*[\w/]")
_INVOCATION = re.compile(r"(?P<python>python[\w.]*\s+)?(?<![\w./-])(?P<path>bench/\w+/\w+\.(?:py|sh))\b"
                         r"(?P<args>(?:[^\n#|;&)`\\]|\\\n|\\(?!\n))*)")
_FLAG = re.compile(r"(?<![\w=-])--[a-zA-Z][\w-]*")
SCRIPTS = {p.name: p for p in (REPO / "bench").glob("*/*") if p.suffix in {".py", ".sh"}}
_BARE = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(name) for name in sorted(SCRIPTS)) + r")[ \t]+[-\w.]")


def code_of(markdown: str) -> list[str]:
    """The fenced blocks and inline code spans of a markdown text, where commands are written."""
    fences = [m.group() for m in _FENCE.finditer(markdown)]
    rest = _FENCE.sub("", markdown)
    return fences + [m.group(2) for m in _SPAN.finditer(rest)]


def invocations(code: str) -> list[tuple[str, set[str]]]:
    """(script path, flags) of each `bench/<group>/<script>` that `code` runs: after `python`, with arguments, or a
    shell script; the flags are those on its command line (up to a comment, a pipe or another command)."""
    return [(m["path"], set(_FLAG.findall(m["args"]))) for m in _INVOCATION.finditer(code)
            if m["python"] or m["args"].strip() or m["path"].endswith(".sh")]


def _doc_texts() -> dict[Path, str]:
    return {doc: doc.read_text() for doc in DOCS}


def _named() -> dict[str, set[str]]:
    """Every bench script the documents run, with the union of the flags they pass it."""
    flags: dict[str, set[str]] = {}
    for text in _doc_texts().values():
        for code in code_of(text):
            for path, used in invocations(code):
                flags.setdefault(path, set()).update(used)
    return flags


NAMED = _named()


def test_extraction() -> None:
    doc = ("Run `bench/cpu/a.py --x 1 --y=2 # not --z` or\n```bash\nFOO=1 .venv/bin/python bench/load/b.py --p \\\n"
           "    --q --worker-arg=--compile=on   # --r\nbench/gpu/run.sh out 510\n```\nnot `bench/cpu/c.py` alone\n")
    found = [inv for code in code_of(doc) for inv in invocations(code)]
    assert sorted(found) == [("bench/cpu/a.py", {"--x", "--y"}), ("bench/gpu/run.sh", set()),
                             ("bench/load/b.py", {"--p", "--q", "--worker-arg"})]


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_bench_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    missing = sorted({p for p in _PATH.findall(text) if not (REPO / p).exists()})
    assert not missing, f"{doc.relative_to(REPO)} names bench paths that do not exist: {missing}"
    flat = sorted({p for p in _PATH.findall(text) if p.endswith((".py", ".sh")) and p.count("/") != 2})
    assert not flat, f"{doc.relative_to(REPO)} names scripts outside bench/<group>/: {flat}"
    bare = sorted({m.group(1) for code in code_of(text) for m in _BARE.finditer(code)})
    paths = ", ".join(SCRIPTS[name].relative_to(REPO).as_posix() for name in bare)
    assert not bare, f"{doc.relative_to(REPO)} runs bench scripts by file name alone: {bare}; write {paths}"


def _help(path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "worker"),
                                                                      os.environ.get("PYTHONPATH")])),
           "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "1000"}
    command = [sys.executable, path, "--help"] if path.endswith(".py") else ["bash", path, "--help"]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=HELP_TIMEOUT_S)


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess[str]]:
    """`--help` of every named script that can answer it, run in parallel (each one imports torch, most of them)."""
    runnable = [p for p in NAMED if (REPO / p).exists() and (p.endswith(".py") or "--help" in (REPO / p).read_text())]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(runnable, pool.map(_help, runnable), strict=True))


def test_the_docs_name_bench_commands() -> None:
    assert "bench/cpu/bench_cpu.py" in NAMED and "bench/gpu/run.sh" in NAMED, sorted(NAMED)


@pytest.mark.parametrize("path", sorted(NAMED))
def test_named_command_answers_help(path: str, helps: dict[str, subprocess.CompletedProcess[str]]) -> None:
    assert (REPO / path).is_file(), f"the docs run {path}, which does not exist"
    assert path in helps, (f"{path} has no --help: a shell script the docs name must print its usage and exit 0 on "
                           f"--help (for example: case ${{1:-}} in -h|--help) sed -n 2,20p \"$0\"; exit 0;; esac)")
    result = helps[path]
    assert result.returncode == 0 and "usage" in result.stdout.lower(), (
        f"{path} --help exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    unknown = sorted(flag for flag in NAMED[path] if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])",
                                                                   result.stdout))
    assert not unknown, f"the docs pass {path} flags its --help does not list: {unknown}"
