"""The page's Instructions builder: pick instructions by what they ask, read each in words with its arguments, edit
the arguments as JSON (IFEval's ids, behind "Edit as JSON"). Giving instructions switches the run's reward to the
instruction reward, which checks them; another reward chosen afterwards is said, in one line, to ignore them. Plain
data in, values by page element name out; the checks and the registration are sbon.ifeval.instructions' (the
command line and /compare use the same)."""

from __future__ import annotations

import functools
from typing import Any

from sbon.errors import SBoNError
from sbon.ifeval.data import SHIPPED_FILE, load_prompts
from sbon.ifeval.instructions import DESCRIPTIONS, EXAMPLE_ARGS, by_frequency, parse_instructions, to_json
from sbon.models import INSTRUCTION_REWARD, reward_title

PLACEHOLDER = '[{"id": "punctuation:no_comma"}, {"id": "change_case:english_lowercase"}]'
SWITCHED = "The run's reward is *Follow instructions*: it checks each of these."


def instruction_title(instruction: Any) -> str:
    """An instruction's human name ('no comma'), from its id ('punctuation:no_comma') or a recorded run's
    {"id": ...} entry; the id stays the JSON's and the tooltip's."""
    ident = str(instruction.get("id")) if isinstance(instruction, dict) else str(instruction)
    return ident.split(":")[-1].replace("_", " ")


def type_choices() -> list[tuple[str, str]]:
    """(label, id) of every instruction type, by what it asks, the most frequent in IFEval first."""
    return [(DESCRIPTIONS[i], i) for i in by_frequency()]


def _current(text: str) -> list[tuple[str, dict]]:
    try:
        return parse_instructions(text) if text and text.strip() else []
    except SBoNError:
        return []  # the box holds something unfinished: start from the picked types


def on_types(ids: list[str] | None, text: str, reward: str | None = INSTRUCTION_REWARD) -> dict[str, Any]:
    """A click in the list adds that instruction to the box (with example arguments), keeping every instruction
    already there with its arguments; the list empties again, so the next click adds too (an instruction is
    removed under "Edit as JSON", or all by Clear). Instructions given under another reward switch it to the
    instruction reward (the note says so)."""
    current = _current(text)
    have = {i for i, _ in current}
    added = [(i, EXAMPLE_ARGS.get(i, {})) for i in ids or [] if i not in have]
    chosen = current + added
    return {"instructions": to_json(chosen) if chosen else (text or ""), "instruction_types": [],
            **switched(chosen, reward)}


def on_typed(text: str, reward: str | None) -> dict[str, Any]:
    """Instructions typed (or pasted) into the JSON box switch the reward as picked ones do."""
    return switched(_current(text), reward)


def switched(instructions: list, reward: str | None) -> dict[str, Any]:
    """The reward to switch to: the instruction reward, where instructions are given under another."""
    return {"reward": INSTRUCTION_REWARD} if instructions and reward != INSTRUCTION_REWARD else {}


def ignored(reward: str) -> str:
    """The one line that says a reward ignores the instructions given."""
    return (f"⚠ The reward now, {reward_title(reward) if reward else 'none'}, ignores these instructions: choose the "
            "*Follow instructions* scenario to have them checked.")


def in_words(kwargs: dict) -> str:
    """An instruction's arguments in words: 'num words: 60, relation: less than'."""
    def value(v: Any) -> str:
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return ", ".join(f"{k.replace('_', ' ')}: {value(v)}" for k, v in kwargs.items())


def on_text(text: str, reward: str | None = INSTRUCTION_REWARD) -> dict[str, Any]:
    """One line per instruction, in words, with its arguments; a line first when the run's reward ignores them (or has
    just been switched to check them); or the one-line reason the box is refused."""
    if not text or not text.strip():
        return {"instructions_note": "No instructions: the *Follow instructions* reward then judges only the "
                                     "IFEval example prompts."}
    try:
        parsed = parse_instructions(text)
    except SBoNError as e:
        return {"instructions_note": f"⚠ {e}"}
    lines = [f"- **{DESCRIPTIONS[i]}**" + (f" ({in_words(kw)})" if kw else "") for i, kw in parsed]
    first = [SWITCHED if reward == INSTRUCTION_REWARD else ignored(reward or "")]
    return {"instructions_note": "\n".join(first + lines)}


def shipped_instructions(prompt: str) -> list[tuple[str, dict]] | None:
    """An IFEval example prompt's own instructions (None for any other prompt)."""
    row = next((p for p in load_prompts(SHIPPED_FILE) if p.prompt == prompt), None)
    return None if row is None else [(i, {k: v for k, v in kw.items() if v is not None})
                                     for i, kw in zip(row.instruction_ids, row.kwargs)]


def on_example(prompt: str | None) -> dict[str, Any]:
    """A scenario example fills the builder with its instructions; other examples leave it alone."""
    found = shipped_instructions(prompt) if prompt else None
    if found is None:
        return {}
    return {"instructions": to_json(found), "instruction_types": []}


@functools.lru_cache(maxsize=1)
def _example_sets() -> frozenset[str]:
    """The shipped IFEval prompts' own instruction sets, as the builder writes them."""
    return frozenset(to_json([(i, {k: v for k, v in kw.items() if v is not None})
                              for i, kw in zip(row.instruction_ids, row.kwargs)]) for row in load_prompts(SHIPPED_FILE))


def on_prompt(prompt: str | None, text: str | None) -> dict[str, Any]:
    """A prompt of your own clears the instructions a scenario example left in the builder (they were that
    example's, not yours); instructions you wrote or added stay, and an example prompt is on_example's."""
    if not text or not prompt or shipped_instructions(prompt) is not None:
        return {}
    parsed = _current(text)
    return {"instructions": ""} if parsed and to_json(parsed) in _example_sets() else {}
