"""The layers, checked on the source: data flows engine -> events/results (sbon core) -> analysis
(sbon.analysis) -> figures (components) -> app; benchmarks and training sit on top. No import circles
(imports inside functions count), no core module that knows the analysis, pandas or the UI, no component
that knows Gradio (app.py alone turns their plain data into Gradio's values), and result folders that hold
data and notes only."""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sbon", "components", "benchmarks", "training")
ENTRY_POINTS = {"sbon.cli", "sbon.__main__"}  # the command line may show analysis; the core may not
CORE_MUST_NOT_IMPORT = ("sbon.analysis", "components", "benchmarks", "training", "app", "gradio", "gradio_adapter",
                        "plotly", "pandas")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> dict[str, Path]:
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if "results" not in p.parts}
    files |= {p.stem: p for p in REPO.glob("*.py")}  # app.py and the modules beside it
    return files


def imports(name: str, path: Path, modules: frozenset[str] = frozenset()) -> set[str]:
    """Every module this one imports, anywhere in it (absolute names, relative ones resolved).
    ``from package import module`` counts as importing the module, not the package's own __init__."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            submodules = {f"{base}.{a.name}" for a in node.names} & modules
            out |= submodules if len(submodules) == len(node.names) else {base} | submodules
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = project_files()
    modules = frozenset(files)
    return {name: {m for m in imports(name, path, modules) if m in files and m != name} for name, path in files.items()}


def test_no_import_circles(graph):
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_core_knows_nothing_of_analysis_figures_or_the_app():
    for name, path in project_files().items():
        if not name.startswith("sbon") or name.startswith("sbon.analysis") or name in ENTRY_POINTS:
            continue
        bad = {m for m in imports(name, path) if m.split(".")[0] in CORE_MUST_NOT_IMPORT or m.startswith("sbon.analysis")}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_analysis_knows_nothing_of_figures_or_the_app():
    for name, path in project_files().items():
        if name.startswith("sbon.analysis"):
            bad = {m for m in imports(name, path) if m.split(".")[0] in ("components", "benchmarks", "app", "gradio", "gradio_adapter")}
            assert not bad, f"{name} imports {sorted(bad)}"


def test_the_components_know_nothing_of_gradio_or_the_app():
    """Views and handlers return plain data; only app.py knows which Gradio element shows what."""
    for name, path in project_files().items():
        if name.startswith("components"):
            bad = {m for m in imports(name, path) if m.split(".")[0] in ("gradio", "gradio_client", "app", "gradio_adapter")}
            assert not bad, f"{name} imports {sorted(bad)}"


def test_result_folders_hold_data_and_notes_only():
    scripts = [p.relative_to(REPO) for p in (REPO / "benchmarks" / "results").rglob("*")
               if p.suffix in (".py", ".sh")]
    assert scripts == [], "a script that produced a result belongs in python -m benchmarks <experiment>"


def test_every_module_is_in_the_map():
    """docs/architecture.md names every module of the project (its Files tables, one line each): a module added
    without a line there fails here."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([\w/]+\.py)`", doc))
    modules = sorted(str(path.relative_to(REPO)) for path in project_files().values())
    assert len(modules) > 50  # the walk found the project
    missing = [m for m in modules if m not in named]
    assert not missing, f"add a line for each to docs/architecture.md's Files tables: {missing}"
    gone = sorted(p for p in named if "/" in p and not (REPO / p).exists())  # paths; bare names are prose
    assert not gone, f"the map names modules that do not exist: {gone}"


def test_the_maps_exemption_is_the_tests():
    """The one exemption from the layers, stated in the map, is the one this file allows."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert "**Exemption from the layers:**" in doc
    assert all(f"`{name.replace('.', '/')}.py`" in doc for name in ENTRY_POINTS)
