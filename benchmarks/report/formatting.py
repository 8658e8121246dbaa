"""What every result table shares: where the result files are, how a number is printed, a link to a file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
MACHINE = "cpu-2core-epyc"  # the machine every table below was measured on (its folder under results/)


def num(x: float | None, digits: int = 1) -> str:
    """A number as the docs print it; a missing one (None, NaN) as a dash."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{round(x, digits) + 0.0:.{digits}f}"  # + 0.0: no "-0.00"


def times(x: float | None, digits: int = 2) -> str:
    """A ratio such as a speedup: `1.57x`."""
    return "–" if x is None else f"{num(x, digits)}x"


def pct(x: float | None, digits: int = 0) -> str:
    """A share in [0, 1] as a percentage."""
    return "–" if x is None else f"{num(100 * x, digits)} %"


def mean_median(stat: dict | None, digits: int = 1, fmt: Callable = num) -> str:
    """A summary statistic `{"mean": .., "median": ..}` as `mean / median`, the order every benchmark reports."""
    if not stat:
        return "–"
    return f"{fmt(stat['mean'], digits)} / {fmt(stat['median'], digits)}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def link(results_dir: Path, path: Path) -> str:
    """A markdown link to a result file, relative to the docs/ folder (`render` moves it for a page elsewhere)."""
    rel = path.relative_to(results_dir)
    return f"[`{path.name}`](../benchmarks/results/{rel.as_posix()})"


def load(results_dir: Path, *parts: str) -> dict:
    return json.loads(results_dir.joinpath(MACHINE, *parts).read_text())


def load_avg(env: dict) -> str:
    """The 1-minute load average a result file recorded (how busy the shared cores were)."""
    la = (env or {}).get("load_average")
    return num(la[0], 1) if la else "–"
