"""`python -m benchmarks <experiment> ...`: see `python -m benchmarks --help`."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from sbon.options import HelpFormatter

from . import (app_timing, common, counterfactual, efficiency, engine_vs_generate, gpu_check, ifeval, machines,
               memory, perplexity, report, signals_compared, step, table1, tune, visitors_load)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description="Reproduce the Speculative Rejection paper's measurements.")
    sub = parser.add_subparsers(dest="experiment", required=True)
    for module in (table1, counterfactual, memory, efficiency, perplexity, engine_vs_generate, app_timing,
                   signals_compared, tune, step, machines, visitors_load, ifeval, gpu_check, report):
        module.add_parser(sub)
    for experiment in sub.choices.values():  # one formatter: each default shown once, resolved ones as resolved here
        if experiment.formatter_class is argparse.ArgumentDefaultsHelpFormatter:
            experiment.formatter_class = HelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: what a result file records as its command
    from sbon.errors import exit_code

    if hasattr(args, "protocol"):
        common.apply_protocol(args)

    try:
        return exit_code(lambda: args.main(args))
    finally:
        if getattr(args, "runner", None) is not None:
            args.runner.close()  # the Ray workers of a --ray run; nothing without one


if __name__ == "__main__":
    sys.exit(main())
