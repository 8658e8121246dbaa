"""The docs' marked blocks: every `<!-- report:NAME -->` ... `<!-- /report:NAME -->` of README.md, docs/*.md and
the results' NOTEs, what it says now against what `TABLES` makes of the result files, and their rewrite."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .formatting import REPO
from .result_tables import TABLES

DOC_FILES = ("README.md", "docs/*.md", "benchmarks/results/**/NOTE.md")

MARKER = re.compile(r"(<!-- report:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S)


@dataclass
class Block:
    """One marked table in one doc: what it says now and what the result files say."""
    doc: Path
    name: str
    current: str
    wanted: str


def doc_files(root: Path = REPO) -> list[Path]:
    return sorted({p for pattern in DOC_FILES for p in root.glob(pattern)})


def place(doc: Path) -> Path:
    """Where ``doc`` sits in the repository: itself, or for a copy elsewhere (a test's) the same place by its
    folders (a NOTE under .../benchmarks/results/..., a page under .../docs/, else the top)."""
    if doc.is_relative_to(REPO):
        return doc
    if "benchmarks" in doc.parts:
        return REPO.joinpath(*doc.parts[len(doc.parts) - doc.parts[::-1].index("benchmarks") - 1:])
    return REPO / "docs" / doc.name if doc.parent.name == "docs" else REPO / doc.name


def render(name: str, results_dir: Path, doc: Path | None = None) -> str:
    """A table's text between its markers (ending in a newline, so the closing marker keeps its own line),
    its links made relative to ``doc``'s folder (tables link from docs/; a NOTE or the README is elsewhere)."""
    if name not in TABLES:
        raise KeyError(name)
    text = TABLES[name](results_dir).rstrip("\n") + "\n"
    if doc is None or place(doc).parent == REPO / "docs":
        return text
    folder = place(doc).parent
    return re.sub(r"\]\(\.\./([^)\s]+)\)",
                  lambda m: f"]({os.path.relpath(REPO / m[1], folder)})", text)


def blocks(docs: Sequence[Path], results_dir: Path) -> list[Block]:
    """Every marked block of the docs, with its generated text; an unknown table name is an error."""
    found = []
    for doc in docs:
        for m in MARKER.finditer(doc.read_text()):
            if m["name"] not in TABLES:
                from sbon.errors import SBoNError  # here only: importing sbon loads torch, which a check never needs

                raise SBoNError(f"{doc.name}: unknown report table '{m['name']}' (known: {', '.join(TABLES)})")
            found.append(Block(doc, m["name"], m["body"], render(m["name"], results_dir, doc)))
    return found


def rewrite(doc: Path, results_dir: Path) -> bool:
    """Rewrite one doc's marked blocks; True when its text changed."""
    text = doc.read_text()
    new = MARKER.sub(lambda m: m[1] + render(m["name"], results_dir, doc) + m[4], text)
    if new != text:
        doc.write_text(new)
    return new != text


def stale(docs: Sequence[Path], results_dir: Path) -> list[str]:
    """`doc: table` for every block whose text differs from what the result files say."""
    return [f"{b.doc.relative_to(REPO) if b.doc.is_relative_to(REPO) else b.doc}: {b.name}"
            for b in blocks(docs, results_dir) if b.current != b.wanted]
