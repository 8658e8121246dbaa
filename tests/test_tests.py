"""The tests themselves can fail: no test asserts only inside a loop that may not run, and none sleeps and then
asserts (it waits on an event or polls with a bound instead). Checked on the source (ast), in seconds. And the suite
runs as tests/conftest.py groups it."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ALWAYS_RUNS = {"range", "zip", "enumerate", "sorted", "reversed"}  # over literals only (below)


def always_runs(iterable: ast.expr) -> bool:
    """A loop over a non-empty literal (or range of constants, or zip/enumerate/... of such) runs."""
    if isinstance(iterable, (ast.Tuple, ast.List, ast.Set)):
        return bool(iterable.elts)
    if isinstance(iterable, ast.Call) and getattr(iterable.func, "id", None) in ALWAYS_RUNS and iterable.args:
        if iterable.func.id == "range":
            return all(isinstance(a, ast.Constant) for a in iterable.args)
        return all(always_runs(a) for a in iterable.args)
    return False


def asserts(node: ast.AST, in_loop: bool = False) -> tuple[int, int]:
    """(asserts inside a loop that may not run, asserts outside any such loop) in `node`, nested functions aside."""
    inside = outside = 0
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(child, ast.Assert):
            inside, outside = (inside + 1, outside) if in_loop else (inside, outside + 1)
            continue
        loop = in_loop or isinstance(child, ast.While) or (isinstance(child, (ast.For, ast.AsyncFor))
                                                          and not always_runs(child.iter))
        i, o = asserts(child, loop)
        inside, outside = inside + i, outside + o
    return inside, outside


def is_sleep(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) in ("time.sleep", "sleep"))


def suite_functions() -> list[tuple[str, ast.FunctionDef]]:
    out = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                out.append((f"{path.name}::{node.name}", node))
    return out


def test_no_test_asserts_only_inside_a_loop_that_may_not_run():
    found = suite_functions()
    assert len(found) > 300  # the walk found the suite
    loop_only = [name for name, node in found if asserts(node)[0] and not asserts(node)[1]]
    assert not loop_only, "assert that the loop ran too (a non-empty list, a count > 0): " + ", ".join(loop_only)


def test_no_test_sleeps_and_then_asserts():
    found = suite_functions()
    slept = [name for name, node in found for block in ast.walk(node) if hasattr(block, "body")
             and isinstance(block.body, list)
             for before, after in zip(block.body, block.body[1:]) if is_sleep(before) and isinstance(after, ast.Assert)]
    assert not slept, "wait on an event or poll with a bound instead: " + ", ".join(slept)


def test_the_checks_catch_what_they_look_for():
    def parsed(source: str) -> ast.FunctionDef:
        return ast.parse(source).body[0]

    assert asserts(parsed("def test_x(xs):\n    for x in xs:\n        assert x\n")) == (1, 0)
    assert asserts(parsed("def test_x(xs):\n    assert xs\n    for x in xs:\n        assert x\n")) == (1, 1)
    assert asserts(parsed("def test_x():\n    for x in (1, 2):\n        assert x\n")) == (0, 1)
    sleepy = parsed("def test_x():\n    time.sleep(1)\n    assert True\n")
    assert is_sleep(sleepy.body[0]) and isinstance(sleepy.body[1], ast.Assert)


def test_pytest_xdist_runs_each_group_in_one_process(request):
    """pytest-xdist (pyproject's ``--dist loadgroup``) runs a file's tests, and those that drive the app server, in one
    process only where the group tests/conftest.py marks reaches its scheduler, which reads it from the test's id.
    Where it does not (pytest 9.2 keeps pytest-xdist 3.8 from changing the id), nothing fails, but the suite starts
    an app server and a browser in each process and makes each file's fixtures twice: a third more CPU time."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("run without pytest-xdist: nothing is grouped")
    assert request.node.nodeid.endswith(f"@{request.node.path.name}"), request.node.nodeid


def test_the_groups_started_first_are_the_suite_s_groups(request):
    """tests/conftest.py's LONGEST_FIRST names groups that exist (a renamed file would silently fall back to the
    collection's order), and the suite's processes receive the tests in that order."""
    from conftest import APP_SERVER, LONGEST_FIRST, group_rank

    files = {p.name for p in TESTS.glob("test_*.py")}
    assert LONGEST_FIRST[0] == APP_SERVER and set(LONGEST_FIRST[1:]) <= files
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("run without pytest-xdist: the tests keep the collection's order")
    groups = [item.get_closest_marker("xdist_group").args[0] for item in request.session.items]
    ranks = [group_rank(g) for g in groups]
    assert ranks == sorted(ranks)
