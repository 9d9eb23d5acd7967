"""Documentation checks: the generated configuration reference is current and complete, relative links resolve, and
links to a heading name one that exists."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import unicodedata
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG_DOC = REPO / "docs" / "configuration.md"
GENERATOR = REPO / "scripts" / "gen_config_docs.py"
SUPPORT_DOC = REPO / "docs" / "support-matrix.md"
SUPPORT_GENERATOR = REPO / "scripts" / "gen_support_matrix.py"
LINKED_DOCS = sorted([p for p in [REPO / "README.md", REPO / "bench" / "README.md", REPO / "tests" / "README.md"]
                      if p.exists()] + list((REPO / "docs").rglob("*.md")))


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_doc_is_generated_and_current() -> None:
    generator = _generator()
    expected = generator.render()
    current = CONFIG_DOC.read_text() if CONFIG_DOC.exists() else ""
    assert current == expected, (
        f"docs/configuration.md is stale (worker flags, the CRD or the operator's flag rendering changed); "
        f"regenerate it with: python {GENERATOR.relative_to(REPO)}")


def test_support_matrix_doc_is_generated_and_current() -> None:
    spec = importlib.util.spec_from_file_location("gen_support_matrix", SUPPORT_GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert SUPPORT_DOC.read_text() == module.render(), (
        f"docs/support-matrix.md is stale (worker/scorekeeper_worker/model/support.py changed); regenerate it with: "
        f"python {SUPPORT_GENERATOR.relative_to(REPO)}")


def _serve_help(monkeypatch: pytest.MonkeyPatch) -> str:
    from scorekeeper_worker.cli import build_parser

    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help text at hyphens; keep every flag on one line
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--help"])
    assert exited.value.code == 0
    return out.getvalue()


def test_every_serve_flag_is_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    from scorekeeper_worker.cli import build_parser

    text = _serve_help(monkeypatch)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    serve = next(a for a in build_parser()._actions if a.dest == "command").choices["serve"]  # type: ignore[union-attr]
    declared = {o for a in serve._actions for o in a.option_strings if o.startswith("--")}
    assert declared <= flags, f"serve --help is missing declared flags {sorted(declared - flags)}"
    doc = CONFIG_DOC.read_text()
    missing = [f for f in sorted(flags) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", doc)]
    assert not missing, (f"flags in `scorekeeper-worker serve --help` but not in docs/configuration.md: {missing}; "
                         f"regenerate it with: python {GENERATOR.relative_to(REPO)}")


_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)


def relative_links(markdown: str) -> list[str]:
    """Link targets that point into the repository: no scheme (http:, mailto:), no pure #anchors; code excluded."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", markdown))
    targets = _INLINE_LINK.findall(text) + _REFERENCE_LINK.findall(text)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


def test_link_extraction() -> None:
    sample = ("See [a](docs/a.md#x), ![img](img/p.png \"t\"), [web](https://x.org), [anchor](#top), "
              "`[code](nope.md)`.\n```\n[fenced](nope2.md)\n```\n[ref]: ../b.md\n")
    assert relative_links(sample) == ["docs/a.md#x", "img/p.png", "../b.md"]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=[str(p.relative_to(REPO)) for p in LINKED_DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in relative_links(doc.read_text()):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)} links to files that do not exist: {broken}"



def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text without code marks and link targets, lower case, spaces as hyphens,
    every character dropped that is not a letter, a digit, a mark, `_`, `-` or a space."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.replace("`", "")).strip().lower()
    kept = (c for c in text if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc")
    return "".join(kept).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of a document's headings; a repeated heading gets -1, -2, … as on GitHub."""
    found: set[str] = set()
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", _FENCE.sub("", markdown), re.M):
        anchor = base = heading_anchor(match.group(1))
        repeat = 0
        while anchor in found:
            repeat += 1
            anchor = f"{base}-{repeat}"
        found.add(anchor)
    return found


def test_heading_anchor() -> None:
    assert heading_anchor("Garbage-collector pauses before and after `--gc-freeze`") == \
        "garbage-collector-pauses-before-and-after---gc-freeze"
    assert heading_anchor("Throughput at a latency SLO (`bench_load.py`)") == "throughput-at-a-latency-slo-bench_loadpy"
    assert heading_anchor("Decisions: 16 questions about one 2,048-token input") == \
        "decisions-16-questions-about-one-2048-token-input"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n### B ##\n") == {"a", "a-1", "b"}


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=[str(p.relative_to(REPO)) for p in LINKED_DOCS])
def test_link_anchors_resolve(doc: Path) -> None:
    """A link to a heading (`file.md#heading` or `#heading`) names a heading of that document."""
    text = doc.read_text()
    code_free = _CODE_SPAN.sub("", _FENCE.sub("", text))
    targets = relative_links(text) + [t for t in _INLINE_LINK.findall(code_free) if t.startswith("#")]
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        if anchor and linked.suffix == ".md" and linked.is_file() and anchor not in anchors(linked.read_text()):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)} links to headings that do not exist: {broken}"


# The pages that give the current answer stay readable; superseded runs go to docs/history/ (issue 47).
PAGE_LINES = {"docs/benchmarks.md": 400, "docs/gpu.md": 300}


@pytest.mark.parametrize(("page", "most"), PAGE_LINES.items())
def test_current_answer_pages_stay_short(page: str, most: int) -> None:
    lines = len((REPO / page).read_text().splitlines())
    assert lines <= most, f"{page}: {lines} lines (at most {most}): move superseded runs to docs/history/"
