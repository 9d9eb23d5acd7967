"""The documents and the code's comments speak of the project (releases, dates, commits, machines), not of whoever
wrote them: no work `session`, no `as before` without saying before what, no `the sixth run`.

Kept: pytest's `scope="session"` (`session-scoped` fixtures), process sessions (`start_new_session`, `setsid`, `a
session of its own`, `process session`: the kernel's term, which autogroups follow) and code spans (identifiers).
Only comments and docstrings of code are read, never its strings or names. Phrases are matched across line breaks.
"""

from __future__ import annotations

import ast
import bisect
import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", REPO / "bench" / "README.md", REPO / "tests" / "README.md",
               *(REPO / "docs").rglob("*.md")])
CODE_FOLDERS = ["worker", "operator", "bench", "tests", "scripts", "deploy", "charts"]
HASH_COMMENTED = {".sh", ".yaml", ".yml", ".tpl", ".toml", ".cfg", ".txt"}
SKIPPED_PARTS = {".venv", "node_modules", "__pycache__", ".cache", ".git"}

ALLOWED = re.compile(r"""`[^`]*`|start_new_session|setsid|scope=["']session["']|session-scoped|process sessions?|"""
                     r"""sessions? of (?:its|their) own""", re.I)
FORBIDDEN = [
    (re.compile(r"\bsessions?\b", re.I), "'session': name the release, date, commit or machine"),
    (re.compile(r"\bas before\b(?!\s+(?:the|this|that|issue|commit|\d))", re.I), "'as before': say before what"),
    (re.compile(r"\bthe (?:second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) (?:run|call)s?\b", re.I),
     "an ordinal run: name its date or commit"),
]


def findings(lines: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line, why) for what speaks of its writer rather than of the project, in `lines` (line number, text) read as
    one text: indentation and comment markers at line starts are dropped, so a phrase may span lines."""
    starts: list[int] = []
    numbers: list[int] = []
    parts: list[str] = []
    offset = 0
    for number, line in lines:
        text = re.sub(r"^\s*(?:#+\s*)?", "", line)
        starts.append(offset)
        numbers.append(number)
        parts.append(text)
        offset += len(text) + 1
    joined = " ".join(parts)
    kept = ALLOWED.sub(lambda m: re.sub(r"\S", " ", m.group()), joined)
    return [(numbers[bisect.bisect_right(starts, match.start()) - 1], f"{why}: {match.group()!r}")
            for pattern, why in FORBIDDEN for match in pattern.finditer(kept)]


def python_comments(source: str) -> Iterator[list[tuple[int, str]]]:
    """Each run of consecutive comment lines, and each docstring, of a Python module, as (line, text) pairs."""
    run: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            if run and token.start[0] != run[-1][0] + 1:
                yield run
                run = []
            run.append((token.start[0], token.string))
    if run:
        yield run
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield [(first.lineno + i, line) for i, line in enumerate(first.value.value.splitlines())]


def hash_comments(source: str) -> Iterator[list[tuple[int, str]]]:
    run: list[tuple[int, str]] = []
    for number, line in enumerate(source.splitlines(), 1):
        at = line.find("#")
        if at >= 0 and (at == 0 or line[at - 1].isspace()):
            run.append((number, line[at:]))
        elif run:
            yield run
            run = []
    if run:
        yield run


def code_files(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*") if p.is_file() and not SKIPPED_PARTS & set(p.parts)
                  and (p.suffix in HASH_COMMENTED | {".py", ".md"} or p.name == "Dockerfile"))


def comment_findings(path: Path) -> list[str]:
    source = path.read_text(errors="replace")
    if path.suffix == ".md":
        blocks: Iterable[list[tuple[int, str]]] = [list(enumerate(source.splitlines(), 1))]
    elif path.suffix == ".py":
        blocks = python_comments(source)
    else:
        blocks = hash_comments(source)
    return [f"{path.relative_to(REPO)}:{number}: {why}" for block in blocks for number, why in findings(block)]


def test_findings() -> None:
    def lines(text: str) -> list[tuple[int, str]]:
        return list(enumerate(text.splitlines(), 1))

    assert findings(lines("the 2026-11-28 H200 run, as before issue 35; `sessions`; a session\nof its own")) == []
    assert findings(lines('scope="session"; session-scoped; start_new_session=True; process\n  # sessions')) == []
    assert [n for n, _ in findings(lines("the fifth session's ratio,\nas before. The sixth\nrun"))] == [1, 2, 2]
    blocks = list(python_comments('"""doc\nsession"""\nx = 1  # a session\n# two\ny = "session"\n'))
    assert blocks == [[(3, "# a session"), (4, "# two")], [(1, "doc"), (2, "session")]]


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_docs_speak_of_the_project(doc: Path) -> None:
    found = comment_findings(doc)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("folder", CODE_FOLDERS)
def test_code_comments_speak_of_the_project(folder: str) -> None:
    found = [finding for path in code_files(folder) for finding in comment_findings(path)]
    assert not found, "\n".join(found)
