"""The IFEval reward: the fraction of a prompt's verifiable instructions a response follows, checked by
program, so a person can verify every score (``explain`` says which instruction passed, why and where).

Final reward (complete response) = (number of instructions followed) / (number of instructions), strict
by default as IFEval's instruction-level strict accuracy, plus a tie-break: ``TIE_BREAK / (1 + characters /
500)`` with ``TIE_BREAK = 1e-3``, so that among responses following the same instructions the *shorter
response wins*, deterministically (characters, not words: free to count). The tie-break is below any difference
of one instruction (at most 1/k for k instructions), so it never overturns one.

Partial reward (unfinished response, at a decision point) = the expected final reward, i.e. the expected
fraction of instructions followed: each instruction counts 1 once satisfied, 0 once violated, and, while
open, the probability that it will be followed given the text so far and the room left (``progress``:
counts against their targets, calibrated on the embedded generator's responses, ``pass_rates.json``
made by ``python -m sbon.ifeval.calibrate``), plus the same tie-break on the partial text. ``score_partial`` computes it; the pruning signal calls it
at decision points when the reward has it (``sbon.signals.RewardSignal``).

Which instructions a prompt carries: those a run brings with it first (``with_instructions``: the command
line's ``--instructions``, the page's Instructions and ``/compare``'s ``instructions`` each bind a copy of
the reward for their own run, so two runs of the same prompt text with different instructions never see
each other's); then ``IFEvalReward.register``'s, process-wide, for a batch script that owns its process;
then, for a prompt whose text is a row of the shipped IFEval file (sbon/assets/ifeval/ifeval_prompts.jsonl),
that row's. A prompt with none raises a one-line SBoNError. ``instructions_of`` gives them in the JSON form
a saved run records, so a reloaded run is judged by the same instructions.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from ..errors import SBoNError
from .checkers import Instruction, build
from .data import SHIPPED_FILE, load_prompts, parse_row
from .progress import ProgressModel
from .verdicts import MODES, Verdict, final_verdicts, partial_verdicts

TIE_BREAK = 1e-3
PASS_RATES_FILE = Path(__file__).with_name("pass_rates.json")
# Value of an open instruction when no calibration file is found: IFEval's instruction-level strict
# accuracy is of this order for small instruction-tuned models (documented, not measured here).
DEFAULT_PRIOR = 0.5
NO_INSTRUCTIONS = ("the ifeval reward needs instructions for this prompt: add an instruction under Instructions, "
                   "or pick an example (command line: --instructions)")


@functools.lru_cache(maxsize=4)
def _shipped(path: Path) -> dict[str, tuple[Instruction, ...]]:
    """The shipped prompts by exact text, each with its built instructions (loaded once)."""
    return {p.prompt: tuple(p.instructions()) for p in load_prompts(path)} if path.exists() else {}


def load_progress_model(path: Path = PASS_RATES_FILE, horizon_tokens: int | None = None) -> ProgressModel:
    """The calibrated progress model; without a calibration file, every open instruction is worth the
    documented prior."""
    if not path.exists():
        return ProgressModel(types={}, open_rates={}, prior=DEFAULT_PRIOR)
    return ProgressModel.from_dict(json.loads(path.read_text()), horizon_tokens)


def tie_break(text: str) -> float:
    """Shorter response wins ties: in (0, TIE_BREAK], decreasing with the length in characters."""
    return TIE_BREAK / (1.0 + len(text) / 500.0)


class IFEvalReward:
    """Reward = fraction of the prompt's IFEval instructions followed (see the module docstring).

    ``score(prompt, responses)`` scores complete responses; ``score_partial(prompt, texts)`` unfinished
    ones; ``explain(prompt, response, final)`` lists one Verdict per instruction; ``with_instructions``
    gives the copy one run uses.
    """
    name = "ifeval"
    tie_term = TIE_BREAK  # partial and final rewards closer than this differ by the length tie-break only
    _registered: ClassVar[dict[str, tuple[Instruction, ...]]] = {}

    def __init__(self, mode: str = "strict", progress: ProgressModel | None = None,
                 prompts_file: str | Path = SHIPPED_FILE, horizon_tokens: int | None = None,
                 count_tokens: Callable[[str], int] | None = None):
        if mode not in MODES:
            raise SBoNError(f"IFEval mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.progress = load_progress_model(horizon_tokens=horizon_tokens) if progress is None else progress
        if count_tokens is not None:
            self.progress.count_tokens = count_tokens
        self.prompts_file = Path(prompts_file)
        self._given: dict[str, tuple[Instruction, ...]] = {}  # this copy's own (with_instructions)

    def with_instructions(self, prompt: str, instructions: Any) -> "IFEvalReward":
        """A copy for one run: ``prompt`` judged by these instructions (any form ``--instructions`` takes,
        checked: a one-line SBoNError naming the field), seen by this copy alone; the calibration and the
        mode are shared."""
        from .instructions import parse_instructions  # it imports this module's checks, not the reverse

        bound = copy.copy(self)
        bound._given = {prompt: tuple(build(i, k) for i, k in parse_instructions(instructions))}
        return bound

    @classmethod
    def register(cls, prompt: str, instruction_ids: Sequence[str], kwargs: Sequence[dict | None]) -> None:
        """Give a prompt its instructions (IFEval ids and arguments) in every IFEvalReward of this process;
        checked now, one-line SBoNError. For a script that owns its process (a benchmark over an IFEval
        file); a run served to a user binds its own with ``with_instructions`` instead."""
        row = parse_row({"prompt": prompt, "instruction_id_list": list(instruction_ids),
                         "kwargs": [k or {} for k in kwargs]}, "register")
        if not row.instruction_ids:
            raise SBoNError("register needs at least one IFEval instruction")
        cls._registered[prompt] = tuple(row.instructions())

    @classmethod
    def unregister(cls, prompt: str) -> None:
        cls._registered.pop(prompt, None)

    def instructions(self, prompt: str) -> tuple[Instruction, ...]:
        """The prompt's instructions: this copy's own first, then registered ones, then the shipped file's, each
        by exact (then stripped) text."""
        for table in (self._given, self._registered, _shipped(self.prompts_file)):
            found = table.get(prompt) or table.get(prompt.strip())
            if found:
                return found
        raise SBoNError(NO_INSTRUCTIONS)

    def instructions_of(self, prompt: str) -> list[dict[str, Any]]:
        """The prompt's instructions as a saved run records them: one ``{"id": ..., arguments}`` each."""
        return [{"id": ins.id, **ins.kwargs} for ins in self.instructions(prompt)]

    def explain(self, prompt: str, response: str, final: bool = True) -> list[Verdict]:
        """One Verdict per instruction: pass/fail for a complete response, satisfied/violated/open for a
        partial one."""
        instructions = self.instructions(prompt)
        if final:
            return final_verdicts(instructions, response, self.mode)
        return partial_verdicts(instructions, response, self.progress.value, self.mode)

    def _reward(self, verdicts: list[Verdict], text: str) -> float:
        return sum(v.value for v in verdicts) / len(verdicts) + tie_break(text)

    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        """Final rewards of complete responses."""
        return [self._reward(self.explain(prompt, r, final=True), r) for r in responses]

    def score_uncertainty(self, prompt: str, texts: Sequence[str]) -> list[float]:
        """Half-width of each partial reward (sbon.cut): half the progress model's resolution (its calibration
        error: it cannot tell apart closer probabilities) per open instruction, over the instructions, plus half the
        tie term (shorter wins ties: no evidence about the final reward). Settled verdicts are exact."""
        out = []
        for text in texts:
            verdicts = self.explain(prompt, text, final=False)
            still_open = sum(v.status == "open" for v in verdicts)
            out.append(still_open * self.progress.resolution / 2 / len(verdicts) + TIE_BREAK / 2)
        return out

    def score_partial(self, prompt: str, texts: Sequence[str]) -> list[float]:
        """Partial rewards of unfinished responses: the expected final reward."""
        return [self._reward(self.explain(prompt, t, final=False), t) for t in texts]
