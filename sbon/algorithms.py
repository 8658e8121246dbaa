"""Best-of-N and Speculative Rejection, as generators of plain events.

Each algorithm yields events as it goes (so a UI can animate a run) and ends with ``Done``,
which carries the full :class:`RunResult`. :func:`run` drives one to completion.

Vocabulary: a *candidate* is one sampled response; a *round* is the stretch of decoding between
two *decision points*; at a decision point every candidate still in contention is ranked -- live
ones by a *pruning signal* (by default the reward model's *partial reward*), finished ones by their
*final reward* -- and the live ones below the cut are *pruned*; the rest are *survivors*.

Every method takes a :class:`~sbon.config.RunConfig`: :func:`events` runs any method from one, and
``best_of_n`` / ``speculative_rejection`` / ``speculative_bon_tau`` are keyword shortcuts that build it.
"""

from __future__ import annotations

import logging
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence, TypeVar, Union

import torch

from .config import FIRST_DECISION_TOKENS, RunConfig, resolve_first_decision
from .cut import Cut, cut, survivors_count
from .decoders import EagerDecoder, decoder
from .engine import Batch, Generator, SamplingConfig, coupled_uniforms, sample
from .errors import SBoNError
from .machine import machine_class, prefill_threads
from .machine_load import LoadMeter
from .results import PHASES, Candidate, DecisionPoint, PartialReward, RunResult
from .rewards import RewardModel
from .signals import PruningSignal, Step, make_signal, on_reward_scale, without_uncertainty

__all__ = ["FIRST_DECISION_TOKENS", "RunConfig", "Cut", "cut", "survivors_count", "events", "best_of_n", "speculative_rejection",
           "speculative_bon_tau", "run", "drive"]

log = logging.getLogger(__name__)

# The `auto` budget (from free memory), as in the official code: at most this many candidates, each
# with room for at least MIN_ROUND_TOKENS before the first decision, and a share of the free memory
# left to the reward model's activations at decision points and to the allocator (the share a compiled
# step's static KV slab may take too: ``fitting``).
MAX_AUTO_CANDIDATES = 1000
MIN_ROUND_TOKENS = 8
AUTO_BUDGET_SHARE = 0.8


def fitting(dec, gen: Generator, decode: str, rows: int, prompt_tokens: int, max_new_tokens: int):
    """``dec``, or where its static KV slab (every row's whole length at once) would take more than AUTO_BUDGET_SHARE
    of the free memory: with ``auto`` the eager decoder, whose cache grows with the tokens (and which a KV budget
    bounds), said in one logged line; with ``compiled`` one line saying what to change."""
    slab = getattr(dec, "slab_tokens", None)
    need = slab(rows, prompt_tokens, max_new_tokens) * gen.kv_bytes_per_token() if slab else 0
    if not need:
        return dec
    free = AUTO_BUDGET_SHARE * gen.free_memory_bytes()
    if need <= free:
        return dec
    why = (f"its static KV cache for {rows} candidates of up to {prompt_tokens + max_new_tokens} tokens takes "
           f"{need / 2**30:.1f} GiB, more than {AUTO_BUDGET_SHARE:.0%} of the free memory ({free / 2**30:.1f} GiB)")
    if decode == "compiled":
        raise SBoNError(f"decode compiled: {why}: decode eagerly, or run fewer candidates or new tokens")
    log.warning("decode %s: %s; decoding eagerly", decode, why)
    return EagerDecoder(gen)


class UndecidedFallback(UserWarning):
    """A run asked for an undecided rule its pruning signal cannot apply (no uncertainty): the paper's rule."""


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
class DecisionTaken:
    """A decision point: who was ranked, by what score, who survived and who was pruned."""
    decision: DecisionPoint


@dataclass
class Done:
    result: RunResult


Event = Union[RoundStarted, TokensGenerated, CandidateFinished, CandidatesScored, DecisionTaken, Done]


# -- shared machinery ------------------------------------------------------------------------

class _Run:
    """State shared by all methods: the candidates, their random streams, the pruning signal and
    phase timers."""

    def __init__(self, gen: Generator, reward: RewardModel, prompt: str, config: RunConfig,
                 prompt_ids: list[int] | None = None, observers: Sequence[PruningSignal] = (), **resolved):
        self.prompt_ids = gen.encode_prompt(prompt) if prompt_ids is None else prompt_ids
        gen.check_length(self.prompt_ids, config.max_new_tokens)
        self.gen, self.reward, self.prompt, self.config = gen, reward, prompt, config
        self.max_new_tokens, self.sampling = config.max_new_tokens, config.sampling
        self.settings = {**config.settings(), **resolved}  # N and the budget as they were resolved
        n = self.settings["n"]
        self.candidates = [Candidate(k) for k in range(n)]
        # (candidates, max_new_tokens) on the generator's device: each step gathers its rows' numbers there.
        self.uniforms = coupled_uniforms(config.seed, range(n), config.max_new_tokens).to(gen.device)
        widest = self.settings.get("batch_size") or n
        self.decoder = fitting(decoder(gen, config.decode), gen, config.decode, widest, len(self.prompt_ids),
                               config.max_new_tokens)
        # What it loads once per process, or captures once for runs of this shape, is not this run's decode time.
        self.decoder.ready(widest, len(self.prompt_ids), config.max_new_tokens)
        self.chunk = config.chunk_on(gen.device)
        self.forward = self.decoder.forward
        self.signal: PruningSignal | None = make_signal(config.prune_by, gen, reward) if config.spec.prunes else None
        # The undecided rule this run applies: the one asked for, or the paper's when the signal has no uncertainty
        # (said in one line); what an earlier `defer` still owes and whom it deferred; each live candidate's latest
        # half-width.
        self.undecided, self.owed, self.deferred, self.uncertainty = config.undecided, 0, set(), {}
        fallback = without_uncertainty(self.signal, config.undecided) if self.signal is not None else None
        if fallback:
            warnings.warn(fallback, UndecidedFallback, stacklevel=2)
            self.undecided = "paper"
        # Everything that watches each decode step: the pruning signal, if it does (the reward signal reads
        # only the text), and signals watched for analysis only.
        self.observers = [s for s in (self.signal, *observers)
                          if s is not None and type(s).observe is not PruningSignal.observe]
        self.timings = dict.fromkeys(PHASES, 0.0)
        # What else the machine did from here to the result: the window of the run's timers, and not what it loaded
        # or built above (a kernel's compiler is another process, so it would pass for another's load).
        self.meter = LoadMeter().start()

    @contextmanager
    def timer(self, name: str, sync: bool = True):
        """Add the time of the block to a phase; ``sync=False`` leaves queued device work to the next timer."""
        start = time.perf_counter()
        yield
        if sync:
            self.gen.synchronize()
        self.timings[name] += time.perf_counter() - start

    def start(self, candidate_ids: Sequence[int], prefix=None):
        """Prefill the prompt (unless a prefix is given) and open a batch for these candidates."""
        with self.timer("prefill"):
            if prefix is None:
                with prefill_threads(self.gen.device):
                    prefix = self.gen.prefill(self.prompt_ids)
            keep_hidden = any(s.needs_hidden for s in self.observers)
            return prefix, self.decoder.start(prefix, candidate_ids, keep_hidden, self.max_new_tokens)

    def chunk_steps(self, t: int, decides: Callable[[int], bool]) -> int:
        """How many tokens the next chunk decodes from ``t``: up to ``decode_chunk``, never past
        max_new_tokens, and never past the first length at which ``decides(length)`` holds (a decision
        point: the caller's own rule, asked at each length), so decisions come at the same lengths."""
        steps = 1
        while steps < self.chunk and t + steps < self.max_new_tokens and not decides(t + steps):
            steps += 1
        return steps

    def step(self, batch: Batch, decides: Callable[[int], bool] = lambda t: False) -> Iterator[Event]:
        """Decode the next chunk of tokens of every live candidate (see chunk_steps); finished ones then
        leave the batch. Inside a chunk the tokens stay on the device and every row is fed, also one that
        has just stopped: its extra tokens are dropped, and since rows share no mask they cannot change
        the other rows. So one device-to-host copy serves the whole chunk, and with ``decode_chunk`` 1 this
        is a plain step: the last token is fed after finished rows have left. The events, and the Steps
        the pruning signal sees (what the decode computed: no extra forward pass), come out step by step,
        exactly as without chunks; each step's Step is observed just before its events are yielded."""
        ids = list(batch.candidate_ids)
        t = self.candidates[ids[0]].tokens_generated
        with self.timer("decode"):
            tokens, logits, hidden = self._sample_chunk(batch, t, self.chunk_steps(t, decides))
            live, events = self._record(ids, t, *self._to_host(tokens))
            going = live[-1]
            batch.keep([ids[row] for row in going])  # one compaction per chunk
            if going:
                self.forward(batch, tokens[-1][going])
            hidden.append(batch.hidden)  # the last step's: rows still going only
        for i, step_events in enumerate(events):
            if self.observers:
                with self.timer("decode", sync=False):  # per step: no device sync
                    observed = _observed_step(ids, live[i], live[i + 1], tokens[i], logits[i], hidden[i],
                                              batch.keep_hidden, last=i == len(tokens) - 1)
                    for observer in self.observers:
                        observer.observe(observed)
            yield from step_events

    def _sample_chunk(self, batch: Batch, t: int, steps: int):
        """Sample ``steps`` tokens per row (each a (rows,) tensor on the device), feeding each back but the
        last; with the logits each was sampled from and the hidden states of feeding it (for observers)."""
        uniforms = self.uniforms[batch.row_ids, t:t + steps]  # gathered on the device
        tokens, logits, hidden = [], [], []
        for i in range(steps):
            if i:
                self.forward(batch, tokens[-1])
                hidden.append(batch.hidden)
            tokens.append(sample(batch.logits, uniforms[:, i], self.sampling))
            if self.observers:
                logits.append(batch.logits)
        return tokens, logits, hidden

    def _to_host(self, tokens: list[torch.Tensor]) -> tuple[list[list[int]], list[list[int]]]:
        """The chunk's tokens and which are stop tokens, (rows, steps) each, in one device-to-host copy."""
        chunk = torch.stack(tokens, 1)
        host = torch.stack((chunk, self.gen.is_stop(chunk).to(chunk.dtype))).tolist()
        return host[0], host[1]

    def _record(self, ids: list[int], t: int, tokens: list[list[int]], stops: list[list[int]]):
        """Give each candidate its tokens up to and including its stop. Returns the rows live at each step
        of the chunk, then those still going after it, and each step's events."""
        live, events = [list(range(len(ids)))], []
        for i in range(len(tokens[0])):
            if not live[-1]:  # every row has stopped: the rest of the chunk is dropped
                break
            length, going = t + i + 1, []
            step_events: list[Event] = [TokensGenerated(length, [ids[r] for r in live[-1]],
                                                        [tokens[r][i] for r in live[-1]])]
            for r in live[-1]:
                cand = self.candidates[ids[r]]
                cand.token_ids.append(tokens[r][i])
                if stops[r][i] or length >= self.max_new_tokens:
                    cand.stop_reason = "eos" if stops[r][i] else "length"
                    step_events.append(CandidateFinished(ids[r], length, cand.stop_reason))
                else:
                    going.append(r)
            live.append(going)
            events.append(step_events)
        return live, events

    def texts(self, candidate_ids: Sequence[int]) -> list[str]:
        return [self.gen.decode(self.candidates[k].token_ids) for k in candidate_ids]

    def score(self, candidate_ids: Sequence[int]) -> list[float]:
        """Final rewards: the reward model on these candidates' (complete) responses."""
        with self.timer("reward"):
            texts = self.texts(candidate_ids)
            return self.reward.score(self.prompt, texts) if texts else []

    def signal_scores(self, candidate_ids: Sequence[int]) -> list[float]:
        """The pruning signal's scores of these live candidates (and their half-widths, kept in ``uncertainty``
        when the signal knows them)."""
        with self.timer("reward"):
            ids = list(candidate_ids)
            texts = self.texts(ids) if self.signal.needs_text else None
            if ids and self.signal.knows_uncertainty:
                self.uncertainty.update(zip(ids, self.signal.uncertainty(self.prompt, ids, texts)))
            return self.signal.score(self.prompt, ids, texts) if ids else []

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
        judged_by = getattr(self.reward, "instructions_of", None)  # a reward that judges by instructions
        device = getattr(self.gen, "device", "cpu")
        return RunResult(self.config.method, self.prompt, self.gen.name, getattr(self.reward, "name", "reward"),
                         self.settings, len(self.prompt_ids), self.candidates, decision_points, timings, best,
                         instructions=judged_by(self.prompt) if judged_by else [],
                         weights=getattr(self.gen, "weights", None), decode=self.decoder.name,
                         machine=machine_class(device),
                         threads=torch.get_num_threads() if torch.device(device).type == "cpu" else None,
                         load=self.meter.stop())


def _observed_step(ids: list[int], rows: list[int], going: list[int], tokens: torch.Tensor, logits: torch.Tensor,
                   hidden: torch.Tensor | None, keep_hidden: bool, last: bool) -> Step:
    """One step of a chunk (whose rows are the candidates ``ids``) as an unchunked decode shows it to a
    signal: the ``rows`` live at that step, and the hidden states of those ``going`` on after it (of every
    row of the chunk, or of ``going`` only for its ``last`` step, fed after finished rows left)."""
    def pick(x: torch.Tensor, r: list[int]) -> torch.Tensor:
        return x if len(r) == len(x) else x[r]
    if hidden is not None and going:
        hidden = hidden if last else pick(hidden, going)
    return Step([ids[r] for r in rows], pick(tokens, rows), pick(logits, rows), hidden if going else None,
                [ids[r] for r in going] if keep_hidden and going else None)


# -- Best-of-N --------------------------------------------------------------------------------

def _best_of_n(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig,
               observers: Sequence[PruningSignal] = ()) -> Iterator[Event]:
    """Generate N complete candidates (in batches of ``batch_size``, default all at once) and
    return the one with the highest final reward."""
    n = config.n
    batch_size = min(config.batch_size or n, n)
    run = _Run(gen, reward, prompt, config, observers=observers, batch_size=batch_size)
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

def _rejection_rounds(run: _Run, decide: Callable[[int, int, int], bool],
                      fits: Callable[[int, int], bool] = lambda live, t: True) -> Iterator[Event]:
    """The loop both variants share: decode until ``decide(rows, tokens, round)`` -- ``rows`` is the
    number of candidates that started the round, since a row that finished mid-round still holds its
    memory in the official code until the round ends -- then score the contenders, prune, and go on
    until every survivor has finished. ``fits(live, tokens)`` says whether that many live candidates
    may take one more token (the memory budget)."""
    cands = run.candidates
    contenders = [c.id for c in cands]
    _, batch = run.start(contenders)
    points: list[DecisionPoint] = []
    round, rows = 1, len(batch)
    yield RoundStarted(round, list(contenders), 0)
    while len(batch):
        t = cands[batch.candidate_ids[0]].tokens_generated
        if not decide(rows, t, round):
            yield from run.step(batch, lambda length: decide(rows, length, round))  # a chunk stops before one
            continue
        yield _score_decision_point(run, batch, contenders, round, t)
        point = _prune(run, batch, contenders, round, t, fits)
        points.append(point)
        contenders = point.survivors
        yield DecisionTaken(point)
        round, rows = round + 1, len(batch)
        if len(batch):
            yield RoundStarted(round, list(batch.candidate_ids), t)

    unscored = [k for k in contenders if cands[k].final_reward is None]
    if unscored:
        yield run.score_finished(unscored, round)
    completed = [c.id for c in cands if c.finished and c.pruned_round is None]
    yield Done(run.result(completed, points))


def _score_decision_point(run: _Run, batch: Batch, contenders: list[int], round: int, t: int) -> CandidatesScored:
    """Live candidates get the pruning signal's score (their partial reward), newly finished ones
    their final reward."""
    cands = run.candidates
    live = list(batch.candidate_ids)
    fresh = [k for k in live if not (cands[k].partial_rewards and cands[k].partial_rewards[-1].tokens == t)]
    done = [k for k in contenders if cands[k].finished and cands[k].final_reward is None]
    partial, final = run.signal_scores(fresh), run.score(done)
    for k, r in zip(fresh, partial):
        cands[k].partial_rewards.append(PartialReward(round, t, r))
    for k in set(live) - set(fresh):  # decided again at the same length: the score stands
        cands[k].partial_rewards.append(PartialReward(round, t, cands[k].partial_rewards[-1].reward))
    for k, r in zip(done, final):
        cands[k].final_reward = r
    return CandidatesScored(round, fresh + done, partial + final, [False] * len(fresh) + [True] * len(done))


def _prune(run: _Run, batch: Batch, contenders: list[int], round: int, t: int,
          fits: Callable[[int, int], bool]) -> DecisionPoint:
    """Take the decision point: :func:`cut` the contenders, halt the pruned ones' rows."""
    cands = run.candidates
    with run.timer("rejection"):
        final = [k for k in contenders if cands[k].finished]
        score = {k: cands[k].final_reward if cands[k].finished else cands[k].partial_rewards[-1].reward
                 for k in contenders}
        same_scale = on_reward_scale(run.config.prune_by, getattr(run.reward, "name", None))
        uncertainty = ({k: run.uncertainty[k] for k in contenders if k in run.uncertainty and k not in final}
                       if run.signal.knows_uncertainty else None)
        decision = cut(score, set(final), run.config.alpha, lambda live: fits(live, t), same_scale,
                       uncertainty=uncertainty, undecided=run.undecided, owed=run.owed, deferred=run.deferred,
                       seed=(run.config.seed, round), tie=run.signal.tie)
        run.owed, run.deferred = decision.owed, set(decision.deferred)
        for k in decision.pruned:
            cands[k].pruned_round = round
        batch.keep(decision.kept)
    return DecisionPoint(round, t, contenders, decision.kept, decision.pruned, decision.threshold,
                         retired=decision.retired, scores=[score[k] for k in contenders], final=final,
                         signal=run.config.prune_by, ranks_finished=same_scale,
                         forced=list(decision.forced), undecided=list(decision.undecided),
                         undecided_rule=run.undecided, tied=decision.tied)


def plan_budget(gen: Generator, prompt_tokens: int, n: int | None, kv_budget: int | None,
                max_new_tokens: int, first_decision: int | None = None) -> tuple[int, int]:
    """Resolve (N, KV budget in tokens) for the memory-budget variant.

    The budget counts cached tokens over all live candidates: each holds prompt + generated tokens.
    Given N, the default budget lets N candidates reach ``first_decision`` tokens; given the budget,
    N is as many candidates as reach ``first_decision`` in it; given neither (``auto``), the budget is
    all of AUTO_BUDGET_SHARE of the device's free memory and N as many candidates as reach
    ``first_decision`` in it (at least MIN_ROUND_TOKENS), at most MAX_AUTO_CANDIDATES -- when the cap
    binds, the first decision point comes later than ``first_decision``, as in the official code, which
    caps the batch and lets it use the whole memory. Without ``first_decision``: FIRST_DECISION_TOKENS,
    or half of ``max_new_tokens`` for shorter responses.
    """
    first_decision = resolve_first_decision(first_decision, max_new_tokens)
    per_candidate = prompt_tokens + first_decision
    one_full = prompt_tokens + max_new_tokens
    if kv_budget is None:
        if n is None:
            free_tokens = int(AUTO_BUDGET_SHARE * gen.free_memory_bytes() / gen.kv_bytes_per_token())
            round_one = prompt_tokens + max(first_decision, MIN_ROUND_TOKENS)
            n = min(MAX_AUTO_CANDIDATES, free_tokens // round_one)
            if n < 1:
                raise SBoNError(f"{AUTO_BUDGET_SHARE:.0%} of the device's free memory holds {free_tokens} tokens of KV "
                                f"cache, not one candidate's {round_one} (prompt and first round): free some memory, "
                                "shorten the prompt or give N")
            kv_budget = max(free_tokens, one_full)
        else:
            kv_budget = max(n * per_candidate, one_full)
    if n is None:
        n = kv_budget // per_candidate
        if n < 1:
            raise SBoNError(f"a KV budget of {kv_budget} tokens holds no candidate up to its first decision point "
                            f"({prompt_tokens} prompt + {first_decision} new tokens): raise the KV budget to at least "
                            f"{per_candidate}")
    if n < 1:
        raise SBoNError(f"N must be at least 1, got {n}")
    if kv_budget < one_full:
        raise SBoNError(f"a KV budget of {kv_budget} tokens cannot hold one complete candidate "
                        f"({prompt_tokens} prompt + {max_new_tokens} new tokens): raise the KV budget to at least {one_full}")
    if kv_budget < n * (prompt_tokens + 1):
        raise SBoNError(f"a KV budget of {kv_budget} tokens cannot hold {n} candidates for even one token: "
                        f"raise the KV budget to at least {n * (prompt_tokens + 1)} or lower N")
    return n, kv_budget


def _speculative_rejection(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig,
                           observers: Sequence[PruningSignal] = ()) -> Iterator[Event]:
    """Speculative Rejection with memory-budget rounds (the NeurIPS 2024 version).

    Candidates generate until one more token for every row the round started with would overflow the
    KV budget (the official code's rule: a row that finished mid-round holds its memory until the round
    ends); then all candidates in contention (finished ones included) are ranked, the best
    ``survivors_count(n, alpha)`` are kept (round((1 - alpha) n), halves up, at least one) and the live ones
    below the cut are halted (pruned) -- more if the budget is still full, so every setting, alpha = 0
    included, makes progress. Repeat until every survivor has finished; return the best completed
    response, also one that finished and later fell below a cut. Without a budget, it holds N
    candidates of ``first_decision`` tokens (see plan_budget).
    """
    prompt_ids = gen.encode_prompt(prompt)
    prompt_tokens = len(prompt_ids)
    first_decision = resolve_first_decision(config.first_decision, config.max_new_tokens)
    n, kv_budget = plan_budget(gen, prompt_tokens, config.n, config.kv_budget, config.max_new_tokens, first_decision)
    run = _Run(gen, reward, prompt, config, prompt_ids, observers, n=n, kv_budget=kv_budget,
               first_decision=first_decision)

    def fits(live: int, t: int) -> bool:  # the next token of `live` candidates stays within the budget
        return live * (prompt_tokens + t + 1) <= kv_budget

    # The official rule: a round ends when the rows it started with would overflow the budget with one
    # more token, whatever finished meanwhile. Finished rows leave the cache at once here (for speed),
    # but they still count until the round ends, so short answers cannot keep the budget from filling.
    yield from _rejection_rounds(run, lambda rows, t, _: not fits(rows, t), fits)


def _speculative_bon_tau(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig,
                         observers: Sequence[PruningSignal] = ()) -> Iterator[Event]:
    """Speculative Rejection with a single decision token tau (the workshop version, "Speculative
    Best-of-N"): generate every candidate to tau tokens, keep the best (1 - alpha) fraction, finish
    only those. A cut that deferred undecided candidates (``undecided="defer"``) is followed by another
    decision point tau tokens later, until nothing is owed."""
    run = _Run(gen, reward, prompt, config, observers=observers)
    yield from _rejection_rounds(run, lambda rows, t, round: t == config.tau * round and (round == 1 or run.owed > 0))


_IMPLEMENTATIONS = {"bon": _best_of_n, "sbon": _speculative_rejection, "sbon-tau": _speculative_bon_tau}


def events(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig,
           observers: Sequence[PruningSignal] = ()) -> Iterator[Event]:
    """Run ``config.method``: its events, ending with :class:`Done`. Every setting is checked
    before anything is generated. ``observers`` are signals that watch every decode step without
    pruning (to compare signals on the same candidates: query them when the events say a length
    was reached)."""
    config.validate(prompt)
    check = getattr(reward, "check_prompt", None)  # a reward that cannot judge this prompt says so now
    if check is not None:
        check(prompt)
    yield from _IMPLEMENTATIONS[config.method](gen, reward, prompt, config, observers)


def best_of_n(gen: Generator, reward: RewardModel, prompt: str, n: int = 16, *, batch_size: int | None = None,
              max_new_tokens: int = 128, sampling: SamplingConfig | None = None, seed: int = 0,
              decode: str = "auto") -> Iterator[Event]:
    """Best-of-N: N complete candidates (in batches of ``batch_size``), the best by final reward."""
    return events(gen, reward, prompt, RunConfig.build(sampling, method="bon", n=n, batch_size=batch_size,
                                               max_new_tokens=max_new_tokens, seed=seed, decode=decode))


def speculative_rejection(gen: Generator, reward: RewardModel, prompt: str, n: int | None = 16, *,
                          alpha: float = 0.5, kv_budget: int | None = None, first_decision: int | None = None,
                          max_new_tokens: int = 128, sampling: SamplingConfig | None = None, seed: int = 0,
                          prune_by: str = "reward", decode: str = "auto") -> Iterator[Event]:
    """Speculative Rejection with memory-budget rounds (see :func:`_speculative_rejection`)."""
    return events(gen, reward, prompt, RunConfig.build(sampling, method="sbon", n=n, alpha=alpha, kv_budget=kv_budget,
                                               first_decision=first_decision, max_new_tokens=max_new_tokens,
                                               seed=seed, prune_by=prune_by, decode=decode))


def speculative_bon_tau(gen: Generator, reward: RewardModel, prompt: str, n: int = 16, *, alpha: float = 0.5,
                        tau: int = 32, max_new_tokens: int = 128, sampling: SamplingConfig | None = None,
                        seed: int = 0, prune_by: str = "reward") -> Iterator[Event]:
    """Speculative Rejection with one decision token tau (see :func:`_speculative_bon_tau`)."""
    return events(gen, reward, prompt, RunConfig.build(sampling, method="sbon-tau", n=n, alpha=alpha, tau=tau,
                                               max_new_tokens=max_new_tokens, seed=seed, prune_by=prune_by))


METHODS = {"bon": best_of_n, "sbon": speculative_rejection, "sbon-tau": speculative_bon_tau}

E = TypeVar("E")


def drive(events: Iterable, until: type[E], on_event: Callable | None = None) -> E:
    """Pass through events (to ``on_event``) until one of type ``until``, and return it."""
    for event in events:
        if on_event is not None:
            on_event(event)
        if isinstance(event, until):
            return event
    raise RuntimeError(f"the run stopped without {until.__name__}")


def run(events: Iterator[Event], on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Drive an algorithm's events to the end and return its result."""
    return drive(events, Done, on_event).result
