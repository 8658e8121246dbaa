"""Scenarios: prompts paired with the reward that makes sense for them, so that a visitor picks a task and
gets a reward that can judge it. One entry per scenario in ``SCENARIOS``; the page builds its scenario
dropdown, its examples and the settings a choice sets from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sbon.ifeval import load_prompts
from sbon.ifeval.data import SHIPPED_FILE

from .controls import DEFAULTS, EXAMPLES
from .updates import Update

# IFEval prompts of the evaluation split (even key) with one instruction each: some are decided early
# ("no commas", "all lowercase", a forbidden word: a violation is final at once), one stays open to the end
# (a postscript): both show when a partial score can and cannot predict the final one.
IFEVAL_EXAMPLE_KEYS = (2798, 2728, 2828, 1130, 2396, 2324)


@dataclass(frozen=True)
class Scenario:
    name: str = field(metadata={"help": "what the visitor wants the model to do"})
    reward: str = field(metadata={"help": "the reward preset that judges it (sbon.models.REWARDS)"})
    caveat: str = field(metadata={"help": "what the reward can and cannot judge, shown in the dropdown itself"})
    prune_by: str = field(default="reward", metadata={"help": "the pruning signal that fits the reward"})
    max_new_tokens: int = field(default=128, metadata={"help": "the answer length the scenario is shown at"})
    prompts: tuple[str, ...] = field(default=(), metadata={"help": "curated example prompts"})

    @property
    def label(self) -> str:
        return f"{self.name}: {self.caveat}"

    def settings(self) -> dict[str, Any]:
        """The controls a choice of this scenario sets."""
        return {"reward": self.reward, "prune_by": self.prune_by, "max_new_tokens": self.max_new_tokens,
                "prompt": self.prompts[0] if self.prompts else None}


def _ifeval_examples() -> tuple[str, ...]:
    by_key = {p.key: p.prompt for p in load_prompts(SHIPPED_FILE)}
    return tuple(by_key[k] for k in IFEVAL_EXAMPLE_KEYS if k in by_key)


HELPFUL_EXAMPLES = tuple(e.prompt for e in EXAMPLES)  # the app's curated AlpacaEval / HH prompts


SCENARIOS: dict[str, Scenario] = {
    "instructions": Scenario("Follow instructions", "ifeval",
                             "instructions checked by program, every verdict readable (an IFEval example, or your "
                             "prompt with instructions from the Instructions builder)",
                             prompts=_ifeval_examples()),
    "helpful": Scenario("Be helpful / harmless", "minilm-pref",
                        "a small preference head; among samples of one model it mostly rewards length",
                        prompts=HELPFUL_EXAMPLES),
    "fluency": Scenario("Fluency", "likelihood",
                        "the generator's own log-probability (the paper's perplexity experiment), not quality",
                        prune_by="logprob", prompts=HELPFUL_EXAMPLES),
}


def scenario_choices() -> list[tuple[str, str]]:
    return [(s.label, key) for key, s in SCENARIOS.items()]


def scenario_of(reward: str, prune_by: str, max_new_tokens: Any) -> str | None:
    """The scenario whose settings these are (the reward, the pruning signal and the answer length it
    sets), or None when they are no scenario's: what the Scenario dropdown shows, on load and after any
    of the three changes."""
    try:
        tokens = int(max_new_tokens)
    except (TypeError, ValueError):
        return None
    return next((key for key, s in SCENARIOS.items()
                 if (s.reward, s.prune_by, s.max_new_tokens) == (reward, prune_by, tokens)), None)


def scenario_prompt_choices(key: str | None) -> list[tuple[str, str]]:
    """The scenario's example prompts as dropdown choices (label shortened, value the whole prompt)."""
    prompts = SCENARIOS[key].prompts if key in SCENARIOS else ()
    return [(p[:90] + ("…" if len(p) > 90 else ""), p) for p in prompts]


def typed(prompt: str | None) -> bool:
    """Whether ``prompt`` is the visitor's own: neither empty nor one of the page's examples."""
    examples = {p for s in SCENARIOS.values() for p in s.prompts} | set(HELPFUL_EXAMPLES) | {DEFAULTS.prompt}
    return bool(prompt and prompt.strip()) and prompt not in examples


def on_scenario(key: str, prompt: str | None = None) -> dict[str, Any]:
    """A scenario sets the reward that can judge its prompts, the pruning signal and the answer length that
    fit it, and offers its example prompts; it puts its first example in the prompt box only where the box holds no
    prompt of the visitor's own (a typed prompt is never replaced)."""
    if key not in SCENARIOS:
        return {}
    settings = SCENARIOS[key].settings()
    example = None if typed(prompt) else settings["prompt"]
    return {"reward": settings["reward"], "prune_by": settings["prune_by"],
            "max_new_tokens": settings["max_new_tokens"], **({"prompt": example} if example else {}),
            "scenario_prompts": Update(choices=scenario_prompt_choices(key), value=example)}


def on_settings_scenario(reward: str, prune_by: str, max_new_tokens: Any) -> dict[str, Any]:
    """The Scenario dropdown follows the settings: it names the scenario they are, or none."""
    key = scenario_of(reward, prune_by, max_new_tokens)
    return {"scenario": key, "scenario_prompts": Update(choices=scenario_prompt_choices(key))}


def on_scenario_prompt(prompt: str | None) -> dict[str, Any]:
    return {"prompt": prompt} if prompt else {}
