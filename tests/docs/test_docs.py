"""Documentation checks: the generated configuration reference is current and complete, and relative links resolve."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG_DOC = REPO / "docs" / "configuration.md"
GENERATOR = REPO / "scripts" / "gen_config_docs.py"
SUPPORT_DOC = REPO / "docs" / "support-matrix.md"
SUPPORT_GENERATOR = REPO / "scripts" / "gen_support_matrix.py"
LINKED_DOCS = sorted([p for p in [REPO / "README.md"] if p.exists()] + list((REPO / "docs").glob("*.md")))


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
