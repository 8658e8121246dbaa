"""Pruning signals: what scores the live candidates at a decision point.

A signal sees what the decode step already computed -- each step's sampled tokens, the logits they
were sampled from and, if it asks, the final-layer hidden states -- through :meth:`observe`, and
returns one score per live candidate at a decision point through :meth:`score` (higher = keep).
None of this costs a forward pass: the engine hands over tensors it computed anyway.

The final choice is always made by the final reward (the reward model on complete responses);
a signal only decides which live candidates go on. To add one: a class (with its capability flags) and a line in ``SIGNALS``.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .errors import SBoNError
from .score_noise import noise_of
from .value_head import ASSETS, feature_dim, hidden_size_of

DEFAULT_HEAD = "smollm2_value_likelihood"  # the shipped prefix value head (sbon/assets)


@functools.cache
def head_config(head: str = DEFAULT_HEAD) -> dict:
    """A shipped value head's config.json (sbon/assets/<head>/): what it was trained on, read once."""
    return json.loads((ASSETS / head / "config.json").read_text())


@dataclass
class Step:
    """One decode step of the live candidates."""
    candidate_ids: list[int]  # rows of `tokens` and `logits`
    tokens: torch.Tensor  # (rows,) the token each candidate sampled
    logits: torch.Tensor  # (rows, vocab) the next-token logits it was sampled from (before temperature)
    hidden: torch.Tensor | None = None  # (len(hidden_ids), d) final-layer state after feeding the token
    hidden_ids: list[int] | None = None  # candidates that got a hidden state (those still generating)

    @functools.cached_property
    def logprobs(self) -> torch.Tensor:
        """(rows, vocab) log-probabilities at temperature 1: computed once per step for every signal that reads them."""
        return torch.log_softmax(self.logits.float(), -1)

    @functools.cached_property
    def token_logprobs(self) -> torch.Tensor:
        """(rows,) the log-probability of the token each row sampled (temperature 1)."""
        return self.logprobs.gather(-1, self.tokens.view(-1, 1)).squeeze(-1)


class PruningSignal:
    """Base class: override ``score`` (and ``observe`` if the signal needs each step)."""
    name = "signal"
    title = "signal"  # its human name, for every page and table (the name stays the option's value)
    description = ""  # one line: what a higher score means, for a tooltip or a legend
    needs_text = False  # score() receives the candidates' decoded partial responses
    needs_hidden = False  # observe() receives final-layer hidden states (the engine keeps them only then)
    one_batch = False  # scores need every candidate in one batch (they compare candidates, or follow batch rows)
    # Whose scale the scores are on, so that a finished candidate (ranked by its final reward) can be ranked
    # against live ones: True = the run's own reward's (the reward itself), a reward's name = that reward's
    # (a head distilled from it), False = none. Off the final reward's scale, finished candidates stay out of
    # the ranking (sbon.cut.cut). See on_reward_scale.
    reward_scale: bool | str = False
    tie = 0.0  # scores closer than this differ by a tie-break only (no evidence): see sbon.cut.Cut.tied

    @classmethod
    def build(cls, gen, reward) -> "PruningSignal":
        """A fresh signal for one run (signals may keep per-candidate state)."""
        return cls()

    @property
    def knows_uncertainty(self) -> bool:
        """Whether ``uncertainty`` gives half-widths (capability): without them every cut is the paper's."""
        return False

    def uncertainty(self, prompt: str, candidate_ids: Sequence[int], texts: Sequence[str] | None) -> list[float] | None:
        """Each score's half-width, in the order of ``score``: two scores closer than the sum of their half-widths
        cannot be told apart (sbon.cut). None: the signal has no uncertainty."""
        return None

    def observe(self, step: Step) -> None:
        """Called after every decode step with what that step computed."""

    def score(self, prompt: str, candidate_ids: Sequence[int], texts: Sequence[str] | None) -> list[float]:
        raise NotImplementedError


class PerTokenSignal(PruningSignal):
    """A signal built from one number per candidate and step (``per_row``), folded into its state in step order
    (``take``). Each step's numbers stay where the step computed them until a score is asked for, then come to the
    host all at once: on a GPU every read is a sync that stalls the steps queued behind it, and an observer reading
    each step would cost the decode one sync per step."""

    def __init__(self):
        self.pending: list[tuple[list[int], torch.Tensor]] = []  # (candidate ids, their numbers) per unread step

    def per_row(self, step: Step) -> torch.Tensor:
        """(rows,) this step's number of each candidate, on the step's device."""
        raise NotImplementedError

    def take(self, k: int, value: float) -> None:
        """Fold candidate k's number of its next step into the signal's state."""
        raise NotImplementedError

    def scores(self, candidate_ids: Sequence[int]) -> list[float]:
        """The scores of these candidates, from the state every observed step has been folded into."""
        raise NotImplementedError

    def observe(self, step):
        self.pending.append((step.candidate_ids, self.per_row(step)))

    def score(self, prompt, candidate_ids, texts):
        if self.pending:
            values = iter(torch.cat([v for _, v in self.pending]).tolist())
            for ids, _ in self.pending:
                for k in ids:
                    self.take(k, next(values))
            self.pending.clear()
        return self.scores(candidate_ids)


class RewardSignal(PruningSignal):
    """The paper's signal: the reward model's score of the partial response's text."""
    name = "reward"
    title = "partial reward"
    description = "the reward model's score of the partial response so far (the paper's signal)"
    needs_text = True
    reward_scale = True

    def __init__(self, reward):
        self.reward = reward
        self.tie = float(getattr(reward, "tie_term", 0.0))

    @classmethod
    def build(cls, gen, reward) -> "RewardSignal":
        return cls(reward)

    @property
    def knows_uncertainty(self) -> bool:
        # A reward that knows each partial score's uncertainty (IFEvalReward: its progress model's resolution), or
        # a preset whose score noise was measured on the calibration split (sbon.ifeval.score_noise).
        return hasattr(self.reward, "score_uncertainty") or self.noise is not None

    @property
    def noise(self) -> float | None:
        return noise_of(getattr(self.reward, "name", None))

    def uncertainty(self, prompt, candidate_ids, texts):
        if hasattr(self.reward, "score_uncertainty"):
            return self.reward.score_uncertainty(prompt, list(texts)) if texts else []
        noise = self.noise
        return None if noise is None else [noise] * len(candidate_ids)

    def score(self, prompt, candidate_ids, texts):
        # A reward that knows partial texts from complete ones (IFEvalReward) scores them with score_partial.
        score = getattr(self.reward, "score_partial", self.reward.score)
        return score(prompt, list(texts)) if texts else []


class _MeanPerToken(PerTokenSignal):
    """The mean of a per-token number over each candidate's tokens so far."""

    def __init__(self):
        super().__init__()
        self.total: dict[int, float] = {}
        self.count: dict[int, int] = {}

    def take(self, k, value):
        self.total[k] = self.total.get(k, 0.0) + value
        self.count[k] = self.count.get(k, 0) + 1

    def scores(self, candidate_ids):
        return [self.total.get(k, 0.0) / max(1, self.count.get(k, 0)) for k in candidate_ids]


class MeanLogProb(_MeanPerToken):
    """Mean log-probability the generator gave its own sampled tokens (temperature 1): reward-free."""
    name = "logprob"
    title = "mean log-probability"
    description = ("how likely the generator found its own tokens so far, on average (higher = more sure); "
                   "reward-free")

    def per_row(self, step):
        return step.token_logprobs


class LowestGroupConfidence(PerTokenSignal):
    """DeepConf's lowest group confidence (Fu et al. 2025, "Deep Think with Confidence"): reward-free.

    Token confidence C = -mean log-probability of the step's top-k tokens (k = 20, as in DeepConf):
    large when the distribution is peaked. Group confidence = mean C over a sliding window of the last
    ``window`` tokens; the score is the lowest group confidence so far (the trace's weakest stretch).
    DeepConf's window is 2048 tokens on reasoning traces of thousands of tokens; ours are 64-256
    tokens, so the window is scaled down to 16. The minimum is over full windows only: a group of one
    or two tokens would be the weakest stretch almost every time, fixing the score within the first
    few tokens. Before the first full window the score is the mean confidence so far (a warm-up, as
    DeepConf's). Cost: the last `window` confidences per candidate, no extra pass.
    """
    name = "deepconf"
    title = "confidence in its weakest stretch (DeepConf)"
    description = ("the generator's confidence over its weakest 16-token stretch so far (DeepConf, Fu et al. 2025); "
                   "reward-free")

    def __init__(self, k: int = 20, window: int = 16):
        super().__init__()
        self.k, self.window = k, window
        self.recent: dict[int, list[float]] = {}  # the last `window` token confidences
        self.lowest: dict[int, float] = {}  # lowest mean over a full window; absent before the first one

    def per_row(self, step):
        return -step.logprobs.topk(self.k, -1).values.mean(-1)

    def take(self, k, value):
        recent = self.recent.setdefault(k, [])
        recent.append(value)
        if len(recent) > self.window:
            recent.pop(0)
        if len(recent) == self.window:
            self.lowest[k] = min(self.lowest.get(k, math.inf), sum(recent) / self.window)

    def scores(self, candidate_ids):
        return [self.lowest[k] if k in self.lowest else self._warm_up(k) for k in candidate_ids]

    def _warm_up(self, k: int) -> float:
        recent = self.recent.get(k)
        return sum(recent) / len(recent) if recent else 0.0


class SelfCertainty(_MeanPerToken):
    """Self-certainty (Kang et al. 2025, "Scalable Best-of-N Selection via Self-Certainty"): the mean
    over the response's tokens of KL(uniform || p), how far each next-token distribution is from
    uniform: KL = -log V - mean_j log p_j over the vocabulary. Reward-free; temperature 1."""
    name = "self-certainty"
    title = "model certainty"
    description = ("how far the generator's next-token distributions are from uniform, on average (Kang et al. "
                   "2025); reward-free")

    def per_row(self, step):
        return -math.log(step.logprobs.shape[-1]) - step.logprobs.mean(-1)


class HiddenConsistency(PruningSignal):
    """Consistency with the other candidates in the generator's hidden states, after ST-BoN (Wang et
    al. 2025, "Sampling-Efficient Test-Time Scaling: Self-Estimating the Best-of-N Sampling in Early
    Decoding"): the candidate closest to the others is the one most likely to end well. Reward-free.

    Simplified: ST-BoN builds each sample's chain of embedding over all layers and accumulates pairwise
    consistency over a buffer window after the samples first diverge; here each candidate keeps the
    running mean of its final-layer hidden states (those the decode step computed), and its score is
    the mean cosine similarity of that mean to the other live candidates' means.
    """
    name = "consistency"
    title = "hidden-state consistency"
    description = ("how close the candidate's hidden states are to the other candidates' (after ST-BoN, Wang et al. "
                   "2025); reward-free")
    needs_hidden = True
    one_batch = True

    def __init__(self):
        self.total: torch.Tensor | None = None  # (candidates, d): sum of each candidate's states, by id
        self.count: torch.Tensor | None = None
        self.ids: list[int] = []  # the rows of the last step's hidden states, and those ids on its device
        self.index: torch.Tensor | None = None

    def observe(self, step):
        if step.hidden is None:
            return
        if step.hidden_ids != self.ids:  # copied to the device only when the batch's rows change: a copy waits there
            self.ids = list(step.hidden_ids)
            self.index = torch.tensor(self.ids, device=step.hidden.device)
        ids, need = self.index, max(self.ids) + 1
        if self.total is None or need > len(self.total):  # room for every candidate id seen so far
            total = step.hidden.new_zeros(need, step.hidden.shape[-1], dtype=torch.float32)
            count = total.new_zeros(need)
            if self.total is not None:
                total[:len(self.total)], count[:len(self.count)] = self.total, self.count
            self.total, self.count = total, count
        self.total.index_add_(0, ids, step.hidden.float())  # one op per step, whatever the batch
        self.count[ids] += 1

    def score(self, prompt, candidate_ids, texts):
        ids = list(candidate_ids)
        if len(ids) < 2:
            return [0.0] * len(ids)
        index = torch.tensor(ids, device=self.total.device)
        means = self.total[index] / self.count[index].unsqueeze(-1)
        unit = torch.nn.functional.normalize(means, dim=-1)
        similarity = unit @ unit.T
        return ((similarity.sum(-1) - similarity.diagonal()) / (len(ids) - 1)).tolist()


class ValueHeadSignal(PruningSignal):
    """A head on the generator's own final-layer states (sbon/value_head.py), distilled from a reward's
    final scores: a prediction of the complete response's reward that costs a dot product per candidate.
    The shipped head predicts the likelihood reward, so use it with ``--reward likelihood``, whose final
    rewards are on its scale. It tracks the candidates of one batch (Speculative Rejection has one)."""
    name = "value-head"
    title = "prefix value head"
    description = ("a small head on the generator's hidden states predicting the complete response's likelihood "
                   "reward; use with the likelihood reward")
    needs_hidden = True
    one_batch = True
    reward_scale = head_config()["reward"]  # distilled from it

    def __init__(self, head: str = DEFAULT_HEAD):
        from .value_head import PrefixFeatures, ValueHead

        self.head, config = ValueHead.load(head)
        self.uses_logprob = config["uses_logprob"]
        self.new_features = PrefixFeatures
        self.features, self.ids = None, []

    @classmethod
    def build(cls, gen, reward) -> "ValueHeadSignal":
        """The head for a run of ``gen``: a one-line SBoNError where it cannot read ``gen``'s hidden states."""
        problem = head_misfit(gen)
        if problem:
            raise SBoNError(f"{problem}: prune by another signal, or train a head on this generator "
                            "(python -m training.train_value_head)")
        return cls()

    def observe(self, step):
        if step.hidden is None:
            return
        if self.features is None:
            self.features = self.new_features(len(step.hidden_ids), step.hidden.shape[-1], self.uses_logprob,
                                              step.hidden.device)
        elif step.hidden_ids != self.ids:  # candidates finished or were pruned: follow the batch's rows
            row = {k: i for i, k in enumerate(self.ids)}
            self.features.keep([row[k] for k in step.hidden_ids])
        self.ids = list(step.hidden_ids)
        logprob = None
        if self.uses_logprob:  # of the token each row has just fed
            logprob = step.token_logprobs
            if step.hidden_ids != step.candidate_ids:  # some rows finished at this step: no state after it
                logprob = logprob[[step.candidate_ids.index(k) for k in step.hidden_ids]]
        self.features.update(step.hidden, logprob)

    def score(self, prompt, candidate_ids, texts):
        row = {k: i for i, k in enumerate(self.ids)}
        return self.head.score(self.features.read()[[row[k] for k in candidate_ids]]).tolist()


# name -> signal class; make_signal builds a fresh one per run with ``build(generator, reward)``.
SIGNALS: dict[str, type[PruningSignal]] = {
    "reward": RewardSignal,
    "logprob": MeanLogProb,
    "deepconf": LowestGroupConfidence,
    "self-certainty": SelfCertainty,
    "consistency": HiddenConsistency,
    "value-head": ValueHeadSignal,
}
REWARD_FREE = ("logprob", "deepconf", "self-certainty", "consistency")  # no reward model at decision points


def head_misfit(gen, head: str = DEFAULT_HEAD) -> str | None:
    """Why the shipped value head cannot read ``gen``'s hidden states, None where it can: they must be as wide as
    those it was trained on (another width fails on its shape; a generator without a model, scripted, is not
    asked)."""
    config = head_config(head)
    width = getattr(getattr(getattr(gen, "model", None), "config", None), "hidden_size", None)
    if width is None or feature_dim(width, config.get("uses_logprob", False)) == config["feature_dim"]:
        return None
    trained = hidden_size_of(config["feature_dim"], config.get("uses_logprob", False))
    return (f"the prefix value head reads the hidden states of {config['generator']} ({trained} wide), and generator "
            f"'{getattr(gen, 'name', '?')}' has {width}")


def watched_by_default(gen) -> list[str]:
    """The signals a comparison watches unless told otherwise: the reward-free ones, and the value
    head when the shipped head was trained on this generator's hidden states (its name, at their width)."""
    head_fits = head_config().get("generator") == getattr(gen, "name", None) and head_misfit(gen) is None
    return list(REWARD_FREE) + (["value-head"] if head_fits else [])


def signal_title(name: str) -> str:
    """A signal's human name (``title``); an unknown name -- a replay's baseline, say -- as it is."""
    return SIGNALS[name].title if name in SIGNALS else name


def signal_description(name: str) -> str:
    """A signal's one-line explanation, and whether it can rank a finished answer (``reward_scale``)."""
    if name not in SIGNALS:
        return ""
    cls = SIGNALS[name]
    finished = ("finished answers are ranked with the live ones by their final reward" if cls.reward_scale is True else
                f"finished answers are ranked by their final reward when the final reward is {cls.reward_scale}" if cls.reward_scale
                else "it cannot rank a finished answer: those stay in contention, unranked")
    return f"{cls.description}; {finished}"


def without_uncertainty(signal: PruningSignal, rule: str) -> str | None:
    """The one line a run says when it asked for an undecided rule its signal cannot apply (None: it can)."""
    if rule == "paper" or signal.knows_uncertainty:
        return None
    what = f"the {signal.title}" + (f" of the {getattr(signal.reward, 'name', 'reward')} reward"
                                    if isinstance(signal, RewardSignal) else "")
    return f"{what} has no uncertainty to tell undecided candidates apart: the cut keeps the paper's rule"


def check_signal(name: str) -> None:
    if name not in SIGNALS:
        raise SBoNError(f"unknown pruning signal {name!r}: use one of {', '.join(SIGNALS)}")


def on_reward_scale(name: str, final_reward: str | None, run_reward: str | None = None) -> bool:
    """Whether pruning signal ``name`` scores on the scale of the final reward named ``final_reward`` (a class
    attribute: nothing is built). The reward signal is on it when the run's reward (``run_reward``, which scored
    the partial texts; by default the same) is the final reward. Unknown names -- a replay's random baseline,
    say -- are not."""
    scale = SIGNALS[name].reward_scale if name in SIGNALS else False
    if scale is True:
        return run_reward is None or run_reward == final_reward
    return bool(scale) and scale == final_reward


def make_signal(name: str, gen, reward) -> PruningSignal:
    check_signal(name)
    return SIGNALS[name].build(gen, reward)
