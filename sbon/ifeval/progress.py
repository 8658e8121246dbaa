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
instruction type, mean ``rate`` with the weight of ``strength`` tokens, updated by what the prefix
shows: c events in t tokens give the posterior Gamma(strength * rate + c, strength + t). The events
still to come in the R = horizon - t tokens left are then negative binomial (Gamma-Poisson), and the
value is the probability that count + those events meets the target. Tokens, not characters: the
candidates ranked at a decision point have all generated the same number of tokens, so they differ only
by their counts (a longer prefix is not worth more for being longer). The reward sees texts: it counts
their tokens with the generator's tokenizer when it has one, else by the generator's characters per
token (from the calibration samples). The horizon is the run's max new tokens (the calibration's unless
the reward is told). A response may stop before its horizon; ``rate`` and ``strength`` are fitted on
where open prefixes of the generator's own responses ended up, so that is priced in.

Values are rounded to a multiple of ``resolution``, the calibration error of the fit (at least 0.05):
the model cannot tell apart probabilities closer than that, so candidates it cannot tell apart are
ordered by the reward's tie-break (shorter wins), as their final rewards will be, not by noise.

Instructions without a count (JSON, response language, repeating the request, quotation marks) are
worth the fraction of the calibration's open prefixes of their type that ended up following it.

``python -m sbon.ifeval.calibrate`` fits both on the calibration split and writes them, with their
calibration error, to ``pass_rates.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.stats import nbinom

from .checkers import RELATIONS, Count, Instruction


@dataclass(frozen=True)
class TypeModel:
    """The Gamma prior on one instruction type's event rate."""
    rate: float = field(metadata={"help": "prior mean of events per token of response"})
    strength: float = field(metadata={"help": "weight of the prior, in tokens of response"})


def meets(count, relation, n, shape, p):
    """P(count + K meets the target) for K ~ NegBin(shape, p) (numpy arrays or scalars, relation by name)."""
    count, n = np.asarray(count), np.asarray(n)
    gap = n - count
    relation = np.asarray(relation)
    at_least = np.where(gap <= 0, 1.0, nbinom.sf(gap - 1, shape, p))
    less_than = np.where(gap <= 0, 0.0, nbinom.cdf(gap - 1, shape, p))
    exactly = np.where(gap < 0, 0.0, nbinom.pmf(np.maximum(gap, 0), shape, p))
    return np.where(relation == RELATIONS[1], at_least, np.where(relation == RELATIONS[0], less_than, exactly))


def count_probability(counts: Sequence[Count], tokens: float, remaining: float, model: TypeModel) -> float:
    """P(every count meets its target) under the Gamma-Poisson model, counts taken as independent."""
    if not counts:
        return 1.0
    shape = np.array([model.strength * model.rate + c.count for c in counts])
    scale = model.strength + tokens
    p = scale / (scale + max(remaining, 0.0))
    probs = meets([c.count for c in counts], [c.relation for c in counts], [c.n for c in counts], shape, p)
    return float(np.prod(probs))


@dataclass
class ProgressModel:
    """Values open instructions (see the module docstring); built from the calibration file."""
    types: Mapping[str, TypeModel] = field(metadata={"help": "count types: their Gamma priors"})
    open_rates: Mapping[str, float] = field(metadata={"help": "types without a count: P(followed | open)"})
    prior: float = field(metadata={"help": "value of an open instruction of a type the calibration never saw"})
    chars_per_token: float = field(default=4.0, metadata={"help": "the generator's characters per token"})
    horizon_tokens: int = field(default=128, metadata={"help": "max new tokens of the run being scored"})
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
            return float(self.open_rates.get(instruction.id, self.prior))
        tokens = self.tokens(text)
        p = count_probability(counts, tokens, self.horizon_tokens - tokens, model)
        return round(p / self.resolution) * self.resolution if self.resolution else p

    @classmethod
    def from_dict(cls, data: Mapping, horizon_tokens: int | None = None) -> "ProgressModel":
        return cls(types={k: TypeModel(**v) for k, v in data.get("types", {}).items()},
                   open_rates=dict(data.get("open_rates", {})), prior=float(data["prior"]),
                   chars_per_token=float(data.get("chars_per_token", 4.0)),
                   resolution=float(data.get("resolution", 0.05)),
                   horizon_tokens=int(horizon_tokens or data.get("settings", {}).get("max_new_tokens", 128)))

