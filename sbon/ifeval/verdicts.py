"""Verdicts: each instruction's answer on one response, final (pass/fail) or partial
(satisfied/violated/open), with its reason, the deciding span and what it adds to the reward.

Final verdicts follow IFEval's ``evaluation_lib.py``: ``strict`` checks the response as it is (an empty
response follows nothing); ``loose`` also accepts the response when one of its trimmed variants passes:
without its first line, without its last line, without both, and each of these (and the response)
with every ``*`` removed, the variants that forgive a preamble, a sign-off or markdown bold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .checkers import FAIL, OPEN, PASS, SATISFIED, VIOLATED, Instruction, Outcome

MODES = ("strict", "loose")


@dataclass(frozen=True)
class Verdict:
    """One instruction's verdict on one response: what the page shows next to the text."""
    instruction_id: str = field(metadata={"help": "IFEval's id, e.g. 'punctuation:no_comma'"})
    status: str = field(metadata={"help": "final: 'pass' or 'fail'; partial: 'satisfied', 'violated' or 'open'"})
    reason: str = field(metadata={"help": "short and human, e.g. 'comma at ‘sea, the’'"})
    span: tuple[int, int] | None = field(metadata={"help": "(start, end) characters of the response that decided "
                                                           "it; None when no single place did"})
    value: float = field(metadata={"help": "what it adds to the reward before averaging: 1 pass/satisfied, 0 fail/"
                                           "violated, P(followed | text so far) when open"})
    final: bool = field(metadata={"help": "True for a complete response's verdict"})

    @property
    def followed(self) -> bool | None:
        """True/False once decided (pass or satisfied / fail or violated), None while open."""
        return None if self.status == OPEN else self.status in (PASS, SATISFIED)


def _variants(response: str) -> list[tuple[str, str]]:
    """IFEval's loose variants, in its order, each with a name for the reason."""
    lines = response.split("\n")
    first, last, both = "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()
    named = [("", response), ("without *", response.replace("*", "")), ("without first line", first),
             ("without last line", last), ("without first and last lines", both),
             ("without first line and *", first.replace("*", "")),
             ("without last line and *", last.replace("*", "")),
             ("without first and last lines and *", both.replace("*", ""))]
    return named


def _final_one(instruction: Instruction, response: str, mode: str) -> Outcome:
    if not response.strip():
        return Outcome(FAIL, "empty response")
    first = instruction.final(response)
    if first.status == PASS or mode == "strict":
        return first
    for name, variant in _variants(response)[1:]:
        if variant.strip() and instruction.check(variant):
            return Outcome(PASS, f"loose, {name}: {instruction.final(variant).reason}")
    return first


def final_verdicts(instructions: Sequence[Instruction], response: str, mode: str = "strict") -> list[Verdict]:
    """Each instruction's pass/fail on a complete response, IFEval's strict or loose way."""
    out = []
    for ins in instructions:
        o = _final_one(ins, response, mode)
        out.append(Verdict(ins.id, o.status, o.reason, o.span, 1.0 if o.status == PASS else 0.0, True))
    return out


def partial_verdicts(instructions: Sequence[Instruction], text: str,
                     open_value: Callable[[Instruction, str], float], mode: str = "strict") -> list[Verdict]:
    """Each instruction's verdict on an unfinished response; an open one is worth ``open_value``, the
    probability that it will be followed given the text so far (``progress.ProgressModel.value``). Under ``loose`` a violation is
    only open: a trimmed variant (first or last line, or ``*``, removed) may still pass; a satisfied
    instruction stays satisfied, since the response itself is the first variant."""
    out = []
    for ins in instructions:
        o = ins.partial(text)
        if mode == "loose" and o.status == VIOLATED:
            o = Outcome(OPEN, f"{o.reason} (loose: a trimmed variant may still pass)", o.span)
        value = {SATISFIED: 1.0, VIOLATED: 0.0}.get(o.status)
        out.append(Verdict(ins.id, o.status, o.reason, o.span, open_value(ins, text) if value is None else value,
                           False))
    return out
