"""Run settings as the controls hold them, their checks, and the curated example prompts."""

from __future__ import annotations

import json
import math
import random
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sbon.config import IN_WORDS, METHOD_SPECS, PRUNING_METHODS, RunConfig, setting
from sbon.cut import UNDECIDED
from sbon.errors import SBoNError
from sbon.options import field_kind
from sbon.rewards import RewardModel, bind_instructions
from sbon.signals import SIGNALS
from sbon.models import (DEFAULT_GENERATOR, GENERATORS, INSTRUCTION_REWARD, REWARDS, START, check_name,
                         check_reward_prompt)

from .reasons import needs_note, reward_scale
from .updates import Update

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES_FILE = ASSETS / "examples.json"

METHOD_LABELS = {name: METHOD_SPECS[name].label for name in PRUNING_METHODS}

# Upper bounds keep one request from holding the single generation slot for hours on a CPU.
MAX_N = 256
MAX_NEW_TOKENS = 1024
MAX_PROMPT_CHARS = 20_000  # well past the embedded model's 8k-token context; refused before tokenizing


# The page's default seed: the seed of the run it opens on, chosen among recordings of the page's defaults by how
# well their partial rewards predicted (python -m components.record --seeds ...; components.gallery.prediction).
OPENING_SEED = 2


@dataclass
class RunSettings(RunConfig):
    """A RunConfig with the app's defaults, plus what only the page holds: the prompt, the models and
    the Best-of-N baseline. How long a run with these defaults takes is measured by
    `python -m benchmarks app` (docs/app.md)."""
    n: int = 16  # the page always starts a given number of candidates (the CLI can derive N from a budget)
    # alpha 0.2 and 128 tokens give several decision points, so the page shows rounds, not a single cut.
    alpha: float = 0.2
    tau: int = 16
    seed: int = setting(OPENING_SEED, "seed of the coupled sampling: candidate k is the same text in every method")
    # The reward, its pruning signal and the prompt: the one start the page shares with the command line.
    prune_by: str = START.prune_by
    prompt: str = setting(START.prompt, "what the candidates answer")
    generator: str = setting(DEFAULT_GENERATOR, "generator: a preset, a local folder or a hub id")
    reward: str = setting(START.reward, "reward model: a preset, a local folder or a hub id")
    instructions: str = setting("", "ifeval reward: the prompt's instructions as JSON, IFEval ids and arguments, e.g. "
                                    '[{"id": "punctuation:no_comma"}, {"id": "length_constraints:number_words", '
                                    '"num_words": 40, "relation": "less than"}]; empty: the shipped IFEval prompts\' own')
    bon_same_memory: bool = setting(True, "run Best-of-N in batches that fit the KV cache Speculative Rejection "
                                          "peaked at (the paper's memory-bound setting); off: all N at once")

    @classmethod
    def from_inputs(cls, **values: Any) -> "RunSettings":
        """Settings from raw control values (numbers may arrive as floats, None or ""): the one place
        where UI input is coerced, so bad input becomes one SBoNError message. A setting that is
        optional in RunConfig ("none: automatic") reads 0 as none, as its control says."""
        hints = typing.get_type_hints(cls)
        return cls(**{name: _coerce(name, value, hints[name]) for name, value in values.items()})

    def check(self) -> None:
        """Raise SBoNError on anything wrong that can be seen without loading a model: the app's own
        limits, then every setting and the prompt as the library checks them."""
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise SBoNError(f"the prompt has {len(self.prompt):,} characters: this app takes at most {MAX_PROMPT_CHARS:,}")
        if self.method not in PRUNING_METHODS:
            raise SBoNError(f"unknown method {self.method!r}: use one of {', '.join(PRUNING_METHODS)}")
        if self.n > MAX_N:
            raise SBoNError(f"N={self.n} is more than this app runs at once ({MAX_N})")
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise SBoNError(f"max new tokens={self.max_new_tokens} is more than this app allows ({MAX_NEW_TOKENS})")
        if self.seed > MAX_SEED:  # a number box holds larger ones only rounded
            raise SBoNError(f"the seed must be at most {MAX_SEED:,}, got {self.seed:,}")
        self.config().validate(self.prompt)
        check_name(self.generator, GENERATORS, "generator")
        check_name(self.reward, REWARDS, "reward")
        check_reward_prompt(self.reward, self.prompt, self.run_instructions)

    @property
    def run_instructions(self) -> str | None:
        """The instructions this run brings: the builder's, under the ifeval reward; none for other rewards (they
        judge no instructions, and the builder may still hold some from an earlier scenario)."""
        return self.instructions if self.reward == INSTRUCTION_REWARD and self.instructions.strip() else None

    def reward_for_run(self, reward: RewardModel) -> RewardModel:
        """The loaded reward as this run uses it: bound to this run's instructions, seen by no other run (two
        visitors may run the same prompt text with different instructions at once)."""
        return bind_instructions(reward, self.prompt, self.run_instructions)

    def config(self) -> RunConfig:
        """The run's settings as the library takes them."""
        return RunConfig(**{f.name: getattr(self, f.name) for f in fields(RunConfig)})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coerce(name: str, value: Any, hint: Any) -> Any:
    kind, optional = field_kind(hint)
    name = IN_WORDS.get(name, name)
    if kind is bool:
        return bool(value)
    if kind is str:
        return "" if value is None else str(value)
    if optional and value in (None, ""):
        return None
    number = _integer(name, value) if kind is int else _number(name, value)
    if optional and number == 0:
        return None
    if optional and number < 0:
        raise SBoNError(f"{name} must be a positive number, or 0 for automatic; got {value}")
    return number


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


# -- the API's description of each setting ------------------------------------------------------------

# Ranges the checks enforce (RunSettings.check and RunConfig.validate), for the API's documentation:
# (minimum, maximum, what the bounds mean). None is an open end.
RANGES: dict[str, tuple[float | None, float | None, str]] = {
    "n": (1, MAX_N, ""),
    "alpha": (0, 1, "0 ≤ alpha < 1"),
    "tau": (1, MAX_NEW_TOKENS - 1, "below max_new_tokens"),
    "kv_budget": (0, None, "0 = automatic"),
    "first_decision": (0, MAX_NEW_TOKENS - 1, "0 = automatic; below max_new_tokens"),
    "max_new_tokens": (1, MAX_NEW_TOKENS, ""),
    "temperature": (0, None, "above 0"),
    "top_p": (0, 1, "0 < top_p ≤ 1"),
    "seed": (0, None, ""),
}


def setting_help(name: str) -> str:
    """A setting's help text, as the CLI shows it: from RunSettings, else from the RunConfig field it
    overrides (RunSettings changes some defaults and keeps the library's words for them)."""
    for cls in (RunSettings, RunConfig):
        f = next((f for f in fields(cls) if f.name == name), None)
        if f is not None and f.metadata.get("help"):
            return f.metadata["help"]
    return ""


def api_parameter(name: str) -> dict[str, Any]:
    """The JSON-schema additions that describe one setting in the API: its help, its range and its
    choices (when the setting has a fixed list), all from the one settings path."""
    info: dict[str, Any] = {"description": setting_help(name)}
    lo, hi, note = RANGES.get(name, (None, None, ""))
    if lo is not None:
        info["minimum"] = lo
    if hi is not None:
        info["maximum"] = hi
    bounds = f"{lo} to {hi}" if lo is not None and hi is not None else f"≥ {lo}" if lo is not None else ""
    if bounds or note:
        info["description"] += f" (range: {bounds}{'; ' + note if note else ''})"
    choices = {"method": list(PRUNING_METHODS), "prune_by": signal_choices(), "undecided": list(UNDECIDED)}.get(name)
    if choices:
        info["enum"] = choices
        info["description"] += f" (one of: {', '.join(choices)})"
    if name in ("generator", "reward"):
        presets = GENERATORS if name == "generator" else REWARDS
        info["description"] += f" (presets: {', '.join(presets)})"
    return info


# -- choices ------------------------------------------------------------------------------------

def _needs(preset, name: str) -> str:
    note = needs_note(preset, name)
    return f" · {note}" if note else ""


def generator_choices() -> list[tuple[str, str]]:
    """(label, preset name) pairs; the embedded default first. Hub presets say what they need
    (network, GPU memory), derived from their Preset fields."""
    return [(f"{p.description}{_needs(p, name)}", name) for name, p in GENERATORS.items()]


def reward_choices() -> list[tuple[str, str]]:
    """(label, preset name) pairs: each says its scale and meaning, and what it needs to load."""
    return [(f"{p.title or p.description} · scale: {reward_scale(name).short()}{_needs(p, name)}", name)
            for name, p in REWARDS.items()]


def method_choices() -> list[tuple[str, str]]:
    return [(label, name) for name, label in METHOD_LABELS.items()]


def signal_choices() -> list[str]:
    """The pruning signals' names (sbon.signals.SIGNALS: a new one appears here by itself)."""
    return list(SIGNALS)


def signal_labels() -> list[tuple[str, str]]:
    """(human name, name) of every pruning signal, for the page's selector."""
    return [(cls.title, name) for name, cls in SIGNALS.items()]


# -- examples -------------------------------------------------------------------------------------

@dataclass
class Example:
    prompt: str
    source: str  # "alpaca_eval" or "hh-rlhf"
    content_note: str = ""  # shown beside prompts that are deliberately harmful (red-teaming)

    @property
    def label(self) -> str:
        """The prompt, shortened, and what kind of request it is: a harmful one is marked by its content note, not
        by its data set (HH-RLHF's prompts are harmless ones too)."""
        short = self.prompt if len(self.prompt) <= 60 else self.prompt[:57] + "…"
        return f"⚠ {short} (deliberately harmful)" if self.content_note else f"{short} (everyday request)"


def load_examples(path: Path = EXAMPLES_FILE) -> list[Example]:
    """The curated prompts shipped in assets/examples.json (an empty list if the file is missing)."""
    if not path.exists():
        return []
    return [Example(**e) for e in json.loads(path.read_text())["examples"]]


DEFAULTS = RunSettings()  # the page's controls start here
EXAMPLES = load_examples()
CONTENT_NOTES = {e.prompt: e.content_note for e in EXAMPLES if e.content_note}


# -- the page's controls: plain data in, {page element name: value} out ------------------------------

# The controls, in the order their values reach the handlers: each is named after the RunSettings
# field it sets, and the page element of that name holds it.
SETTING_NAMES = ("prompt", "method", "prune_by", "undecided", "n", "alpha", "tau", "kv_budget", "first_decision", "max_new_tokens",
                 "bon_same_memory", "generator", "reward", "temperature", "top_p", "seed", "instructions")
# The undecided setting's choices as the page names them (the value stays the setting's).
UNDECIDED_CHOICES = [("rank them anyway (the paper's rule)", "paper"),
                     ("keep them, prune only the clear ones", "prune"),
                     ("keep them until the next decision point", "defer"),
                     ("decide by a fair random draw", "random")]
METHOD_KNOBS = ("tau", "kv_budget", "first_decision")  # controls that only some methods read (METHOD_SPECS' params)
MAX_SEED = 2**31 - 1
NEW_SEEDS = 10**6  # New seed draws below this: six digits at most


def controls_for(comp: Any, automatic: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every control (SETTING_NAMES) set to what a recorded comparison ran with, so that Run reproduces its
    configuration: its method, prompt, models, instructions and settings; a setting the run did not record (another
    method's) keeps the page's default, and the ``automatic`` ones read 0, the page's "automatic" (a gallery story
    never fixed them: its recorded values are what automatic gave for its prompt)."""
    run = comp.speculative
    recorded = {**{name: getattr(DEFAULTS, name) for name in SETTING_NAMES},
                **{k: v for k, v in run.settings.items() if k in SETTING_NAMES and v is not None},
                "method": run.method, "prompt": run.prompt, "generator": run.generator, "reward": run.reward,
                "instructions": json.dumps(run.instructions) if run.instructions else "",
                "bon_same_memory": comp.bon.settings.get("batch_size") is not None}
    return {name: 0 if name in automatic else recorded[name] for name in SETTING_NAMES}


def settings_from(values: tuple) -> RunSettings:
    """The settings the controls hold (their values in SETTING_NAMES' order), checked."""
    settings = RunSettings.from_inputs(**dict(zip(SETTING_NAMES, values)))
    settings.check()
    return settings


def reads(method: str, setting: str) -> bool:
    return method in METHOD_SPECS and setting in METHOD_SPECS[method].params


def on_method(method: str) -> dict[str, Any]:
    """Show each method's own knobs: τ for one decision token, the budget and first decision for rounds."""
    return {knob: Update(visible=reads(method, knob)) for knob in METHOD_KNOBS}


def on_new_seed(seed: Any) -> int:
    """A fresh seed for the next run (other candidates, same settings), never the one shown. At most six digits, so a
    class reads it off the screen and types it in; any seed up to MAX_SEED can be typed."""
    current = int(seed) if isinstance(seed, (int, float)) and math.isfinite(seed) else -1
    fresh = random.randrange(NEW_SEEDS)
    return fresh if fresh != current else (fresh + 1) % NEW_SEEDS


def on_prompt(text: str) -> dict[str, Any]:
    """A deliberately harmful example prompt shows its content note."""
    note = CONTENT_NOTES.get(text.strip())
    return {"prompt_note": Update(value=f"⚠ **Content note:** {note}" if note else "", visible=bool(note))}
