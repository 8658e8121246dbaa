"""Every command line's `--help` tells the truth about its defaults: each option shows one default, and it is
the value the code uses -- argparse's default, or, for an option the code resolves after parsing (argparse's
None), what that code gives on this machine (`sbon.options.resolved`). Covers `python -m sbon run`, every
`python -m benchmarks` experiment and `python -m components.record`."""

import argparse
import re

import pytest

from sbon.options import shown_default

MACHINE_DEPENDENT = {"--device", "--dtype", "--threads", "--data-dir"}
NOT_SHOWN = (argparse._HelpAction, argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._VersionAction)


def sbon_run() -> argparse.ArgumentParser:
    from sbon.cli import build_parser

    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]


def benchmarks_parsers() -> dict[str, argparse.ArgumentParser]:
    from benchmarks.__main__ import build_parser

    return dict(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)


def record(monkeypatch_parse=None) -> argparse.ArgumentParser:
    """components.record builds its parser in main(): catch it when main() parses."""
    from components import record as module

    caught = []

    def catch(self, *args, **kwargs):
        caught.append(self)
        raise SystemExit(0)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = catch
    try:
        with pytest.raises(SystemExit):
            module.main([])
    finally:
        argparse.ArgumentParser.parse_args = original
    return caught[0]


CLIS = ["sbon run", *(f"benchmarks {name}" for name in benchmarks_parsers()), "components.record"]


def parser_of(cli: str) -> argparse.ArgumentParser:
    if cli == "sbon run":
        return sbon_run()
    if cli == "components.record":
        return record()
    return benchmarks_parsers()[cli.split()[1]]


def as_shown(value) -> set[str]:
    """The ways a default value may be written in a help text."""
    if isinstance(value, (list, tuple)):
        return {str(value), " ".join(map(str, value)), ", ".join(map(str, value))}
    return {str(value), "none" if value is None else str(value)}


def wrong_defaults(parser: argparse.ArgumentParser) -> list[str]:
    """`--option: what is wrong` for every option whose help shows a default the code does not use."""
    wrong = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, NOT_SHOWN) or not action.help:
            continue
        name = action.option_strings[-1]
        text = parser._get_formatter()._expand_help(action)
        if len(re.findall(r"\(default\b", text)) > 1:
            wrong.append(f"{name}: shows more than one default: {text!r}")
            continue
        shown = shown_default(parser, action)
        if shown is None:
            continue
        resolve = getattr(action, "resolved_default", None)
        used = resolve() if resolve is not None else action.default
        if isinstance(action, argparse.BooleanOptionalAction):
            used = bool(used)
        if name in MACHINE_DEPENDENT and action.default is None and resolve is None:
            wrong.append(f"{name}: the code resolves it on this machine, the help must show what to (resolved)")
        elif shown not in as_shown(used) and not (used is None and resolve is None):
            # None: the code resolves it later, and the help may say how (a value it cannot know here, say
            # "from --protocol"); a machine's own default (MACHINE_DEPENDENT) is shown as resolved here
            wrong.append(f"{name}: help says {shown!r}, the code uses {used!r}")
    return wrong


@pytest.mark.parametrize("cli", CLIS)
def test_every_default_in_help_is_the_value_the_code_uses(cli):
    assert wrong_defaults(parser_of(cli)) == []


def test_a_hand_typed_default_that_drifted_is_caught():
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dtype", default=None, help="generator dtype (default: float32 on CPU)")
    parser.add_argument("--k", type=int, default=5, help="prompts (default: 10)")
    parser.add_argument("--n", type=int, default=16, help="candidates")
    assert wrong_defaults(parser) == ["--dtype: shows more than one default: 'generator dtype (default: float32 on "
                                      "CPU) (default: None)'", "--k: shows more than one default: 'prompts (default: "
                                      "10) (default: 5)'"]


def test_a_resolved_default_the_help_misstates_or_leaves_unresolved_is_caught():
    from sbon.options import HelpFormatter, resolved

    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    resolved(parser.add_argument("--dtype", default=None, help="generator dtype (default: float32)"), lambda: "bfloat16")
    parser.add_argument("--device", default=None, help="cpu, cuda ... (default: cuda if available)")
    resolved(parser.add_argument("--threads", type=int, default=None, help="CPU threads"), lambda: 2)
    assert wrong_defaults(parser) == [
        "--dtype: help says 'float32', the code uses 'bfloat16'",
        "--device: the code resolves it on this machine, the help must show what to (resolved)"]
    assert shown_default(parser, parser._actions[-1]) == "2"


def test_the_benchmarks_package_names_every_experiment_it_registers():
    import benchmarks

    # each as "name (what it measures)" or "name: ..."
    missing = [name for name in benchmarks_parsers()
               if not re.search(rf"(?<![\w-]){re.escape(name)}(?= \(|:)", benchmarks.__doc__)]
    assert not missing


def test_the_command_line_s_help_does_not_import_the_model_stack():
    """`python -m sbon --help` answers without importing `transformers`' model classes (seconds of imports): the
    decode attention registers with `transformers` when a model is first loaded (sbon.attention.register). Nor
    SciPy's statistics or pandas, the slowest imports left: the analyses that need them import them."""
    import subprocess
    import sys
    from pathlib import Path

    heavy = {"transformers.modeling_utils", "transformers.masking_utils", "scipy.stats", "pandas"}
    code = f"import sys, sbon.cli; sbon.cli.build_parser(); print(sorted({heavy!r} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.strip() == "[]"
