"""Pruning signals: what scores the live candidates at a decision point.

A signal sees what the decode step already computed -- each step's sampled tokens, the logits they
were sampled from and, if it asks, the final-layer hidden states -- through :meth:`observe`, and
returns one score per live candidate at a decision point through :meth:`score` (higher = keep).
None of this costs a forward pass: the engine hands over tensors it computed anyway.

The final choice is always made by the final reward (the reward model on complete responses);
a signal only decides which live candidates go on. To add one: a class and a line in ``SIGNALS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .errors import SBoNError


@dataclass
class Step:
    """One decode step of the live candidates."""
    candidate_ids: list[int]  # rows of `tokens` and `logits`
    tokens: torch.Tensor  # (rows,) the token each candidate sampled
    logits: torch.Tensor  # (rows, vocab) the next-token logits it was sampled from (before temperature)
    hidden: torch.Tensor | None = None  # (len(hidden_ids), d) final-layer state after feeding the token
    hidden_ids: list[int] | None = None  # candidates that got a hidden state (those still generating)


class PruningSignal:
    """Base class: override ``score`` (and ``observe`` if the signal needs each step)."""
    name = "signal"
    needs_text = False  # score() receives the candidates' decoded partial responses
    needs_hidden = False  # observe() receives final-layer hidden states (the engine keeps them only then)

    def observe(self, step: Step) -> None:
        """Called after every decode step with what that step computed."""

    def score(self, prompt: str, candidate_ids: Sequence[int], texts: Sequence[str] | None) -> list[float]:
        raise NotImplementedError


class RewardSignal(PruningSignal):
    """The paper's signal: the reward model's score of the partial response's text."""
    name = "reward"
    needs_text = True

    def __init__(self, reward):
        self.reward = reward

    def score(self, prompt, candidate_ids, texts):
        return self.reward.score(prompt, list(texts)) if texts else []


class MeanLogProb(PruningSignal):
    """Mean log-probability the generator gave its own sampled tokens (temperature 1): reward-free."""
    name = "logprob"

    def __init__(self):
        self.total: dict[int, float] = {}
        self.count: dict[int, int] = {}

    def observe(self, step):
        logprobs = torch.log_softmax(step.logits.float(), -1).gather(-1, step.tokens.view(-1, 1)).squeeze(-1)
        for k, lp in zip(step.candidate_ids, logprobs.tolist()):
            self.total[k] = self.total.get(k, 0.0) + lp
            self.count[k] = self.count.get(k, 0) + 1

    def score(self, prompt, candidate_ids, texts):
        return [self.total.get(k, 0.0) / max(1, self.count.get(k, 0)) for k in candidate_ids]


# name -> factory(generator, reward): a fresh signal per run, since signals may keep per-candidate state.
SIGNALS: dict[str, Callable[..., PruningSignal]] = {
    "reward": lambda gen, reward: RewardSignal(reward),
    "logprob": lambda gen, reward: MeanLogProb(),
}


def check_signal(name: str) -> None:
    if name not in SIGNALS:
        raise SBoNError(f"unknown pruning signal {name!r}: use one of {', '.join(SIGNALS)}")


def make_signal(name: str, gen, reward) -> PruningSignal:
    check_signal(name)
    return SIGNALS[name](gen, reward)
