"""Why each candidate was kept or cut, in words every view shares, and what each reward's numbers mean.

A decision point ranks its contenders by one score and keeps those at or above the cut. For any
candidate that gives one short reason, e.g. "rank 14 of 16, 0.50 < cut 0.67", with as many decimals
as the spread of the scores needs to tell them apart. With coupled sampling a pruned candidate's
Best-of-N twin shows what the cut cost: the twin may be Best-of-N's winner, or beat the response
Speculative Rejection returned.

Rewards may explain themselves: one with ``explain(prompt, response, final)`` returning objects with
``.status`` and ``.reason`` (duck typing: no base class) gets those listed in the candidate detail.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from sbon.cut import cut
from sbon.models import INSTRUCTION_REWARD, REWARDS, Preset
from sbon.results import DecisionPoint, RunResult
from sbon.signals import on_reward_scale, signal_title

MIN_DECIMALS, MAX_DECIMALS = 2, 6
MAX_SEPARATING_DECIMALS = 12  # two scores closer than this are printed alike (then they differ in float noise only)
BF16_BYTES_PER_PARAM = 2  # a GPU loads the hub presets in bfloat16 (sbon.models.load_reward / load_generator)
GPU_FROM_BILLION_PARAMS = 1.0  # models this large are impractical on a CPU


# -- decimals ----------------------------------------------------------------------------------------

def decimals(values: Iterable[float | None]) -> int:
    """Decimals that tell these values apart: enough to resolve the typical gap between neighbours
    (the spread over the count), at least MIN_DECIMALS. 4.1…6.2 needs 2, -0.045…0.083 needs 3."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    spread = max(finite) - min(finite) if len(finite) > 1 else 0.0
    if spread <= 0:
        return MIN_DECIMALS
    return int(min(MAX_DECIMALS, max(MIN_DECIMALS, math.ceil(-math.log10(spread / len(finite))))))


def fmt(x: float | None, digits: int) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


# -- reasons -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CutReason:
    """Where one contender stood at one decision point."""
    round: int = field(metadata={"help": "the decision point (1-based)"})
    tokens: int = field(metadata={"help": "tokens each live candidate had generated there"})
    rank: int | None = field(metadata={"help": "1 = best score among the ranked contenders; None: not ranked"})
    of: int = field(metadata={"help": "how many contenders were ranked"})
    score: float = field(metadata={"help": "the score it was ranked by (a finished one's: its final reward)"})
    cut: float = field(metadata={"help": "the lowest score that survived"})
    outcome: str = field(metadata={"help": "'kept', 'pruned' or 'retired' (finished, below the cut)"})
    finished: bool = field(metadata={"help": "it had finished: its score is its final reward"})
    digits: int = field(default=MIN_DECIMALS, metadata={"help": "decimals that tell this point's scores apart"})
    signal: str = field(default="reward", metadata={"help": "the pruning signal that ranked the live contenders"})
    forced: bool = field(default=False, metadata={"help": "pruned although at or above the cut: the budget forced it"})
    undecided: bool = field(default=False, metadata={"help": "the signal could not tell it apart from the cut"})
    rule: str = field(default="paper", metadata={"help": "what the decision point did with undecided ones (sbon.cut.UNDECIDED)"})
    tie_note: str = field(default="", metadata={"help": "every live score was alike: what that means (tie_text)"})

    def text(self) -> str:
        """e.g. 'rank 14 of 16, 0.50 < cut 0.67'; a finished answer the signal cannot rank says so; a candidate the
        signal could not tell apart from the cut, or a cut among scores that were all alike, says that instead."""
        budget = ", halted all the same: the survivors had to fit the KV budget"
        if self.tie_note and not self.finished and self.rank is not None:
            return f"{self.tie_note} (rank {self.rank} of {self.of})" + (budget if self.forced else "")
        if self.undecided and not self.finished and self.rank is not None:
            digits = separating_digits(self.score, self.cut, self.digits)
            done = (UNDECIDED_KEPT if self.outcome == "kept" else UNDECIDED_PRUNED).get(self.rule, "")
            return (f"rank {self.rank} of {self.of}, could not be told apart from the cut ({fmt(self.score, digits)} "
                    f"against {fmt(self.cut, digits)}): " + (budget[2:] if self.forced else done))
        if self.rank is None:  # sbon.cut.cut with rank_finished=False: finished answers stay in, unranked
            return (f"not ranked: it had finished (final reward {fmt(self.score, self.digits)}), and the "
                    f"{signal_title(self.signal)} signal cannot rank a finished answer against live ones, so it "
                    f"stays in contention")
        forced = self.outcome == "pruned" and (self.forced or self.score > self.cut)  # the progress rule (sbon.cut.cut)
        tied = self.score == self.cut
        sign = "=" if tied else "≥" if self.outcome == "kept" or forced else "<"
        digits = separating_digits(self.score, self.cut, self.digits)
        lost_tie = tied and self.outcome != "kept"
        return (f"rank {self.rank} of {self.of}, {fmt(self.score, digits)} {sign} cut {fmt(self.cut, digits)}"
                + (" (a tie at the cut: ties go to the lower candidate number)" if lost_tie and not forced else "")
                + (", halted all the same: the survivors had to fit the KV budget" if forced else "")
                + (" (final reward: it had finished)" if self.finished else ""))


def separating_digits(a: float, b: float, digits: int) -> int:
    """At least ``digits``, and as many more (to MAX_SEPARATING_DECIMALS) as it takes for two different numbers
    not to print the same: '0.00 < cut 0.00' would read as false."""
    while a != b and fmt(a, digits) == fmt(b, digits) and digits < MAX_SEPARATING_DECIMALS:
        digits += 1
    return digits


# What a decision point did with a candidate its signal could not tell apart from the cut, by rule
# (sbon.cut.UNDECIDED): the end of its reason, and the round caption's words for all of them.
UNDECIDED_KEPT = {"paper": "kept by the order of the scores all the same (the paper's rule)",
                  "prune": "kept, since only candidates clearly below the cut are pruned",
                  "defer": "kept to wait for the next decision point",
                  "random": "kept by a random draw"}
UNDECIDED_PRUNED = {"paper": "pruned by the order of the scores all the same (the paper's rule)",
                    "random": "pruned by a random draw",
                    "prune": "pruned", "defer": "pruned by a random draw after waiting a decision point"}
UNDECIDED_DONE = {"paper": "ranked anyway", "prune": "none pruned for its score", "defer": "kept to wait a round, or drawn",
                  "random": "drawn at random"}
# Said once, in words, when every live contender was within the signal's noise of the cut: a mark on each would
# separate none of them (sbon.score_noise: the noise a reward's partial scores carry).
COIN_TOSS = "every score is within the reward's noise of the cut: a coin toss"


def coin_toss_text(point: DecisionPoint, short: bool = False) -> str:
    """What a decision point whose live contenders were all undecided did, by its rule: under the paper's the cut is
    close to a coin toss; under another rule, what that rule did with them. ``short``: the round caption's words."""
    rule = point.undecided_rule
    if short:
        return f"scores within the noise: {'a coin toss' if rule == 'paper' else UNDECIDED_DONE[rule]}"
    return COIN_TOSS if rule == "paper" else f"every score is within the reward's noise of the cut: {UNDECIDED_DONE[rule]}"


def live_contenders(point: DecisionPoint) -> list[int]:
    """The contenders still generating (the ones the signal scored)."""
    return [k for k in point.contenders if k not in point.final]


def coin_toss(point: DecisionPoint) -> bool:
    """Whether every live contender (two or more) was undecided: the signal could not tell any of them apart from
    the cut, so the cut says nothing about which of them is better."""
    live = live_contenders(point)
    return len(live) > 1 and set(live) <= set(point.undecided)


def marked_undecided(point: DecisionPoint) -> list[int]:
    """The live contenders a view marks as undecided: only where the mark separates some from others (none in a
    coin toss, which is said once in words instead)."""
    return [] if coin_toss(point) else [k for k in live_contenders(point) if k in point.undecided]


def tie_broken_by_score(point: DecisionPoint) -> bool:
    """Whether, in a cut among live scores all alike up to the signal's tie term, the scores still differed where
    the cut fell (the tie term ordered them: sbon.cut.cut ranks by score, then the lower id): the lowest live
    survivor scores above the best live candidate pruned for its score. False: equal there, the candidate number
    decided (or nothing was pruned for its score)."""
    score = point.score_of()
    kept = [score[k] for k in live_contenders(point) if k in point.survivors]
    below = [score[k] for k in point.pruned if k not in point.forced]
    return bool(kept and below) and min(kept) != max(below)


def tie_text(point: DecisionPoint, reward: str, short: bool = False) -> str:
    """When every live contender's score was alike up to the signal's tie term: what that says about them, and
    what decided the cut by the rule the run applied; '' otherwise. ``reward``: the run's reward (whose tie term
    it was); ``short``: the round caption's words for the same reason. The one place that says why such a cut fell
    where it did: every caption, title and reason calls it."""
    if not point.tied:
        return ""
    live = [s for k, s in zip(point.contenders, point.scores) if k not in point.final]
    if reward == INSTRUCTION_REWARD:
        from sbon.ifeval.reward import TIE_BREAK

        none = live and max(live) <= TIE_BREAK
        who = (("none can still pass" if short else "no candidate can still follow the instructions") if none else
               ("all as likely to pass" if short else "all as likely to follow the instructions"))
    else:
        who = "all scored the same"
    paper = ("shortest kept" if reward == INSTRUCTION_REWARD else "higher tie-break kept") \
        if tie_broken_by_score(point) else "lowest numbers kept" if short else "the lowest candidate numbers kept"
    fell = {"paper": paper, "random": "kept by a random draw",
            "prune": "none pruned for its score", "defer": "none pruned for its score yet"}
    return f"{who}: {fell.get(point.undecided_rule, paper)}"


def point_reasons(point: DecisionPoint, reward: str = "") -> dict[int, CutReason]:
    """Every contender of one decision point -> its reason, ranked as the cut rule ranks them (sbon.cut.cut:
    ties go to the lower candidate number; a finished contender only when the signal can rank it). ``reward``:
    the run's reward, for the words of a cut among scores that were all alike (``tie_text``)."""
    digits = decimals(point.scores)
    scores = point.score_of()
    ranks_finished = point.ranks_finished if point.ranks_finished is not None else on_reward_scale(point.signal, None)
    ranked = cut(scores, set(point.final), 0.0, rank_finished=ranks_finished).ranked
    rank = {k: r + 1 for r, k in enumerate(ranked)}
    pruned, retired, final = set(point.pruned), set(point.retired), set(point.final)
    undecided, note = set(point.undecided), tie_text(point, reward)
    return {k: CutReason(point.round, point.tokens, rank.get(k), len(ranked), s, point.cut,
                         "pruned" if k in pruned else "retired" if k in retired else "kept", k in final, digits,
                         point.signal, k in point.forced, k in undecided, point.undecided_rule, note)
            for k, s in zip(point.contenders, point.scores)}


def candidate_reasons(run: RunResult, k: int) -> list[CutReason]:
    """Candidate k's reason at every decision point it contended in, in order."""
    return [r[k] for r in (point_reasons(p, run.reward) for p in run.decision_points) if k in r]


def pruning_cost(comp: Any, k: int) -> str:
    """What pruning candidate k cost, from its Best-of-N twin ('' when it was not pruned or cost
    nothing): the twin is Best-of-N's winner, or its final reward beats the response Speculative
    Rejection returned."""
    if comp.speculative.candidates[k].pruned_round is None or comp.diverged(k):  # a diverged twin is another text
        return ""
    twin, returned = comp.bon.candidates[k].final_reward, comp.speculative.best.final_reward
    if k == comp.bon.best_id:
        return "its Best-of-N twin is Best-of-N's winner"
    if twin is not None and returned is not None and twin > returned:
        return "its Best-of-N twin scores above the response Speculative Rejection returned"
    return ""


# -- per-instruction explanations (duck typed) ----------------------------------------------------------

def explanations(reward: Any, prompt: str, response: str, final: bool) -> list[tuple[str, str]]:
    """(status, reason) pairs from a reward that explains itself; [] for one that does not, or whose
    explain fails (the detail view must still show)."""
    explain = getattr(reward, "explain", None)
    if not callable(explain):
        return []
    try:
        return [(str(getattr(item, "status", "")), str(getattr(item, "reason", "")))
                for item in explain(prompt, response, final)]
    except Exception as e:  # noqa: BLE001 - a third-party reward's bug must not break the page
        return [("⚠", f"explain failed: {type(e).__name__}: {e}")]


def explanations_html(items: Sequence[tuple[str, str]]) -> str:
    if not items:
        return ""
    rows = "".join(f"<li><b>{html.escape(status)}</b> {html.escape(reason)}</li>" for status, reason in items)
    return f'<p>The reward model explains its score:</p><ul class="sbon-explain">{rows}</ul>'


# -- what a reward's numbers mean -----------------------------------------------------------------------

@dataclass(frozen=True)
class RewardScale:
    unit: str = field(metadata={"help": "what one number is, e.g. 'mean log-probability per token'"})
    meaning: str = field(metadata={"help": "its range and direction"})

    def short(self) -> str:
        return f"{self.unit}; {self.meaning}"


def reward_scale(name: str) -> RewardScale:
    """What a reward's numbers mean: its preset's ``scale`` (sbon.models.REWARDS); a folder or hub id is a
    sequence classifier's output."""
    preset = REWARDS.get(name)
    return RewardScale(*(preset.scale if preset is not None else Preset("", "").scale))


def billions_of_parameters(preset: Preset, name: str = "") -> float | None:
    """The model size the preset's names state ('8B', '124M', 'llama3-8b'), or None."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*([BM])\b", f"{preset.description} {preset.hub_id} {name}", re.IGNORECASE)
    if not match:
        return None
    return float(match.group(1)) / (1 if match.group(2).upper() == "B" else 1000)


def needs_note(preset: Preset, name: str = "") -> str:
    """What a preset needs beyond this machine, derived from its fields: the hub (no package, not
    offline), and a GPU with its bfloat16 weights' memory for a model of a billion parameters or more."""
    if preset.offline or preset.package or not preset.hub_id:
        return ""
    size = billions_of_parameters(preset, name)
    if size is None:
        return "needs network, size not stated (likely a GPU)"
    if size < GPU_FROM_BILLION_PARAMS:
        return "needs network"
    return f"needs network + GPU, ~{size * BF16_BYTES_PER_PARAM:.0f} GB"
