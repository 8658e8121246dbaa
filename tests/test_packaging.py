"""pyproject.toml declares every third-party package the library (`sbon/`) imports, at any depth of the code."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Imported by sbon/ but deliberately not a dependency, each with why.
OPTIONAL = {
    "nltk": "sbon/ifeval/text.py uses NLTK's punkt model when installed, else a regex stand-in",
    "instructions_registry": "the IFEval reference's own module, on the path `python -m sbon.ifeval.differential --reference` gives",
}


def imported_packages(folder: Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "sbon"}


def declared() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def distributions(module: str) -> set[str]:
    return {d.lower().replace("_", "-") for d in importlib.metadata.packages_distributions().get(module, [module])}


def test_pyproject_declares_every_package_the_library_imports():
    missing = {m for m in imported_packages(ROOT / "sbon") - set(OPTIONAL) if not distributions(m) & declared()}
    assert missing == set()


def test_an_undeclared_import_is_caught(tmp_path):
    (tmp_path / "x.py").write_text("def f():\n    import langdetect\n    import yaml\n    import json\n")
    assert imported_packages(tmp_path) == {"langdetect", "yaml"}
    assert not distributions("yaml") & declared()
