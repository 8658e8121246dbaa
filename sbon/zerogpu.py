"""ZeroGPU wiring: Hugging Face's shared-GPU Spaces, where a GPU is lent per call of a decorated function.

On a ZeroGPU Space (``SPACES_ZERO_GPU=true``) the `spaces` package patches torch so that the main
process sees a GPU it does not have: models are moved to ``cuda`` before the app serves, and only a function
decorated with ``@spaces.GPU(duration=...)`` runs on a real GPU, in a forked worker process. What that
function takes and yields crosses a process boundary by pickling, so it takes the run's settings
(plain data) and yields the algorithms' events (plain dataclasses; tests/test_gpu_ready.py pickles
every one). The duration it asks for is estimated from the settings before the GPU is scheduled: a
shorter request gets a visitor an earlier place in the queue, and one above the Space's limit is
refused with a one-line error that says what to lower.

Off ZeroGPU (a CPU Space, a laptop, a local GPU) ``GPU`` is a no-op: with the `spaces` package
installed its decorator returns the function unchanged, and without it this module's stand-in does.

`spaces` must be imported before torch (it refuses to start if CUDA was initialised first), and
``import sbon`` imports torch: app.py therefore imports `spaces` itself, first, before anything else.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from .errors import SBoNError

# The longest GPU call a ZeroGPU Space may request at once, as ZeroGPU's staff have stated it (the
# scheduler refuses longer requests as an "illegal duration"). SBON_ZEROGPU_MAX_S lowers it, e.g.
# to stay within a free visitor's daily quota.
ZEROGPU_MAX_S = 300


def spaces_module():
    """The `spaces` package, or None where it is not installed (CPU Spaces, most local set-ups)."""
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space: the variable ZeroGPU sets, and the package that acts on it."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true") and spaces_module() is not None


def GPU(duration: Callable[..., int] | int | None = None) -> Callable[[Callable], Callable]:
    """``spaces.GPU(duration=...)`` where `spaces` is installed (itself a no-op off ZeroGPU), else a
    decorator that returns the function unchanged, so the app runs the same everywhere."""
    spaces = spaces_module()
    if spaces is None:
        return lambda fn: fn
    return spaces.GPU(duration=duration)


def max_duration() -> int:
    """The Space's limit on one GPU call, in seconds: SBON_ZEROGPU_MAX_S if set, else ZEROGPU_MAX_S."""
    value = os.environ.get("SBON_ZEROGPU_MAX_S")
    if not value:
        return ZEROGPU_MAX_S
    try:
        return max(1, int(value))
    except ValueError:
        raise SBoNError(f"SBON_ZEROGPU_MAX_S must be a number of seconds, got {value!r}") from None


@dataclass(frozen=True)
class GpuCost:
    """What one comparison costs on a ZeroGPU slice, as a sum of parts. Estimates with margin for the
    eager decode loop (launch-bound for small models, weight-bandwidth-bound for 8B ones); a step is never
    cheaper than `python -m benchmarks gpu-check` measured on an H100 (benchmarks/results/gpu-h100/gpu-check,
    checked by tests/test_gpu_ready.py), where even the 135M model's eager step was launch-bound."""
    step_s: float  # one decoding step of a batch, whatever its size (kernel launches, weights read once)
    row_step_s: float  # what each live candidate adds to a step (its KV cache read, its sampling)
    score_s: float  # scoring one response with the reward (decision points, final rewards, prefixes)
    startup_s: float  # moving the models onto the GPU in the worker, prefill, the first kernels


# Per generator preset; a generator not named here (a folder, a hub id) is costed as the largest.
GPU_COSTS: dict[str, GpuCost] = {
    "small": GpuCost(step_s=0.08, row_step_s=0.0002, score_s=0.01, startup_s=10.0),  # up to ~2B parameters
    "8b": GpuCost(step_s=0.08, row_step_s=0.001, score_s=0.03, startup_s=30.0),  # 7-8B in bfloat16
}
GENERATOR_COST = {"smollm2-135m": "small", "gpt2": "small", "llama-3.2-1b-instruct": "small",
                  "gpt-j-6b": "8b", "mistral-7b": "8b", "llama-3-8b": "8b", "llama-3-8b-instruct": "8b"}
# The chat template and a character-to-token ratio that overestimates English prompts, for a prompt
# length before any tokenizer is loaded.
TEMPLATE_TOKENS = 32
CHARS_PER_TOKEN = 3
MARGIN = 1.5  # the request covers a slower-than-estimated run: a run past its duration is aborted
MIN_DURATION_S = 15


def _rounds(settings: Any) -> int:
    """Decision points of the memory-budget rounds: each round's survivors fill the freed memory, so
    rounds lengthen as the candidates thin out; log2 of the length bounds their number in practice."""
    return max(1, int(math.log2(max(2, settings.max_new_tokens))))


# Method -> how many decision points a run of it scores candidates at.
DECISION_POINTS: dict[str, Callable[[Any], int]] = {"sbon": _rounds, "sbon-tau": lambda settings: 1}


def bon_batches(settings: Any, prompt_tokens: int) -> int:
    """How many batches the memory-bound Best-of-N runs in: it holds as many candidates as fit the KV
    budget Speculative Rejection starts with (N candidates of prompt + first-decision tokens), each
    needing room for prompt + max_new_tokens. An upper bound: the app's Best-of-N sizes its batches
    from the peak Speculative Rejection actually reached, which is never below the start."""
    if not getattr(settings, "bon_same_memory", False):
        return 1
    from .config import resolve_first_decision

    first = (settings.tau if settings.method == "sbon-tau"
             else resolve_first_decision(getattr(settings, "first_decision", None), settings.max_new_tokens))
    budget = getattr(settings, "kv_budget", None) or settings.n * (prompt_tokens + first)
    per_batch = max(1, budget // (prompt_tokens + settings.max_new_tokens))
    return math.ceil(settings.n / per_batch)


def estimate_seconds(settings: Any) -> float:
    """GPU seconds one comparison (Speculative Rejection, then Best-of-N, then the prefix rewards)
    should take, before the margin: decoding steps of both runs, plus scoring every candidate at each
    decision point and at the counterfactual prefixes, plus the worker's start."""
    cost = GPU_COSTS[GENERATOR_COST.get(settings.generator, "8b")]
    n, tokens = settings.n, settings.max_new_tokens
    prompt_tokens = TEMPLATE_TOKENS + len(getattr(settings, "prompt", "")) // CHARS_PER_TOKEN
    sbon_steps = tokens  # at most: the survivors run to the length limit
    bon_steps = tokens * bon_batches(settings, prompt_tokens)
    # Rows: Speculative Rejection's live candidates shrink, Best-of-N keeps its batch; N rows bounds both.
    decode = (sbon_steps + bon_steps) * (cost.step_s + n * cost.row_step_s)
    decision_points = DECISION_POINTS.get(settings.method, _rounds)(settings)
    scored = n * (decision_points + 2) + n * decision_points  # both runs' final rewards + BoN's prefixes
    return cost.startup_s + decode + scored * cost.score_s


def gpu_duration(settings: Any) -> int:
    """The GPU seconds to request for one comparison with these settings (``@spaces.GPU``'s dynamic
    duration: called with the decorated function's arguments). Raises SBoNError, naming what to
    lower, when the request would exceed the Space's limit: ZeroGPU would refuse it anyway, later and
    with a less helpful message."""
    seconds = max(MIN_DURATION_S, math.ceil(MARGIN * estimate_seconds(settings)))
    limit = max_duration()
    if seconds > limit:
        advice = "lower N (now {n}) or max new tokens (now {t})".format(n=settings.n, t=settings.max_new_tokens)
        if getattr(settings, "bon_same_memory", False):
            advice += ", or run Best-of-N all at once (untick the same-memory baseline)"
        raise SBoNError(f"this run would need about {seconds} s of GPU, more than this Space allows per run "
                        f"({limit} s): {advice}")
    return seconds


def load_before_launch(load: Callable[[], Any]) -> bool:
    """ZeroGPU's convention: models are moved to CUDA in the main process before the app serves (the
    Space's start, usually at import time; app.py's main() before launch), where `spaces` records them and
    hands them to each GPU worker it forks; a model loaded later would be loaded again in every worker.
    Calls ``load`` on ZeroGPU only and says whether it did."""
    if not on_zerogpu():
        return False
    load()
    return True
