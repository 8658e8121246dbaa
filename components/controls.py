"""Run settings as the controls hold them, their checks, and the curated example prompts."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sbon.config import METHOD_SPECS, PRUNING_METHODS, RunConfig
from sbon.errors import SBoNError
from sbon.models import DEFAULT_GENERATOR, DEFAULT_REWARD, GENERATORS, REWARDS, check_name

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES_FILE = ASSETS / "examples.json"

METHOD_LABELS = {name: METHOD_SPECS[name].label for name in PRUNING_METHODS}

# Upper bounds keep one request from holding the single generation slot for hours on a CPU.
MAX_N = 256
MAX_NEW_TOKENS = 1024
MAX_PROMPT_CHARS = 20_000  # well past the embedded model's 8k-token context; refused before tokenizing


@dataclass
class RunSettings:
    """Everything one comparison needs; the defaults finish in about a minute on 2 CPU cores."""
    prompt: str = ""
    generator: str = DEFAULT_GENERATOR
    # The generator's own likelihood (the objective of the paper's perplexity experiment), not minilm-pref
    # (sbon.models.DEFAULT_REWARD): it is the embedded reward whose partial scores predict its final ones
    # (Kendall at the first decision point: likelihood 0.56, minilm-pref 0.38, on 5 held-out AlpacaEval prompts,
    # N=32, 128 tokens; benchmarks/results/cpu-2core-epyc/defaults/NOTE.md), so the first run shows the
    # assumption Speculative Rejection stands on holding, and the page says which reward it is.
    reward: str = "likelihood"
    method: str = "sbon"
    n: int = 16
    # alpha 0.2 and 128 tokens give three decision points (after 32, 51 and ~98 tokens for a 55-token prompt)
    # in about a minute on 2 CPU cores, so the page shows rounds, not a single cut.
    alpha: float = 0.2
    tau: int = 16  # decision token of "sbon-tau"
    kv_budget: int = 0  # tokens of KV cache for "sbon"; 0 = N candidates of the first decision's length
    max_new_tokens: int = 128
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int = 0
    bon_same_memory: bool = True  # Best-of-N in batches that fit SBoN's peak KV memory (the paper's setting)

    @classmethod
    def from_inputs(cls, **values: Any) -> "RunSettings":
        """Settings from raw control values (numbers may arrive as floats or None): the one place
        where UI input is coerced and checked, so bad input becomes one SBoNError message."""
        s = cls()
        for name, value in values.items():
            default = getattr(cls, name)
            if isinstance(default, bool):
                value = bool(value)
            elif isinstance(default, str):
                value = "" if value is None else str(value)
            elif isinstance(default, int):
                value = _integer(name, value)
            else:
                value = _number(name, value)
            setattr(s, name, value)
        return s

    def check(self) -> None:
        """Raise SBoNError on anything wrong that can be seen without loading a model."""
        if not self.prompt.strip():
            raise SBoNError("the prompt is empty: type a question or pick an example")
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise SBoNError(f"the prompt has {len(self.prompt):,} characters: this app takes at most {MAX_PROMPT_CHARS:,}")
        if self.method not in PRUNING_METHODS:
            raise SBoNError(f"unknown method {self.method!r}: use one of {', '.join(PRUNING_METHODS)}")
        if self.n > MAX_N:
            raise SBoNError(f"N={self.n} is more than this app runs at once ({MAX_N})")
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise SBoNError(f"max new tokens={self.max_new_tokens} is more than this app allows ({MAX_NEW_TOKENS})")
        if self.kv_budget < 0:
            raise SBoNError(f"the KV budget must be a positive number of tokens, or 0 for automatic; got {self.kv_budget}")
        self.config().validate()
        check_name(self.generator, GENERATORS, "generator")
        check_name(self.reward, REWARDS, "reward")

    def config(self) -> RunConfig:
        """The run's settings as the library takes them."""
        return RunConfig(self.method, n=self.n, alpha=self.alpha, tau=self.tau, kv_budget=self.kv_budget or None,
                         max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                         seed=self.seed)

    def comparison_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`sbon.comparison.comparison_events` after the prompt."""
        return dict(config=self.config(), bon_same_memory=self.bon_same_memory)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _integer(name: str, value: Any) -> int:
    number = _number(name, value)
    if number != int(number):
        raise SBoNError(f"{name} must be a whole number, got {value}")
    return int(number)


def _number(name: str, value: Any) -> float:
    if value is None or value == "":
        raise SBoNError(f"{name} is empty: give it a value")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SBoNError(f"{name} must be a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise SBoNError(f"{name} must be a finite number, got {value}")
    return number


# -- choices ------------------------------------------------------------------------------------

def generator_choices() -> list[tuple[str, str]]:
    """(label, preset name) pairs; the embedded default first."""
    return [(f"{name} · {p.description}", name) for name, p in GENERATORS.items()]


def reward_choices() -> list[tuple[str, str]]:
    return [(f"{name} · {p.description}", name) for name, p in REWARDS.items()]


def method_choices() -> list[tuple[str, str]]:
    return [(label, name) for name, label in METHOD_LABELS.items()]


# -- examples -------------------------------------------------------------------------------------

@dataclass
class Example:
    prompt: str
    source: str  # "alpaca_eval" or "hh-rlhf"
    content_note: str = ""  # shown beside prompts that are deliberately harmful (red-teaming)

    @property
    def label(self) -> str:
        warning = "⚠ " if self.content_note else ""
        short = self.prompt if len(self.prompt) <= 60 else self.prompt[:57] + "…"
        return f"{warning}[{self.source}] {short}"


def load_examples(path: Path = EXAMPLES_FILE) -> list[Example]:
    """The curated prompts shipped in assets/examples.json (an empty list if the file is missing)."""
    if not path.exists():
        return []
    return [Example(**e) for e in json.loads(path.read_text())["examples"]]
