"""The docs say what the result files say, and every link in them leads somewhere.

No model: `benchmarks.report` reads JSON only, so these run in seconds."""

import re
import shutil
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.report import doc_blocks, formatting, result_tables, tracing
from sbon.errors import SBoNError

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = DOCS + tracing.notes()  # pages whose links are checked: the docs and the results' NOTEs
# Pages another branch writes: a link to one is checked once the page exists.
WRITTEN_ELSEWHERE = {ROOT / "docs" / "space.md"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_every_generated_table_matches_the_result_files():
    assert doc_blocks.stale(doc_blocks.doc_files(), formatting.RESULTS) == []


def test_every_table_of_the_registry_is_in_a_doc():
    used = {b.name for b in doc_blocks.blocks(doc_blocks.doc_files(), formatting.RESULTS)}
    assert set(result_tables.TABLES) == used


def copy_of_the_docs(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path / "docs" / "benchmarks.md"


def test_check_names_the_table_that_differs_and_a_rewrite_fixes_it(tmp_path):
    doc = copy_of_the_docs(tmp_path)
    text = doc.read_text()
    body = doc_blocks.MARKER.search(text, text.index("<!-- report:engine -->"))["body"]
    doc.write_text(text.replace(body, body.replace("1.61x", "9.99x"), 1))
    assert [line.split(": ")[1] for line in doc_blocks.stale([doc], formatting.RESULTS)] == ["engine"]

    assert doc_blocks.rewrite(doc, formatting.RESULTS)
    assert doc.read_text() == text and doc_blocks.stale([doc], formatting.RESULTS) == []


def test_check_exits_non_zero_when_a_doc_is_stale(tmp_path, monkeypatch, capsys):
    doc = copy_of_the_docs(tmp_path)
    text = doc.read_text()
    doc.write_text(text.replace("<!-- /report:memory -->", "a hand-typed line\n<!-- /report:memory -->", 1))
    monkeypatch.setattr(doc_blocks, "doc_files", lambda root=ROOT: [doc])
    args = report_args("--check")
    assert report.main(args) == 1
    assert "memory" in capsys.readouterr().err
    doc.write_text(text)
    assert report.main(args) == 0


def report_args(*argv):
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    report.add_parser(sub)
    return sub.choices["report"].parse_args(list(argv))


def test_an_unknown_table_name_is_a_one_line_error(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("<!-- report:no-such-table -->\n<!-- /report:no-such-table -->\n")
    with pytest.raises(SBoNError, match="unknown report table 'no-such-table'"):
        doc_blocks.stale([doc], formatting.RESULTS)


def test_a_table_is_generated_from_its_file_not_copied(tmp_path):
    """Change a number in a copy of a result file: the table follows it."""
    shutil.copytree(formatting.RESULTS / formatting.MACHINE / "engine", tmp_path / formatting.MACHINE / "engine")
    path = tmp_path / formatting.MACHINE / "engine" / "engine.json"
    path.write_text(path.read_text().replace('"hf_padding_waste": 0.16579589843749998',
                                             '"hf_padding_waste": 0.5'))
    assert "| 50 % |" in doc_blocks.render("engine", tmp_path)
    assert "| 17 % |" in doc_blocks.render("engine", formatting.RESULTS)


def relative_links(doc: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # code blocks hold commands, not links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file(doc):
    targets = {(doc.parent / t.split("#")[0]).resolve() for t in relative_links(doc)}
    missing = sorted(str(t.relative_to(ROOT)) for t in targets
                     if not t.exists() and not (t in WRITTEN_ELSEWHERE))
    assert missing == []


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", doc.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_a_section_names_a_heading_of_that_page(doc):
    bad = []
    for t in relative_links(doc):
        page, _, anchor = t.partition("#")
        target = (doc.parent / page).resolve() if page else doc
        if anchor and target.suffix == ".md" and target.exists() and anchor not in anchors(target):
            bad.append(t)
    assert bad == []


def test_the_readme_is_short_and_keeps_the_space_front_matter():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 10_240
    front = text.split("---")[1]
    assert "sdk: gradio" in front and "app_file: app.py" in front
    assert text.startswith("---\ntitle: SBoN Explorer\n")


# Numbers that are not measurements: versions, a citation, settings, code constants and test limits. A measured
# number (a speedup, a score, seconds) belongs in a generated table.
NOT_MEASURED = {
    "2410.20290",  # the paper's arXiv id
    "2.13", "3.10",  # torch and Python versions
    "3.1", "3.2",  # model names: Llama 3.1 and 3.2
    "6.3",  # a section of the paper
    "0.1", "0.5", "0.8", "0.95",  # settings: α, temperature, top-p
    "20 %", "80 %",  # the share of free memory `--kv-budget auto` takes and leaves
    "32×",  # the paper's own "16–32×"
    "2 s", "5 %",  # limits the reliability tests assert
    "20 MB", "50 MB",  # the replay upload limit, and the file tried against it
    "1280×", "1920×", "853×", "150 %",  # the screens the presenter view is checked on
}
MEASURED_LOOKING = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])"  # a decimal
                              r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:%|x\b|×|s\b|ms\b|MB|GB|MiB|min\b)")  # a number with a unit


def prose(doc: Path) -> str:
    """A page without its front matter, code blocks, generated tables and link targets."""
    text = re.sub(r"\A---\n.*?\n---\n", "", doc.read_text(), flags=re.S)
    text = re.sub(r"<!-- report:([\w-]+) -->.*?<!-- /report:\1 -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "]", text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_measured_number_is_typed_by_hand(doc):
    assert set(MEASURED_LOOKING.findall(prose(doc))) - NOT_MEASURED == set()


def test_a_hand_typed_speedup_is_caught(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("We measured a 1.57x speedup.\n<!-- report:engine -->\n1.61x\n<!-- /report:engine -->\n")
    assert set(MEASURED_LOOKING.findall(prose(doc))) - NOT_MEASURED == {"1.57x"}


# -- a NOTE's prose says what its files say ---------------------------------------------------------------

NOTES = tracing.notes()


@pytest.mark.parametrize("note", NOTES, ids=lambda p: str(p.parent.relative_to(formatting.RESULTS)))
def test_every_number_in_a_notes_prose_is_in_a_file_it_cites(note):
    assert tracing.untraced(note) == []


def copy_of_a_note(tmp_path: Path, folder: str) -> Path:
    """A NOTE and its folder's files at the same place under tmp_path (so its links and citations resolve)."""
    src = formatting.RESULTS / folder
    dst = tmp_path / "benchmarks" / "results" / folder
    shutil.copytree(src, dst)
    return dst / "NOTE.md"


@pytest.mark.parametrize("folder,written,planted", [
    # drifts such as a Kendall the file does not hold, a rate after a re-run, a mean
    ("cpu-2core-epyc/ifeval", "**Kendall pooled `≥ 0.3`: met**, 0.38 (", "**Kendall pooled `≥ 0.3`: met**, 0.44 ("),
    ("cpu-2core-epyc/signals", "(0.08 → 0.50)", "(0.08 → 0.56)"),
    ("cpu-2core-epyc/defaults", "with Kendall 0.56 on average", "with Kendall 0.61 on average"),
    ("cpu-2core-epyc", "our Best-of-N 138.9 tok/s", "our Best-of-N 141.2 tok/s"),
])
def test_a_number_that_drifted_from_its_file_is_caught(tmp_path, folder, written, planted):
    note = copy_of_a_note(tmp_path, folder)
    text = note.read_text()
    assert written in text and tracing.untraced(note) == []
    note.write_text(text.replace(written, planted, 1))
    [line] = tracing.untraced(note)
    wrong = next(a for a, b in zip(re.findall(r"\d+(?:\.\d+)?", planted), re.findall(r"\d+(?:\.\d+)?", written)) if a != b)
    assert f'"{wrong}' in line


def test_a_number_no_cited_file_holds_is_caught_unless_its_command_is_named(tmp_path):
    note = copy_of_a_note(tmp_path, "gpu-h100")
    text = note.read_text()
    # at the end of one section, the one that cites two files
    section = text.index("## The first GPU session — 2026-11-22")
    end = text.find("\n## ", section + 1) % (len(text) + 1)

    def with_line(line: str) -> str:
        return text[:end] + f"\n{line}\n" + text[end:]
    note.write_text(with_line("A later run on the same card took 12.3 s."))
    assert [line.split(": ", 1)[1] for line in tracing.untraced(note)] == [
        '"12.3 s" (The first GPU session — 2026-11-22) is in none of cli_sbon_n32_256.json, engine.json']
    note.write_text(with_line("A later run on the same card took 12.3 s, regenerated by "
                              "`python -m benchmarks engine --k 2 --n 32`."))
    assert tracing.untraced(note) == []


def commands_named(notes) -> list[str]:
    return [m for note in notes for m in tracing.REGENERATED.findall(note.read_text())]


def parses(command: str) -> bool:
    """Whether a `python -m benchmarks|sbon ...` command line parses with the project's own parser."""
    import shlex

    from benchmarks.__main__ import build_parser as benchmarks_parser
    from sbon.cli import build_parser as sbon_parser

    argv = shlex.split(command)
    parser = {"benchmarks": benchmarks_parser, "sbon": sbon_parser}.get(argv[2])
    try:
        return parser is not None and bool(parser().parse_args(argv[3:]))
    except SystemExit:
        return False


def test_every_command_a_note_names_for_its_numbers_parses():
    assert [c for c in commands_named(NOTES) if not parses(c)] == []
    assert parses("python -m benchmarks engine --k 2 --n 32")
    assert not parses("python -m benchmarks engine --no-such-option 2")


# -- the code and docs speak of the code, not of a tracker a reader of the repository does not have ----------

TRACKER = re.compile(r"\b(?:issues?|PR|pull request)\b\s*#?\d+|(?<![\w#&/])#\d{1,4}\b(?![;\w-])", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".cfg", ".sh"}
DATA = ("benchmarks/results/", "benchmarks/data/", "tests/data/")  # measured or shipped data: not prose


def prose_files() -> list[Path]:
    """Every text file of code and docs: source, docs, NOTEs, model cards, requirements, CI; not data files."""
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if any(part.startswith(".") and part not in (".ci",) for part in path.relative_to(ROOT).parts):
            continue  # .git, caches
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES or "__pycache__" in rel:
            continue
        if rel.startswith(DATA) and path.suffix != ".md" and path.name != "NOTE.md":
            continue
        out.append(path)
    return [path for path in out if path != Path(__file__).resolve()]  # this file spells out what it looks for


def test_tracker_references_are_found_where_they_are_written():
    """The pattern below catches the ways a tracker is named, and not a colour or a list's item."""
    for text in ("see issue #23", "(issue 13)", "Issue #32's targets", "fixed in #41", "PR #7"):
        assert TRACKER.search(text), text
    for text in ("border:1px solid #999;", "color: #1f77b4", "a #1-ranked answer", "[link](page.md#section-2)"):
        assert not TRACKER.search(text), text


def test_no_code_or_doc_names_an_issue_number():
    files = prose_files()
    assert len(files) > 100 and ROOT / "app.py" in files and ROOT / "docs" / "architecture.md" in files
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in files
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if TRACKER.search(line)]
    assert not found, "say what the reference means (the target, the reason) instead:\n" + "\n".join(found)
