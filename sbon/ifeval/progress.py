"""The value of an open instruction: the probability that the complete response will follow it, given how
far the unfinished response has come and how much room it has left.

Every settled verdict is exact (1 satisfied, 0 violated); this module values only the open ones.

**Counts.** Most instructions are counts that appending can only grow (``Instruction.progress``): words,
ended sentences, ``***`` dividers, bullet lines, ``*highlighted*`` sections, ``[placeholders]``, keyword
and letter occurrences, CAPITAL words; and, with a count of 0 so far, events that have not happened yet
(a required ending, postscript, ``<<title>>`` or keyword not yet written; a comma, forbidden word or
wrong-case letter that must never come). The complete response needs its count to be *at least*,
*less than* or *exactly* a target.

**Progress model.** Events of a type arrive at a rate per token of response, different from one
response to the next (one answer writes bullets, another none). The rate gets a Gamma prior per
instruction type, mean ``rate`` (measured on the calibration responses) with the weight of ``strength``
tokens, updated by what the prefix shows: c events in t tokens give the posterior Gamma(strength * rate + c,
strength + t), the candidate's own pace. The response writes R more tokens: the room left before the
horizon (the run's max new tokens), or fewer, since the generator ends a response at any token with
probability ``stop_rate`` (a geometric stop; ``STOP_POINTS`` equally likely values of R are averaged).
The events still to come in R tokens are then negative binomial (Gamma-Poisson), and the count model's
value is the probability that count + those events meets the target. Tokens, not characters: the
candidates ranked at a decision point have all generated the same number of tokens, so they differ only
by their counts (a longer prefix is not worth more for being longer). The reward sees texts: it counts
their tokens with the generator's tokenizer when it has one, else by the generator's characters per
token (from the calibration samples).

**Shrinkage.** The count model is sharper than the calibration data bear on some types; the value is
``weight * P + (1 - weight) * base``, ``base`` the fraction of the type's open prefixes that ended up
following it, ``weight`` chosen out of sample (``calibrate.fit_type``). It keeps the order within a type.

The count model's probabilities are rounded to a multiple of ``resolution`` (before the shrinkage), the
calibration error of the fit (at least 0.05): the model cannot tell apart probabilities closer than that, so candidates it cannot tell apart are
ordered by the reward's tie-break (shorter wins), as their final rewards will be, not by noise.

Instructions without a count (JSON, response language, repeating the request, quotation marks) are
worth the fraction of the calibration's open prefixes of their type that ended up following it; of those
with the same evidence (``Instruction.evidence``: the language the prefix is written in) where the prefix
carries some.

``python -m sbon.ifeval.calibrate`` fits them on the calibration split and writes them, with their
calibration error, to ``pass_rates.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from .checkers import RELATIONS, Count, Instruction


@dataclass(frozen=True)
class TypeModel:
    """The Gamma prior on one instruction type's event rate, and how far the count model is trusted."""
    rate: float = field(metadata={"help": "prior mean of events per token of response"})
    strength: float = field(metadata={"help": "weight of the prior, in tokens of response"})
    weight: float = field(default=1.0, metadata={
        "help": "trust in the count model: the value is weight * P(count model) + (1 - weight) * base"})
    base: float = field(default=0.0, metadata={
        "help": "fraction of the calibration's open prefixes of this type that ended up following it"})

    def shrink(self, p):
        """The count model's probability pulled toward the type's base rate (no value is ever 0 or 1 unless
        the model is fully trusted): the count model is sharper than the calibration data bear."""
        return self.weight * p + (1.0 - self.weight) * self.base


def meets(count, relation, n, shape, p):
    """P(count + K meets the target) for K ~ NegBin(shape, p) (numpy arrays or scalars, relation by name)."""
    from scipy.stats import nbinom  # here, not at the top: the slowest import of a command line's start

    count, n = np.asarray(count), np.asarray(n)
    gap = n - count
    relation = np.asarray(relation)
    at_least = np.where(gap <= 0, 1.0, nbinom.sf(gap - 1, shape, p))
    less_than = np.where(gap <= 0, 0.0, nbinom.cdf(gap - 1, shape, p))
    exactly = np.where(gap < 0, 0.0, nbinom.pmf(np.maximum(gap, 0), shape, p))
    return np.where(relation == RELATIONS[1], at_least, np.where(relation == RELATIONS[0], less_than, exactly))


STOP_POINTS = 8  # equally likely quantiles of the tokens a response still writes (see remaining_tokens)


def remaining_tokens(room, stop_rate: float) -> np.ndarray:
    """(STOP_POINTS, len(room)): equally likely values of the tokens a response still writes when it has
    ``room`` tokens left before the run's limit and stops at any token with probability ``stop_rate``
    (a geometric stop, capped by the room). Without it, every response would be priced as running to the limit."""
    room = np.maximum(np.atleast_1d(np.asarray(room, dtype=float)), 0.0)
    u = (np.arange(STOP_POINTS) + 0.5) / STOP_POINTS
    steps = np.floor(np.log1p(-u) / np.log1p(-stop_rate)) if 0.0 < stop_rate < 1.0 else np.full(STOP_POINTS, np.inf)
    return np.minimum(steps[:, None], room[None, :])


def counts_met(counts: Sequence[Count], index, size: int, tokens, horizon: float, model: TypeModel,
               stop_rate: float) -> np.ndarray:
    """P(every count of each of ``size`` prefixes meets its target) under the count model, before
    ``TypeModel.shrink``; ``counts[j]`` belongs to prefix ``index[j]``, written in ``tokens[j]`` tokens. Counts
    of one prefix are taken as independent given how long it goes on."""
    out = np.ones((STOP_POINTS, size))
    if not counts:
        return out.mean(0)
    tokens = np.asarray(tokens, dtype=float)
    count = np.array([c.count for c in counts])
    scale = model.strength + tokens
    p = scale / (scale + remaining_tokens(horizon - tokens, stop_rate))
    probs = meets(count, [c.relation for c in counts], [c.n for c in counts], model.strength * model.rate + count, p)
    for row, prob in zip(out, probs):
        np.multiply.at(row, np.asarray(index), prob)
    return out.mean(0)


@dataclass
class ProgressModel:
    """Values open instructions (see the module docstring); built from the calibration file."""
    types: Mapping[str, TypeModel] = field(metadata={"help": "count types: their Gamma priors"})
    open_rates: Mapping[str, float] = field(metadata={"help": "types without a count: P(followed | open)"})
    prior: float = field(metadata={"help": "value of an open instruction of a type the calibration never saw"})
    evidence_rates: Mapping[str, Mapping[str, float]] = field(default_factory=dict, metadata={
        "help": "types without a count that read evidence from the prefix (Instruction.evidence): "
                "P(followed | open, evidence) by evidence label"})
    chars_per_token: float = field(default=4.0, metadata={"help": "the generator's characters per token"})
    horizon_tokens: int = field(default=128, metadata={"help": "max new tokens of the run being scored"})
    stop_rate: float = field(default=0.0, metadata={
        "help": "the generator's chance of ending its response at any one token (from the calibration samples)"})
    resolution: float = field(default=0.05, metadata={"help": "open values are rounded to a multiple of it"})
    count_tokens: Callable[[str], int] | None = field(default=None, metadata={
        "help": "the generator's token count of a text; None: characters / chars_per_token"})

    def tokens(self, text: str) -> float:
        return self.count_tokens(text) if self.count_tokens is not None else len(text) / self.chars_per_token

    def value(self, instruction: Instruction, text: str) -> float:
        """P(the complete response follows this open instruction | the text so far)."""
        counts = instruction.progress(text)
        model = self.types.get(instruction.id)
        if counts is None or model is None:
            by_evidence = self.evidence_rates.get(instruction.id, {})
            label = instruction.evidence(text) if by_evidence else None
            if label in by_evidence:
                return float(by_evidence[label])
            return float(self.open_rates.get(instruction.id, self.prior))
        tokens = self.tokens(text)
        p = float(counts_met(counts, [0] * len(counts), 1, [tokens] * len(counts), self.horizon_tokens, model,
                             self.stop_rate)[0])
        # Rounded before the shrinkage: the count model is what cannot tell closer probabilities apart; the
        # shrinkage is a known linear map that keeps apart the levels it can.
        return float(model.shrink(round(p / self.resolution) * self.resolution if self.resolution else p))

    @classmethod
    def from_dict(cls, data: Mapping, horizon_tokens: int | None = None) -> "ProgressModel":
        return cls(types={k: TypeModel(**v) for k, v in data.get("types", {}).items()},
                   open_rates=dict(data.get("open_rates", {})), prior=float(data["prior"]),
                   evidence_rates={k: dict(v) for k, v in data.get("evidence_rates", {}).items()},
                   chars_per_token=float(data.get("chars_per_token", 4.0)),
                   resolution=float(data.get("resolution", 0.05)), stop_rate=float(data.get("stop_rate", 0.0)),
                   horizon_tokens=int(horizon_tokens or data.get("settings", {}).get("max_new_tokens", 128)))

