"""`python -m benchmarks report`: the result tables in the docs, generated from the committed result files.

Numbers copied by hand from a result file go stale the day the file is re-run. Instead, every result table in
`README.md` and `docs/*.md` sits between two markers,

    <!-- report:NAME -->
    ... generated, do not edit ...
    <!-- /report:NAME -->

and this command rewrites what is between them from the JSON files under `benchmarks/results/`. The NOTEs beside
the result files (`benchmarks/results/**/NOTE.md`) hold such blocks too, and every number of their prose must be
in a file they cite. `--check` rewrites nothing and exits with 1, naming each table whose text differs from what
the files say and each untraced number (the docs test runs both).

One module per job:

- `result_tables`: one generator per table, in the registry `TABLES` (name -> function(results_dir) -> markdown);
  a new table is one function and one entry there;
- `doc_blocks`: the marked blocks of the docs, found, compared with what `TABLES` makes of the files, rewritten;
- `tracing`: every number of a NOTE's prose traced back to a result file its section cites (`untraced`);
- `formatting`: what every table shares (where the result files are, how a number is printed, a link to a file).

This module is the command line. Reads JSON only (no torch, no model): it runs in about a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import doc_blocks, tracing
from .formatting import REPO, RESULTS
from .result_tables import TABLES


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="rewrite the result tables in README.md and docs/ from the result files",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="rewrite nothing; exit 1 naming every table that differs from the result files, and every "
                        "number of a NOTE's prose that the files it cites do not hold")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="the committed result files")
    p.add_argument("--list", action="store_true", help="print the table names and the docs that use them")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    docs = doc_blocks.doc_files()
    if args.list:
        used = {}
        for b in doc_blocks.blocks(docs, args.results_dir):
            used.setdefault(b.name, []).append(str(b.doc.relative_to(REPO)))
        for name in TABLES:
            print(f"{name}: {', '.join(used.get(name, [])) or 'in no doc'}")
        return 0
    if args.check:
        differ = doc_blocks.stale(docs, args.results_dir)
        for line in differ:
            print(f"out of date: {line} (run `python -m benchmarks report`)", file=sys.stderr)
        loose = [line for note in tracing.notes() for line in tracing.untraced(note, args.results_dir)]
        for line in loose:
            print(f"untraced: {line}", file=sys.stderr)
        return 1 if differ or loose else 0
    changed = [doc for doc in docs if doc_blocks.rewrite(doc, args.results_dir)]
    print("rewrote " + (", ".join(str(d.relative_to(REPO)) for d in changed) if changed else "nothing: up to date"))
    return 0
