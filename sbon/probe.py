"""Measure every decode path this machine can run and choose ``auto``'s (``python -m sbon machine``; the app runs it
in the background on its first start).

A path is a weight format of ``sbon.engine.WEIGHT_FORMATS`` (every entry: a new one joins here without a change) and
a decode step of ``sbon.decoders`` (``eager``; ``compiled``, with CUDA graphs on a GPU). For each, a few decode steps
are timed at the row counts a page-default run decodes at (``sbon.machine.ROWS``), and whether a row's logits are the
same bits alone and within a batch is measured (not taken from the format's ``batch_invariant`` flag: bfloat16 is
exact where the CPU computes it natively, and may not be where it is emulated). Eager paths take seconds. On a CPU a
compiled step is timed where its saved file exists (``sbon.aot_step``); ``build=True`` first builds the steps of the
fastest exact formats (minutes each), and the choice is saved again once they are measured. A path that cannot run
here (no compiler, out of memory, a kernel this CPU lacks) is logged in one line and the probe moves on.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Callable, Sequence

import torch

from .decoders import DECODE_PATHS, EagerDecoder, _compiled, compile_problem, compiled_state, prepare
from .engine import WEIGHT_FORMATS, Generator, SamplingConfig, coupled_uniforms, sample
from .errors import SBoNError
from .machine import ROWS, Choice, Measured, cached_choice, choose, eligible, fingerprint, safe_path, save_choice
from .models import DEFAULT_GENERATOR, load_generator

log = logging.getLogger(__name__)

PROMPT = "Give three tips for staying healthy."
WARM_STEPS, TIMED_STEPS = 1, 3  # per row count: the first step pays for lazy initialisation
# A batch of 6 rows over 6 steps against its rows decoded one and five, four and two: where a kernel's sums change
# with the row count, some logit of some row differs in its last bits (tests/test_step_formats.py asserts what it
# finds per format: float32 activations exact on every CPU).
EXACT_ROWS, EXACT_STEPS = 6, 6
EXACT_SPLITS = ([[0], [1, 2, 3, 4, 5]], [[0, 1, 2, 3], [4, 5]])
EXACT_SEED = 7
BUILD_TOP = 1  # on a CPU, build=True builds the compiled step of this many of the fastest exact formats
DECODES = tuple(d for d in DECODE_PATHS if d != "auto")


def _one_line(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return first[:200] if isinstance(e, SBoNError) else f"{type(e).__name__}: {first[:200]}"


def _logits(dec, prefix, ids: Sequence[int], steps: int) -> torch.Tensor:
    """Each row's logits over ``steps`` steps of coupled sampling (rows × steps × vocabulary), in one batch: the
    tokens a run would decode (fixed made-up tokens can miss a difference that real text shows)."""
    batch = dec.start(prefix, list(ids), False, steps + 1)
    uniforms = coupled_uniforms(EXACT_SEED, ids, steps)
    out = []
    for t in range(steps):
        dec.forward(batch, sample(batch.logits, uniforms[:, t], SamplingConfig()))
        out.append(batch.logits.float().clone())
    return torch.stack(out, 1)


def exactness(gen: Generator, dec) -> tuple[bool, float]:
    """Whether a row's logits are the same bits decoded alone and within a batch (the coupling is exact), and the
    largest difference of a logit between the two."""
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    with torch.inference_mode():
        whole = _logits(dec, prefix, range(EXACT_ROWS), EXACT_STEPS)
        parts = [torch.cat([_logits(dec, prefix, ids, EXACT_STEPS) for ids in split]) for split in EXACT_SPLITS]
    return all(torch.equal(whole, p) for p in parts), max(float((whole - p).abs().max()) for p in parts)


def step_times(gen: Generator, dec, rows: Sequence[int] = ROWS,
               timer: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Milliseconds per decode step at each row count: the fastest of TIMED_STEPS steps after WARM_STEPS (what the
    step costs; slower ones waited for something else on the machine)."""
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    out = {}
    with torch.inference_mode():
        for r in rows:
            batch = dec.start(prefix, list(range(r)), False, WARM_STEPS + TIMED_STEPS + 1)
            tokens = prefix.logits.argmax(-1).expand(r).clone()
            times = []
            for t in range(WARM_STEPS + TIMED_STEPS):
                start = timer()
                dec.forward(batch, tokens + t)
                gen.synchronize()
                if t >= WARM_STEPS:
                    times.append(1e3 * (timer() - start))
            out[r] = min(times)
    return out


def measure(gen: Generator, decode: str, rows: Sequence[int] = ROWS,
            timer: Callable[[], float] = time.perf_counter) -> Measured:
    """One path of a loaded generator: its times and exactness, or why it cannot run (``compiled`` on a CPU is
    timed only where its step is saved: None then means pending)."""
    path = Measured(gen.weights, decode)
    try:
        if decode == "eager":
            dec = EagerDecoder(gen)
        else:
            if problem := compile_problem(gen):
                path.problem = problem
                return path
            if gen.device.type == "cpu":
                if compiled_state(gen) is None:
                    return path  # not built yet: pending
                if not prepare(gen):
                    path.problem = "its saved compiled step did not load"
                    return path
            dec = _compiled(gen)
        path.exact, path.divergence = exactness(gen, dec)
        path.ms = step_times(gen, dec, rows, timer=timer)
    except Exception as e:  # noqa: BLE001 - any path that fails is one line, and the probe goes on
        path.problem, path.ms = _one_line(e), {}
    return path


def probe(generator: str = DEFAULT_GENERATOR, device: str | torch.device = "cpu", build: bool = False,
          formats: Sequence[str] | None = None, rows: Sequence[int] = ROWS,
          measure: Callable[..., Measured] = measure, load: Callable[..., Generator] = load_generator,
          save: bool = True, progress: Callable[[str], None] = log.warning) -> Choice:
    """Measure every path (every weight format × eager and compiled) of ``generator`` on ``device``, at the thread
    count in use, choose, and save the choice (``sbon.machine.cached_choice`` finds it). ``build``: on a CPU, then
    build the compiled step of the BUILD_TOP fastest exact formats whose step is not saved yet, measure it and save the
    choice again. ``formats``: the weight formats to measure (default: all); ``rows``: the row counts timed;
    ``measure``/``load``: what times a path and loads a format (the tests give stand-ins)."""
    device = torch.device(device)
    print_ = fingerprint(device)
    paths: list[Measured] = []
    for weights in formats or WEIGHT_FORMATS:
        try:
            gen = load(generator, device=device, weights=weights)
        except Exception as e:  # noqa: BLE001 - a format that does not load here: one line, the next one
            progress(f"{weights}: does not load here ({_one_line(e)})")
            paths += [Measured(weights, d, problem=f"does not load here: {_one_line(e)}") for d in DECODES]
            continue
        for decode in DECODES:
            paths.append(path := measure(gen, decode, rows))
            progress(_line(path))
        del gen
        gc.collect()
    choice = choose(generator, print_, paths, pending=_pending(paths))
    if save:
        save_choice(choice)
    if build and device.type == "cpu" and choice.pending:
        exact = sorted((p for p in paths if p.decode == "eager" and eligible(p, "cpu")), key=Measured.per_step)
        for eager in exact[:BUILD_TOP]:
            if f"{eager.weights} compiled" not in choice.pending:
                continue
            progress(f"{eager.weights} compiled: building its step (once on this machine; minutes)")
            gen = load(generator, device=device, weights=eager.weights)
            try:
                prepare(gen)
            except Exception as e:  # noqa: BLE001
                progress(f"{eager.weights} compiled: not built ({_one_line(e)})")
            i = next(i for i, p in enumerate(paths) if (p.weights, p.decode) == (eager.weights, "compiled"))
            paths[i] = measure(gen, "compiled", rows)
            progress(_line(paths[i]))
            del gen
            gc.collect()
        choice = choose(generator, print_, paths, pending=_pending(paths))
        if save:
            save_choice(choice)
    return choice


def _pending(paths: list[Measured]) -> list[str]:
    return [p.name for p in paths if p.problem is None and not p.ms]


def _line(p: Measured) -> str:
    if p.problem:
        return f"{p.name}: cannot run here ({p.problem})"
    if not p.ms:
        return f"{p.name}: not built yet"
    exact = "exact" if p.exact else f"NOT exact (a logit differs by up to {p.divergence:.2g})"
    return f"{p.name}: " + ", ".join(f"{ms:.1f} ms at {r} rows" for r, ms in p.ms.items()) + f"; {exact}"


def report(choice: Choice) -> str:
    """The fingerprint, every path's times and exactness, and the choice with its reason (``python -m sbon
    machine``)."""
    fp = choice.fingerprint
    lines = [f"machine: {fp['cpu']}; instructions in force: {fp['capability']}"
             + (f" (limited by {', '.join(f'{k}={v}' for k, v in fp['limits'].items())})" if fp["limits"] else "")
             + f"; flags: {' '.join(fp['flags']) or 'none read'}",
             f"threads: {fp['threads']}; torch {fp['torch']}; device: {fp['device']}; cache key {choice.key}",
             f"paths of {choice.generator} (ms per decode step; exact: a row's logits the same bits alone and in a "
             "batch):"]
    lines += [f"  {_line(p)}" for p in choice.paths]
    lines.append(f"choice: {choice.reason}" if choice.weights else f"choice: none ({choice.reason})")
    if choice.pending:
        lines.append(f"not built yet: {', '.join(choice.pending)} (python -m sbon machine --build builds the fastest "
                     "exact one's step, minutes)")
    return "\n".join(lines)


def check_forced(generator: str, device: str | torch.device, weights: str | None = None,
                 decode: str | None = None) -> None:
    """A forced path (``weights``/``decode`` asked for, SBON_WEIGHTS/SBON_DECODE by default) that was measured and
    cannot run here is refused in one line naming the paths that can."""
    weights = weights or os.environ.get("SBON_WEIGHTS") or None
    decode = decode or os.environ.get("SBON_DECODE") or None
    if decode == "auto":
        decode = None
    if not (weights or decode):
        return
    choice = cached_choice(generator, device)
    if choice is None:
        return
    asked = [p for p in choice.paths if (weights in (None, p.weights)) and (decode in (None, p.decode))]
    if asked and all(p.problem for p in asked):
        runs = ", ".join(p.name for p in choice.paths if p.runs) or "none measured"
        name = " ".join(x for x in (weights, decode) if x)
        raise SBoNError(f"the decode path '{name}' cannot run on this machine ({asked[0].problem}): use one of "
                        f"{runs} (python -m sbon machine measures them)")


def safe_now(generator: str, device: str | torch.device = "cpu") -> tuple[str, str]:
    """The path a run takes now: the cached choice where this machine has one, else the safe path."""
    choice = cached_choice(generator, device)
    return (choice.weights, choice.decode) if choice and choice.weights else safe_path(device)
