"""The docs name only files that exist: a reader who follows a link or a path finds it.

README.md and docs/*.md are scanned for relative Markdown links (``[text](path)``, images
too) and for backticked repository paths (`statestore/node/writer.py`, `node/writer.py`,
`docs/x.md`, `bench/x.py`, `tests/x.py`, `node/dashboard/`). A link is resolved from the
file that holds it; a backticked path from the repository root, or for a module named the
way the docs name them (`core/ids.py`) from the package that holds it, or from the file
that holds it (a path in a link's text). The lab notebooks under docs/notes/ keep history,
so only their links are checked: a path there may name a file as it was on the day of the
run.

Not paths, so not checked: URLs and anchors, anything inside a fenced code block (commands,
their output), and backticked text with a placeholder or a pattern in it (``*``, ``{``,
``<``, a part in capitals such as ``DIR/node.json``), or that is not shaped like a file
(``net/writes.REST`` names an attribute, ``/v1/sync/have`` a route, ``ring://q/path`` a
URL).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def _root() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


ROOT = _root()
# Where a backticked path like `core/ids.py` may live: the root, then the packages.
BASES = ("", "statestore", "client", "spark_connector", "spark_connector/java")
SUFFIXES = (".py", ".md", ".java", ".toml", ".yml", ".yaml", ".json", ".png", ".txt", ".sh")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TICKED = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"[\w.-]+(?:/[\w.-]+)+/?")
PLACEHOLDERS = ("*", "{", "<", "...")
CAPITALS = re.compile(r"(?:^|/)[A-Z][A-Z0-9_]*(?:/|$)")  # DIR/, /NAME: a placeholder


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _notes() -> list[Path]:
    return sorted((ROOT / "docs" / "notes").glob("*.md"))


def _prose(path: Path) -> str:
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def broken_links(doc: Path) -> list[str]:
    """The relative link targets in ``doc`` that name no file or directory."""
    broken = []
    for target in LINK.findall(_prose(doc)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:, ring:) or an anchor in this page
        if not (doc.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    return broken


def is_repo_path(text: str) -> bool:
    """Whether backticked ``text`` is shaped like a file or directory of this repository."""
    if any(p in text for p in PLACEHOLDERS) or CAPITALS.search(text):
        return False
    if not PATHLIKE.fullmatch(text):
        return False
    return text.endswith("/") or text.endswith(SUFFIXES)


def missing_paths(doc: Path) -> list[str]:
    """The backticked repository paths in ``doc`` that exist under no base (nor beside it)."""
    bases = [ROOT / base for base in BASES] + [doc.parent]
    missing = []
    for text in TICKED.findall(_prose(doc)):
        if is_repo_path(text) and not any((base / text).exists() for base in bases):
            missing.append(text)
    return missing


@pytest.mark.parametrize("doc", [*_docs(), *_notes()], ids=_rel)
def test_every_relative_link_names_a_file(doc: Path) -> None:
    assert broken_links(doc) == [], f"{_rel(doc)} links to files that do not exist"


@pytest.mark.parametrize("doc", _docs(), ids=_rel)
def test_every_backticked_path_exists(doc: Path) -> None:
    assert missing_paths(doc) == [], f"{_rel(doc)} names files that do not exist"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("statestore/node/writer.py", True),
        ("core/ids.py", True),
        ("docs/benchmarks.md", True),
        ("node/dashboard/", True),
        ("tests/testdata/{reroute,repair}/*.txt", False),
        ("net/writes.REST", False),
        ("/v1/sync/have", False),
        ("ring://NAME/path", False),
        ("DIR/node.json", False),
        ("--data-dir data/n4", False),
    ],
)
def test_what_counts_as_a_path(text: str, path: bool) -> None:
    assert is_repo_path(text) is path


def test_the_scan_sees_links_and_paths(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "See [this](gone.md#part), [that](https://example.com) and `bench/gone.py`.\n"
        "```sh\npython bench/also_gone.py `bench/in_a_fence.py`\n```\n",
        encoding="utf-8",
    )
    assert broken_links(doc) == ["gone.md#part"]
    assert missing_paths(doc) == ["bench/gone.py"]
