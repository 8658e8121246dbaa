"""Command line: `python -m sbon run --prompt "..."` and `python -m sbon presets`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .algorithms import Done, RoundStarted, TokensGenerated, UndecidedFallback, drive, events
from .analysis.comparison import (Comparison, ComparisonDone, MethodEvent, comparison_events, headline_text,
                                  wall_time_text)
from .config import METHOD_SPECS, RunConfig
from .engine import WEIGHT_FORMATS, check_device
from .options import HelpFormatter, add_options, resolved, values
from .errors import SBoNError, exit_code
from .machine_load import busy_note
from .models import (DEFAULT_GENERATOR, GENERATORS, REWARDS, START, check_instructions_judged, check_name,
                     check_reachable, check_reward_prompt, default_device, default_dtype_name, load_generator,
                     load_reward)
from .results import RunResult
from .rewards import bind_instructions

if TYPE_CHECKING:
    from .probe import ThreadWatch

DEFAULT_N = 16


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sbon", description="Speculative Rejection and Best-of-N decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="generate for one prompt and print the best response", formatter_class=HelpFormatter)
    r.add_argument("--prompt", default=START.prompt, help="what to answer (by default the page's first prompt)")
    # One option per RunConfig setting, with its help and default (sbon.config); three take more here.
    add_options(r, RunConfig(), overrides={
        "prune_by": dict(default=START.prune_by),  # the page's and the command line's one start (sbon.models.START)
        "n": dict(default=None, help=f"default: {DEFAULT_N}; for sbon with --kv-budget: as many as it holds"),
        "kv_budget": dict(type=kv_budget_arg, help="or 'auto': 80%% of the device's free memory, the rest left to the "
                                                   "reward model, and N from it, at most 1000"),
    })
    r.add_argument("--generator", default=DEFAULT_GENERATOR, help="preset name, local folder or hub id")
    r.add_argument("--reward", default=START.reward, help="preset name, local folder or hub id")
    r.add_argument("--instructions", default=None, type=instructions_arg,
                   help="ifeval reward: the prompt's instructions, JSON text or a JSON file of IFEval ids and "
                        "arguments, e.g. '[{\"id\": \"punctuation:no_comma\"}, {\"id\": "
                        "\"change_case:english_lowercase\"}]'")
    resolved(r.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (by default cuda where there is one)"),
             default_device)
    resolved(r.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                            help="generator weights (by default the format python -m sbon machine measured fastest and "
                                 "exact here; before that float32 on a CPU, bfloat16 on a GPU: "
                                 "sbon.models.default_weights)"), default_dtype_name)
    r.add_argument("--weights", choices=list(WEIGHT_FORMATS), default=None,
                   help="generator weight format instead of --dtype (SBON_WEIGHTS sets it too): " + "; ".join(
                       f"{name}: {fmt.description}" for name, fmt in WEIGHT_FORMATS.items())
                        + " (default: the one python -m sbon machine measured fastest and exact here, else as --dtype)")
    r.add_argument("--compare", action="store_true",
                   help="also run Best-of-N with the same seed and print the metrics; --out then saves both runs "
                        "as a comparison the app can replay")
    r.add_argument("--bon-same-memory", action="store_true",
                   help="with --compare: Best-of-N in batches that fit the KV cache the SBoN run peaked at (the "
                        "paper's memory-bound setting) instead of all N at once")
    r.add_argument("--out", default=None, help="write the full result as JSON here")
    sub.add_parser("presets", help="list the model presets")
    m = sub.add_parser("machine", help="measure this machine's decode paths and choose auto's: the fingerprint, every "
                                       "path's times and exactness, the choice and why", formatter_class=HelpFormatter)
    m.add_argument("--generator", default=DEFAULT_GENERATOR, help="preset name, local folder or hub id")
    resolved(m.add_argument("--device", default=None, help="cpu, cuda ... (by default cuda where there is one)"),
             default_device)
    m.add_argument("--build", action="store_true",
                   help="on a CPU, also build the compiled step of the fastest exact weight format where it is not "
                        "saved yet (minutes, once per machine), then measure it")
    m.add_argument("--one-thread", action="store_true",
                   help="on a CPU, only build the chosen compiled step for one thread (a minute or more, once per "
                        "machine; --build does it too) and check that it gives the bits of the thread count measured: "
                        "a run that starts beside other work decodes on it")
    m.add_argument("--cached", action="store_true", help="print the choice cached for this machine; measure nothing")
    return parser


def instructions_arg(text: str) -> str:
    """--instructions: JSON text, or the path of a JSON file, read here (the page and /compare take text only)."""
    path = Path(text)
    if text.strip()[:1] not in ("[", "{", '"'):
        if path.is_file():
            return path.read_text(encoding="utf-8")
        if path.suffix.lower() == ".json":
            raise argparse.ArgumentTypeError(f"no file {text}: give JSON text or the path of a JSON file")
    return text


def kv_budget_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'auto', got {text!r}") from None


def check_out(path: str | None) -> None:
    """--out's folder, made before the run: a run of minutes is not lost to a path it cannot write at the end."""
    if path is None:
        return
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SBoNError(f"--out {path}: cannot make its folder ({e.strerror or e})") from None
    if out.is_dir():
        raise SBoNError(f"--out {path} is a folder: give a file path, e.g. {out / 'run.json'}")
    if not os.access(out.parent, os.W_OK):
        raise SBoNError(f"--out {path}: its folder is not writable")


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's settings from the command line, checked: which options go together, then N and the
    budget (sbon given a budget, or 'auto', and no N starts as many candidates as the budget holds, as
    in the paper; otherwise N is DEFAULT_N), then every value."""
    defaults = RunConfig(prune_by=START.prune_by)
    for name in dict.fromkeys(p for spec in METHOD_SPECS.values() for p in spec.params):
        methods = [m for m, spec in METHOD_SPECS.items() if name in spec.params]
        if getattr(args, name) != getattr(defaults, name) and args.method not in methods:
            raise SBoNError(f"--{name.replace('_', '-')} applies to --method {' or '.join(methods)}, not {args.method}")
    if args.compare and not METHOD_SPECS[args.method].prunes:
        raise SBoNError(f"--compare compares a Speculative Rejection method with Best-of-N, not {args.method}")
    if args.bon_same_memory and not args.compare:
        raise SBoNError("--bon-same-memory applies to the Best-of-N run of --compare: add --compare")
    n, kv_budget = args.n, args.kv_budget
    if kv_budget == "auto":
        if n is not None:
            raise SBoNError("--kv-budget auto chooses N from free memory: leave out --n, or give a budget in tokens")
        kv_budget = None  # speculative_rejection given neither N nor a budget measures free memory
    elif n is None and kv_budget is None:
        n = DEFAULT_N
    return RunConfig(**{**values(args, RunConfig), "n": n, "kv_budget": kv_budget}).validate(args.prompt)


def with_progress(events: Iterable, max_new_tokens: int, label: str) -> Iterator:
    """Pass events through unchanged, showing a tqdm bar per algorithm (tokens, round, live candidates).
    Takes one algorithm's events or a comparison's (each algorithm's events wrapped in MethodEvent). Log lines
    meanwhile (a reward that cuts long responses, a step compiled) print above the bar, not after its text."""
    with logging_redirect_tqdm():
        yield from _progress(events, max_new_tokens, label)


def _progress(events: Iterable, max_new_tokens: int, label: str) -> Iterator:
    bar, name = None, None
    try:
        for event in events:
            method, inner = (event.method, event.event) if isinstance(event, MethodEvent) else (label, event)
            if isinstance(inner, RoundStarted):
                if method != name:  # the next algorithm of a comparison: a bar of its own
                    if bar is not None:
                        bar.close()
                    bar, name = tqdm(total=max_new_tokens, desc=method, unit="tok", file=sys.stderr, leave=False), method
                bar.set_description(f"{method} round {inner.round}")
            elif isinstance(inner, TokensGenerated) and bar is not None:
                bar.update(inner.tokens - bar.n)
                bar.set_postfix(live=len(inner.candidate_ids))
            elif isinstance(event, MethodEvent) and method == "bon" and isinstance(inner, Done):
                print("scoring Best-of-N's prefixes for the trade-off view ...", file=sys.stderr)
            yield event
    finally:  # also when the caller stops at the last event it needs
        if bar is not None:
            bar.close()


def summary(result: RunResult) -> str:
    import pandas as pd

    rows = [{"candidate": c.id, "fate": result.fate(c.id), "tokens": c.tokens_generated,
             "partial rewards": " ".join(f"{p.reward:.3f}" for p in c.partial_rewards),
             "final reward": c.final_reward} for c in result.candidates]
    table = pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}")
    timings = ", ".join(f"{k} {v:.2f}s" for k, v in result.timings.items())
    notes = [n for n in (result.why_no_decision_point(), busy_note({result.method: result.load})) if n]
    count = len(result.candidates)
    return (f"{table}\n\n{result.method}: {count} candidate{'s' * (count != 1)}, {result.total_tokens} tokens generated in "
            f"{result.decode_steps} sequential decode steps; wall time {timings}" + "".join(f"\n{n}" for n in notes))


def cmd_run(args: argparse.Namespace) -> int:
    config = run_config(args)
    check_name(args.generator, GENERATORS, "generator")
    check_name(args.reward, REWARDS, "reward")
    check_instructions_judged(args.reward, args.instructions)
    check_reward_prompt(args.reward, args.prompt, args.instructions)
    check_out(args.out)
    check_reachable(args.generator, GENERATORS, "generator")  # before the generator loads: one line in seconds
    check_reachable(args.reward, REWARDS, "reward model")
    device = check_device(args.device or default_device())  # a mistyped device in one line, before anything reads it
    from .probe import check_forced, watched
    check_forced(args.generator, device, args.weights, args.decode if args.decode == "compiled" else None)
    from .machine import start_threads
    torch.set_num_threads(start_threads(args.generator, device))
    print(f"loading generator '{args.generator}' and reward '{args.reward}' ...", file=sys.stderr)
    gen = load_generator(args.generator, device=args.device, dtype=args.dtype and getattr(torch, args.dtype),
                         weights=args.weights)
    config, watch = on_free_threads(gen, config)
    reward = bind_instructions(load_reward(args.reward, generator=gen, device=args.device), args.prompt,
                               args.instructions)
    if args.compare:
        stream = watched(comparison_events(gen, reward, args.prompt, config, bon_same_memory=args.bon_same_memory),
                         watch)
        comparison = drive(with_progress(stream, args.max_new_tokens, args.method), ComparisonDone).comparison
        report(comparison.speculative)
        print(f"\n{headline_text(comparison)}\n{wall_time_text(comparison)}")
        print("\ncompared with Best-of-N (same seed):")
        for k, v in comparison.metrics.items():
            print(f"  {k:28s} {v:.3f}" if isinstance(v, float) else f"  {k:28s} {v}")
        saved: RunResult | Comparison = comparison
    else:
        stream = watched(events(gen, reward, args.prompt, config), watch)
        saved = drive(with_progress(stream, args.max_new_tokens, args.method), Done).result
        report(saved)
    if hasattr(reward, "explain"):  # a reward that can say why (ifeval): each instruction's verdict on the answer
        best = (saved.speculative if isinstance(saved, Comparison) else saved).best
        for v in reward.explain(args.prompt, best.text, final=True):
            print(f"  {v.instruction_id}: {v.status} ({v.reason})")
    if args.out:
        saved.to_json(args.out)
        kind = "the comparison (open it in the app: Save and replay)" if isinstance(saved, Comparison) else "the full result"
        print(f"\n{kind} written to {args.out}", file=sys.stderr)
    return 0


def on_free_threads(gen, config: RunConfig) -> tuple[RunConfig, ThreadWatch | None]:
    """``config`` for a run of ``gen`` that starts now with auto's path, as the app's runs start: on the thread count
    the path was measured at, or on one thread where other work holds the cores now
    (sbon.probe.threads_for_run, the app's rule too); before anything is measured, on the safe path's threads. With
    what looks at its threads between its steps (sbon.probe.watch_for_run; None where they stay)."""
    from .machine import auto_path
    from .probe import threads_for_run, watch_for_run

    if config.decode != "auto" or gen.device.type != "cpu":
        return config, None
    path = auto_path(gen.name, gen.device)
    measured = path.threads
    threads, decode = threads_for_run(gen, config.decode, path)
    if threads is None:
        return config, None
    torch.set_num_threads(threads)
    watch = watch_for_run(gen, decode, path)
    if measured is None or threads == measured:
        return config, watch
    step = "on the compiled step built for one thread" if decode == "compiled" else "eagerly"
    print(f"note: other work holds this machine's cores: this run decodes on one thread, {step} ({measured} threads "
          "would wait for the cores at every operation)", file=sys.stderr)
    return dataclasses.replace(config, decode=decode), watch


def report(result: RunResult) -> None:
    print(summary(result))
    print(f"\nbest response (candidate {result.best_id}, final reward {result.best.final_reward:.3f}):\n")
    print(result.best.text)


def cmd_presets() -> int:
    for title, presets in (("generators", GENERATORS), ("rewards", REWARDS)):
        print(f"{title}:")
        for name, p in presets.items():
            print(f"  {name:22s} {p.description}" + (f"  [{p.hub_id}]" if p.hub_id else ""))
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning) -> None:
    """A run's own notes (a setting it cannot apply, and what it does instead) in one line, without a source path."""
    if issubclass(category, UndecidedFallback):
        print(f"note: {message}", file=sys.stderr if file is None else file)
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    # Library warnings (hub retries, GGUF notes) would bury our one-line errors.
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as tf_logging

    hub_logging.set_verbosity_error()
    tf_logging.set_verbosity_error()
    commands = {"run": lambda: cmd_run(args), "presets": cmd_presets, "machine": lambda: cmd_machine(args)}
    return exit_code(commands[args.command])


def cmd_machine(args: argparse.Namespace) -> int:
    import logging

    from .machine import cached_choice, decode_threads
    from .probe import one_thread_step, probe, report

    device = torch.device(args.device or default_device())
    if device.type == "cpu":
        torch.set_num_threads(decode_threads())  # what the app and the command line decode with once measured
    progress = lambda line: print(line, file=sys.stderr)  # noqa: E731
    if args.cached or args.one_thread:
        if args.one_thread:
            logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
            one_thread_step(args.generator, device, progress=progress, again=True)
        choice = cached_choice(args.generator, device)
        if choice is None:
            raise SBoNError("nothing measured on this machine yet: run python -m sbon machine")
    else:
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
        print(f"measuring every decode path of {args.generator} on {device} (seconds per path) ...", file=sys.stderr)
        choice = probe(args.generator, device, build=args.build, progress=progress)
        if args.build:
            choice = one_thread_step(args.generator, device, progress=progress) or choice
    print(report(choice))
    return 0
