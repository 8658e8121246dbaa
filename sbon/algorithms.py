"""Best-of-N and Speculative Rejection, as generators of plain events.

Each algorithm yields events as it goes (so a UI can animate a run) and ends with ``Done``,
which carries the full :class:`RunResult`. :func:`run` drives one to completion.

Vocabulary: a *candidate* is one sampled response; a *round* is the stretch of decoding between
two *decision points*; at a decision point every candidate still in contention is ranked by its
*partial reward* (or its *final reward* if it has finished) and the lowest fraction alpha is
*pruned*; the rest are *survivors*.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, Union

from .engine import Batch, Generator, SamplingConfig, coupled_uniforms, sample
from .errors import SBoNError
from .results import PHASES, Candidate, DecisionPoint, PartialReward, RunResult
from .rewards import RewardModel

# Tokens each candidate generates before the first decision point when the budget is derived
# from N (or N from the budget): the budget then holds N candidates of this length. Chosen from the
# counterfactual data (benchmarks/results, minilm-pref, 10 AlpacaEval prompts, N=32): partial and final
# rewards are uncorrelated at 16 tokens (Kendall 0.02) and a single cut first keeps a normalized score
# >= 98 at 32 tokens (alpha 0.6: 98.3). `first_decision` / `--first-decision` override it.
FIRST_DECISION_TOKENS = 32
# The `auto` budget (from free memory), as in the official code: at most this many candidates, each
# with room for at least MIN_ROUND_TOKENS before the first decision, and a share of the free memory
# left to the reward model's activations at decision points and to the allocator.
MAX_AUTO_CANDIDATES = 1000
MIN_ROUND_TOKENS = 8
AUTO_BUDGET_SHARE = 0.8


# -- events -----------------------------------------------------------------------------------

@dataclass
class RoundStarted:
    round: int
    live: list[int]  # candidates still generating
    tokens: int  # tokens each live candidate has so far


@dataclass
class TokensGenerated:
    tokens: int  # tokens each of these candidates has now
    candidate_ids: list[int]
    token_ids: list[int]  # the new token of each candidate


@dataclass
class CandidateFinished:
    candidate_id: int
    tokens: int
    reason: str  # "eos" or "length"


@dataclass
class CandidatesScored:
    round: int
    candidate_ids: list[int]
    rewards: list[float]
    final: list[bool]  # True where the reward is a final reward (candidate finished)


@dataclass
class CandidatesPruned:
    decision: DecisionPoint


@dataclass
class Done:
    result: RunResult


Event = Union[RoundStarted, TokensGenerated, CandidateFinished, CandidatesScored, CandidatesPruned, Done]


# -- shared machinery ------------------------------------------------------------------------

class _Run:
    """State shared by all methods: the candidates, their random streams and phase timers."""

    def __init__(self, method: str, gen: Generator, reward: RewardModel, prompt: str, n: int,
                 max_new_tokens: int, sampling: SamplingConfig, seed: int, settings: dict,
                 prompt_ids: list[int] | None = None):
        self.prompt_ids = gen.encode_prompt(prompt) if prompt_ids is None else prompt_ids
        gen.check_length(self.prompt_ids, max_new_tokens)
        self.method, self.gen, self.reward, self.prompt = method, gen, reward, prompt
        self.max_new_tokens, self.sampling = max_new_tokens, sampling
        self.settings = dict(n=n, max_new_tokens=max_new_tokens, seed=seed, temperature=sampling.temperature,
                             top_p=sampling.top_p, top_k=sampling.top_k, **settings)
        self.candidates = [Candidate(k) for k in range(n)]
        self.uniforms = coupled_uniforms(seed, range(n), max_new_tokens)
        self.timings = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        yield
        self.gen.synchronize()
        self.timings[name] += time.perf_counter() - start

    def start(self, candidate_ids: Sequence[int], prefix=None):
        """Prefill the prompt (unless a prefix is given) and open a batch for these candidates."""
        with self.phase("prefill"):
            prefix = prefix or self.gen.prefill(self.prompt_ids)
            return prefix, self.gen.start(prefix, candidate_ids)

    def step(self, batch: Batch) -> list[Event]:
        """Sample one token for every live candidate; finished ones leave the batch."""
        with self.phase("decode"):
            ids = batch.candidate_ids
            t = self.candidates[ids[0]].tokens_generated
            tokens = sample(batch.logits, self.uniforms[ids, t], self.sampling)
            stops = self.gen.is_stop(tokens).tolist()
            new_tokens = tokens.tolist()
            events: list[Event] = [TokensGenerated(t + 1, list(ids), new_tokens)]
            going = []
            for row, (k, token, stop) in enumerate(zip(ids, new_tokens, stops)):
                cand = self.candidates[k]
                cand.token_ids.append(token)
                if stop or t + 1 >= self.max_new_tokens:
                    cand.stop_reason = "eos" if stop else "length"
                    events.append(CandidateFinished(k, t + 1, cand.stop_reason))
                else:
                    going.append(row)
            batch.keep([ids[row] for row in going])
            if going:
                self.gen.forward(batch, tokens[going])
        return events

    def score(self, candidate_ids: Sequence[int]) -> list[float]:
        with self.phase("reward"):
            texts = [self.gen.decode(self.candidates[k].token_ids) for k in candidate_ids]
            return self.reward.score(self.prompt, texts) if texts else []

    def score_finished(self, candidate_ids: Sequence[int], round: int) -> CandidatesScored:
        ids = list(candidate_ids)
        rewards = self.score(ids)
        for k, r in zip(ids, rewards):
            self.candidates[k].final_reward = r
        return CandidatesScored(round, ids, rewards, [True] * len(ids))

    def result(self, best_among: Sequence[int], decision_points: list[DecisionPoint]) -> RunResult:
        for c in self.candidates:
            c.text = self.gen.decode(c.token_ids)
        scored = [k for k in best_among if self.candidates[k].final_reward is not None]
        best = max(scored, key=lambda k: (self.candidates[k].final_reward, -k)) if scored else None
        timings = {**self.timings, "total": sum(self.timings.values())}
        return RunResult(self.method, self.prompt, self.gen.name, getattr(self.reward, "name", "reward"),
                         self.settings, len(self.prompt_ids), self.candidates, decision_points, timings, best)


def survivors_count(n: int, alpha: float) -> int:
    """round((1 - alpha) * n), rounding halves up, and never below one."""
    return max(1, math.floor((1 - alpha) * n + 0.5))


def validate(n: int | None = 1, max_new_tokens: int = 1, sampling: SamplingConfig | None = None,
             alpha: float = 0.0, tau: int | None = None, kv_budget: int | None = None,
             batch_size: int | None = None, first_decision: int | None = None, **_) -> None:
    """Check settings that need no model, so bad input fails before anything loads or runs."""
    if n is not None and n < 1:
        raise SBoNError(f"N must be at least 1, got {n}")
    if max_new_tokens < 1:
        raise SBoNError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not 0 <= alpha < 1:
        raise SBoNError(f"alpha (the rejection rate) must be in [0, 1), got {alpha}")
    if tau is not None and tau < 1:
        raise SBoNError(f"tau (the decision token) must be at least 1, got {tau}")
    if tau is not None and tau >= max_new_tokens:
        raise SBoNError(f"tau={tau} must be below max_new_tokens={max_new_tokens}, or no candidate is ever pruned")
    if kv_budget is not None and kv_budget < 1:
        raise SBoNError(f"kv_budget must be a positive number of tokens, got {kv_budget}")
    if batch_size is not None and batch_size < 1:
        raise SBoNError(f"batch_size must be at least 1, got {batch_size}")
    resolve_first_decision(first_decision, max_new_tokens)
    if sampling is not None:
        sampling.validate()


# -- Best-of-N --------------------------------------------------------------------------------

def best_of_n(gen: Generator, reward: RewardModel, prompt: str, n: int = 16, *, batch_size: int | None = None,
              max_new_tokens: int = 128, sampling: SamplingConfig | None = None, seed: int = 0) -> Iterator[Event]:
    """Generate N complete candidates (in batches of ``batch_size``, default all at once) and
    return the one with the highest final reward."""
    sampling = sampling or SamplingConfig()
    validate(n, max_new_tokens, sampling, batch_size=batch_size)
    batch_size = min(batch_size or n, n)
    run = _Run("bon", gen, reward, prompt, n, max_new_tokens, sampling, seed,
               dict(batch_size=batch_size))
    yield RoundStarted(1, list(range(n)), 0)
    prefix = None
    for first in range(0, n, batch_size):
        ids = list(range(first, min(n, first + batch_size)))
        prefix, batch = run.start(ids, prefix)  # the prompt is prefilled once for all batches
        while len(batch):
            yield from run.step(batch)
        yield run.score_finished(ids, 1)
    yield Done(run.result(range(n), []))


# -- Speculative Rejection --------------------------------------------------------------------

def _rejection_rounds(run: _Run, alpha: float, decide: Callable[[int, int, int], bool],
                      fits: Callable[[int, int], bool] = lambda live, t: True) -> Iterator[Event]:
    """The loop both variants share. ``decide(live, tokens, round)`` says when to stop and prune;
    ``fits(live, tokens)`` says whether that many live candidates may take one more token (the memory
    budget). A cut that would leave the budget still full halts the lowest-ranked live survivors until
    it fits, at least one: with alpha = 0, or round((1 - alpha) * n) = n for a small n, the loop would
    otherwise take the same decision forever."""
    cands = run.candidates
    contenders = [c.id for c in cands]
    _, batch = run.start(contenders)
    points: list[DecisionPoint] = []
    round = 1
    yield RoundStarted(round, list(contenders), 0)
    while len(batch):
        t = cands[batch.candidate_ids[0]].tokens_generated
        if not decide(len(batch), t, round):
            yield from run.step(batch)
            continue
        # Decision point: live candidates get a partial reward, newly finished ones a final reward.
        live = list(batch.candidate_ids)
        fresh = [k for k in live if not (cands[k].partial_rewards and cands[k].partial_rewards[-1].tokens == t)]
        done = [k for k in contenders if cands[k].finished and cands[k].final_reward is None]
        rewards = run.score(fresh + done)
        for k, r in zip(fresh, rewards):
            cands[k].partial_rewards.append(PartialReward(round, t, r))
        for k in set(live) - set(fresh):  # decided again at the same length: reuse the score
            cands[k].partial_rewards.append(PartialReward(round, t, cands[k].partial_rewards[-1].reward))
        for k, r in zip(done, rewards[len(fresh):]):
            cands[k].final_reward = r
        yield CandidatesScored(round, fresh + done, rewards, [False] * len(fresh) + [True] * len(done))

        with run.phase("rejection"):
            score = {k: (cands[k].final_reward if cands[k].finished else cands[k].partial_rewards[-1].reward)
                     for k in contenders}
            ranked = sorted(contenders, key=lambda k: (-score[k], k))
            kept = ranked[:survivors_count(len(ranked), alpha)]
            kept_live = [k for k in kept if not cands[k].finished]
            while kept_live and not fits(len(kept_live), t):
                kept.remove(kept_live.pop())  # the budget is still full: halt the lowest-ranked live one
            survivors = sorted(kept)
            # Halting applies to live candidates only. A finished candidate ranked below the cut leaves
            # contention (it no longer takes a slot) but its response stays eligible: the paper returns
            # the best among all completed responses.
            pruned = sorted(k for k in ranked if k not in kept and not cands[k].finished)
            retired = sorted(k for k in ranked if k not in kept and cands[k].finished)
            for k in pruned:
                cands[k].pruned_round = round
            batch.keep(survivors)
        point = DecisionPoint(round, t, contenders, survivors, pruned, score[kept[-1]], retired)
        points.append(point)
        contenders = survivors
        yield CandidatesPruned(point)
        round += 1
        if len(batch):
            yield RoundStarted(round, list(batch.candidate_ids), t)

    unscored = [k for k in contenders if cands[k].final_reward is None]
    if unscored:
        yield run.score_finished(unscored, round)
    yield Done(run.result([c.id for c in cands if c.finished and c.pruned_round is None], points))


def resolve_first_decision(first_decision: int | None, max_new_tokens: int) -> int:
    """The first decision point in tokens: the given one (checked), else the default."""
    if first_decision is None:
        return max(1, min(FIRST_DECISION_TOKENS, max_new_tokens // 2))
    if first_decision < 1:
        raise SBoNError(f"first_decision must be at least 1 token, got {first_decision}")
    if first_decision >= max_new_tokens:
        raise SBoNError(f"first_decision={first_decision} must be below max_new_tokens={max_new_tokens}, "
                        "or no candidate is ever pruned")
    return first_decision


def plan_budget(gen: Generator, prompt_tokens: int, n: int | None, kv_budget: int | None,
                max_new_tokens: int, first_decision: int | None = None) -> tuple[int, int]:
    """Resolve (N, KV budget in tokens) for the memory-budget variant.

    The budget counts cached tokens over all live candidates: each holds prompt + generated tokens.
    Given N, the default budget lets N candidates reach ``first_decision`` tokens; given the budget,
    N is as many candidates as reach ``first_decision`` in it; given neither (``auto``), the budget is
    AUTO_BUDGET_SHARE of the device's free memory and N as many candidates as reach ``first_decision``
    in it, at most MAX_AUTO_CANDIDATES. Without ``first_decision``: FIRST_DECISION_TOKENS, or half of
    ``max_new_tokens`` for shorter responses.
    """
    first_decision = resolve_first_decision(first_decision, max_new_tokens)
    per_candidate = prompt_tokens + first_decision
    one_full = prompt_tokens + max_new_tokens
    if kv_budget is None:
        if n is None:
            free_tokens = int(AUTO_BUDGET_SHARE * gen.free_memory_bytes() / gen.kv_bytes_per_token())
            n = min(MAX_AUTO_CANDIDATES, free_tokens // (prompt_tokens + max(first_decision, MIN_ROUND_TOKENS)))
            kv_budget = max(n * per_candidate, one_full) if n >= 1 else free_tokens
        else:
            kv_budget = max(n * per_candidate, one_full)
    if n is None:
        n = kv_budget // per_candidate
    if n < 1:
        raise SBoNError(f"N must be at least 1, got {n}")
    if kv_budget < one_full:
        raise SBoNError(f"a KV budget of {kv_budget} tokens cannot hold one complete candidate "
                        f"({prompt_tokens} prompt + {max_new_tokens} new tokens): raise kv_budget to at least {one_full}")
    if kv_budget < n * (prompt_tokens + 1):
        raise SBoNError(f"a KV budget of {kv_budget} tokens cannot hold {n} candidates for even one token: "
                        f"raise kv_budget to at least {n * (prompt_tokens + 1)} or lower N")
    return n, kv_budget


def speculative_rejection(gen: Generator, reward: RewardModel, prompt: str, n: int | None = 16, *,
                          alpha: float = 0.5, kv_budget: int | None = None, max_new_tokens: int = 128,
                          sampling: SamplingConfig | None = None, seed: int = 0,
                          first_decision: int | None = None) -> Iterator[Event]:
    """Speculative Rejection with memory-budget rounds (the NeurIPS version).

    Candidates generate until the next token would overflow ``kv_budget``; then all candidates
    in contention (finished ones included) are ranked by reward, round((1 - alpha) * n) are kept and
    the live ones below the cut are halted (pruned) -- more if the budget is still full, so every
    setting, alpha = 0 included, makes progress. Repeat until every survivor has finished; return the
    best completed response, also one that finished and later fell below a cut. Without a
    ``kv_budget``, the budget holds N candidates of ``first_decision`` tokens (see plan_budget).
    """
    sampling = sampling or SamplingConfig()
    validate(n, max_new_tokens, sampling, alpha=alpha, kv_budget=kv_budget, first_decision=first_decision)
    prompt_ids = gen.encode_prompt(prompt)
    prompt_tokens = len(prompt_ids)
    first_decision = resolve_first_decision(first_decision, max_new_tokens)
    n, kv_budget = plan_budget(gen, prompt_tokens, n, kv_budget, max_new_tokens, first_decision)
    run = _Run("sbon", gen, reward, prompt, n, max_new_tokens, sampling, seed,
               dict(alpha=alpha, kv_budget=kv_budget, first_decision=first_decision), prompt_ids)

    def fits(live: int, t: int) -> bool:  # the next token of `live` candidates stays within the budget
        return live * (prompt_tokens + t + 1) <= kv_budget

    yield from _rejection_rounds(run, alpha, lambda live, t, _: not fits(live, t), fits)


def speculative_bon_tau(gen: Generator, reward: RewardModel, prompt: str, n: int = 16, *, alpha: float = 0.5,
                        tau: int = 32, max_new_tokens: int = 128, sampling: SamplingConfig | None = None,
                        seed: int = 0) -> Iterator[Event]:
    """Speculative Best-of-N with a single decision token tau (the workshop version): generate
    every candidate to tau tokens, keep the best (1 - alpha) fraction, finish only those."""
    sampling = sampling or SamplingConfig()
    validate(n, max_new_tokens, sampling, alpha=alpha, tau=tau)
    run = _Run("sbon-tau", gen, reward, prompt, n, max_new_tokens, sampling, seed,
               dict(alpha=alpha, tau=tau))
    yield from _rejection_rounds(run, alpha, lambda live, t, round: round == 1 and t == tau)


METHODS = {"bon": best_of_n, "sbon": speculative_rejection, "sbon-tau": speculative_bon_tau}


def run(events: Iterator[Event], on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Drive an algorithm's events to the end and return its result."""
    for event in events:
        if on_event is not None:
            on_event(event)
        if isinstance(event, Done):
            return event.result
    raise RuntimeError("the algorithm stopped without a result")
