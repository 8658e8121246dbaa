"""Our Speculative Rejection against the official code's, re-stated from that code and not from ours.

`official_run` below re-implements the decision logic of Zanette-Labs/SpeculativeRejection (commit b51917f; file
and line numbers cited at each step) on a scripted trace: N candidates with given finish times and a table of
scores by (candidate, length). Where this project departs from it on purpose, the departure is a named switch of
`Rule`, and docs/method.md lists it:

- ``no_uncached_token``: the official round runs ⌊B/R⌋ − cur_len tokens *plus one*: `LLM.generate` samples a
  token from the prefill's logits before its loop of `gen_len` steps (engine/models/llm.py 577-603, gen_len from
  `get_gen_len` 482-491, called at speculative_rejection.py 78-80). That last token's KV is not cached yet, so
  the official budget is exceeded by one row-token; ours ends the round when one more token would overflow.
- ``halt_to_fit``: the official clamps `gen_len` to at least 1 (speculative_rejection.py 81-82), overflowing the
  budget when the survivors do not fit; ours halts the lowest-ranked live survivors until they fit.
- ``round_half_up``: the official keeps `int(round((1 - alpha) * n))` (speculative_rejection.py 179-180),
  Python's banker's rounding (2 of 5 at alpha = 0.5); ours rounds halves up (3 of 5).
- ``at_least_one``: the official may keep none, and then stops with the partial responses in its pool
  (speculative_rejection.py 158-159, 162-164); ours keeps at least one.
- ``ties_by_id``: the official sorts `previous finished + this round's rows` stably by score
  (speculative_rejection.py 177-178; rows in the order the last cut left them, 182-188) and returns the first
  best of its pool (postprocess/gather_best_ans.py 47-51); ours breaks every tie by the lower candidate id.
- ``retired_stay_eligible``: the official pool is the last cut's survivors, the last round's rows and every
  finished trajectory that survived one cut (speculative_rejection.py 162-164, 173-176): a candidate that finished
  and fell below the very next cut is lost. Ours keeps every completed response eligible (the paper returns the
  best of all completed responses).
- ``completed_only``: when no row is left generating, the official pool still holds every row of the last round
  (speculative_rejection.py 158-163), the partial responses just pruned among them; ours returns completed
  responses only.

With every switch on, `official_run` must equal the real algorithm (`sbon.algorithms`, memory-budget variant,
driven with a scripted generator) on 150 random traces: the same decision points (tokens, live survivors,
pruned), the same returned pool and the same answer. With each switch off alone, some trace differs: each
departure matters. `plan_budget`'s `auto` N is checked the same way against speculative_rejection.py 37-55.

Not modelled (the same in both, or outside the rule): the memory arithmetic behind B (free GPU memory minus a
buffer, llm.py 486-488; ours: a share of the free memory, see `plan_budget`), the re-tokenization of the
partial texts each round (speculative_rejection.py 65), and the cut that the official takes after its last
round (line 63's loop ends after it): its pool holds that round's rows anyway (line 163), so it decides nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from sbon.algorithms import MAX_AUTO_CANDIDATES, DecisionTaken, events, plan_budget
from sbon.config import RunConfig
from sbon.engine import SamplingConfig
from sbon.rewards import CallableReward


# -- the official rule, re-stated from the official code ------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """Which of this project's departures from the official code to apply (all off: the official code)."""
    no_uncached_token: bool = False
    halt_to_fit: bool = False
    round_half_up: bool = False
    at_least_one: bool = False
    ties_by_id: bool = False
    retired_stay_eligible: bool = False
    completed_only: bool = False


OFFICIAL = Rule()
OURS = Rule(**{f.name: True for f in dataclasses.fields(Rule)})
DEPARTURES = [f.name for f in dataclasses.fields(Rule)]


@dataclass(frozen=True)
class Trajectory:
    """utils/trajectory.py: a row's text so far (here: its candidate and length), its score, whether it stopped."""
    k: int
    length: int
    score: float
    finished: bool


@dataclass
class Outcome:
    decisions: list  # [(tokens, live survivors sorted, pruned sorted)] of every cut that halts or keeps a live row
    pool: set  # {(candidate, length)}: the trajectories the run saves (speculative_rejection.py 162-164)
    best: tuple | None  # (candidate, length) returned: the pool's best score (None: an empty pool)


def official_run(P: int, finish_at: list[int], B: int, alpha: float, max_new: int,
                 score: Callable[[int, int], float], rule: Rule = OFFICIAL) -> Outcome:
    """SpeculativeRejection.generate (speculative_rejection.py 19-166) on the LLM engine path, with B the KV
    budget in row-tokens (`get_gen_len`'s `max_seq * batch_size`) and P the prompt's tokens. Candidate k emits
    its stop token as its ``finish_at[k]``-th token."""
    max_all = P + max_new  # max_all_tokens, lines 40-42 (args.max_tokens above it); the engine's max_tokens, line 45
    rows = list(range(len(finish_at)))  # current_generations (line 57), in batch order
    kept: list[Trajectory] = []  # self.trajectories
    finished: list[Trajectory] = []  # self.finished_trajectories
    current: list[Trajectory] = []
    t, decisions = 0, []
    while P + t < max_all:  # line 63: current_length < max_all_tokens
        gen_len = min(B // len(rows), max_all) - (P + t)  # get_gen_len: min(max_seq, max_tokens) - cur_len
        if not rule.halt_to_fit:
            gen_len = max(gen_len, 1)  # lines 81-82
        steps = gen_len + (0 if rule.no_uncached_token else 1)  # the prefill's sampled token, then gen_len more
        steps = min(steps, max(finish_at[k] - t for k in rows))  # the batch stops once every row stopped
        t += steps
        current = [Trajectory(k, min(finish_at[k], t), score(k, min(finish_at[k], t)), finish_at[k] <= t)
                   for k in rows]  # lines 118-154: every row of the round, scored on its text (complete or not)
        # perform_speculative_rejection, lines 168-189
        previous = [x for x in kept if x.finished]
        finished += previous
        ranked = previous + current
        if rule.ties_by_id:
            ranked.sort(key=lambda x: (-x.score, x.k))
        else:
            ranked.sort(key=lambda x: x.score, reverse=True)  # stable: ties keep the list's order
        x = (1.0 - alpha) * len(ranked)
        keep = math.floor(x + 0.5) if rule.round_half_up else int(round(x))
        if rule.at_least_one:
            keep = max(1, keep)
        kept = ranked[:keep]
        if rule.halt_to_fit:
            live = [x for x in kept if not x.finished]
            while live and len(live) * (P + t + 1) > B:
                kept.remove(live.pop())
        if rule.retired_stay_eligible:
            finished += [x for x in ranked if x.finished and x not in kept]
        rows = [x.k for x in kept if not x.finished]
        if P + t < max_all and any(not x.finished for x in current):
            decisions.append((t, sorted(rows), sorted(x.k for x in current if not x.finished and x.k not in rows)))
        if not rows:
            break  # lines 158-159
    if rule.completed_only and P + t < max_all:  # not at the length limit: a live row left was pruned
        current = [x for x in current if x.finished or x.k in rows]
    pool = kept + current + finished  # lines 162-164
    ties = [x for x in pool if x.score == max(y.score for y in pool)]
    best = None if not ties else min(ties, key=lambda x: x.k) if rule.ties_by_id else ties[0]  # gather_best_ans.py 49-50
    return Outcome(decisions, {(x.k, x.length) for x in pool}, best and (best.k, best.length))


def official_auto_batch(B: int, P: int, max_new: int, start: int = MAX_AUTO_CANDIDATES, exact: bool = False) -> int:
    """The official initial batch (speculative_rejection.py 44-55): start from min(2 × a fitted memory table's
    batch, 1000) and shrink by 10 % until the first round has at least 8 tokens (gen_len >= 8). ``exact``
    (this project's departure): the largest batch up to ``start`` whose first round has 8 tokens."""
    def gen_len(batch):
        return min(B // batch, P + max_new) - P
    if exact:
        return max(b for b in range(1, start + 1) if gen_len(b) >= 8)
    batch = start
    while gen_len(batch) < 8:
        batch = int(batch * 0.9)
    return batch


# -- the official rule's own numbers, traced by hand from its code -------------------------------------------

def flat(k, length):
    return float(-k)  # candidate 0 always best


def test_a_round_is_budget_over_rows_minus_the_length_so_far_plus_the_uncached_token():
    # B = 100, P = 5, 4 rows: gen_len = 100 // 4 - 5 = 20, plus the prefill's token: the cut after 21 tokens;
    # 2 survivors: 100 // 2 - 26 = 24 more, plus one: the next cut after 21 + 25 = 46.
    out = official_run(5, [99] * 4, 100, 0.5, 60, flat)
    assert out.decisions[:2] == [(21, [0, 1], [2, 3]), (46, [0], [1])]
    assert [t for t, *_ in official_run(5, [99] * 4, 100, 0.5, 60, flat, OURS).decisions[:2]] == [20, 45]


def test_the_official_rounds_half_to_even_and_may_keep_nobody():
    assert official_run(1, [99] * 5, 5 * 3, 0.5, 20, flat).decisions[0][1] == [0, 1]  # round(2.5) == 2
    assert official_run(1, [99] * 5, 5 * 3, 0.5, 20, flat, Rule(round_half_up=True)).decisions[0][1] == [0, 1, 2]
    stopped = official_run(1, [99], 4, 0.9, 20, flat)  # round(0.1) == 0: the run stops, its partial text returned
    assert stopped.decisions == [(4, [], [0])] and stopped.pool == {(0, 4)}


def test_the_official_loses_a_finished_candidate_below_the_next_cut():
    # candidate 0 stops at token 3 with the best final score, but scores low at the cut that follows
    score = {0: -5.0, 1: 2.0, 2: 1.0, 3: 0.0}
    out = official_run(2, [3, 99, 99, 99], 4 * 8, 0.5, 30, lambda k, n: score[k])
    assert (0, 3) not in out.pool
    assert (0, 3) in official_run(2, [3, 99, 99, 99], 4 * 8, 0.5, 30, lambda k, n: score[k],
                                  Rule(retired_stay_eligible=True)).pool


# -- the real algorithm on scripted traces --------------------------------------------------------------

class ScriptedBatch:
    def __init__(self, gen, ids):
        self.gen, self.candidate_ids, self.keep_hidden, self.hidden = gen, list(ids), False, None
        self.row_ids = torch.tensor(self.candidate_ids)
        self.logits = gen.logits_for(self.candidate_ids)

    def __len__(self):
        return len(self.candidate_ids)

    def keep(self, ids):  # as sbon.engine.Batch.keep: ids may name candidates that are not rows
        rows = [i for i, k in enumerate(self.candidate_ids) if k in set(ids)]
        self.candidate_ids, self.logits = [self.candidate_ids[i] for i in rows], self.logits[rows]
        self.row_ids = self.row_ids[rows]


class ScriptedGenerator:
    """Candidate k emits token 2 + k until its scripted length, then EOS (token 1); decode names the
    candidate and its length, so a reward can score it by a table."""
    name = "scripted"
    device = torch.device("cpu")

    def __init__(self, prompt_tokens, finish_at):
        self.prompt_tokens, self.finish_at = prompt_tokens, finish_at
        self.count = [0] * len(finish_at)
        self.vocab = 2 + len(finish_at)

    def encode_prompt(self, prompt):
        return [0] * self.prompt_tokens

    def check_length(self, ids, max_new_tokens):
        pass

    def prefill(self, ids):
        return object()

    def start(self, prefix, ids, keep_hidden=False):
        return ScriptedBatch(self, ids)

    def logits_for(self, ids):
        logits = torch.full((len(ids), self.vocab), -1e9)
        for row, k in enumerate(ids):
            logits[row, 1 if self.count[k] + 1 == self.finish_at[k] else 2 + k] = 0.0
        return logits

    def is_stop(self, tokens):
        return tokens == 1

    def forward(self, batch, tokens):
        for k in batch.candidate_ids:
            self.count[k] += 1
        batch.logits = self.logits_for(batch.candidate_ids)

    def decode(self, ids):
        return f"{ids[0] - 2}:{len(ids)}" if ids and ids[0] >= 2 else "?:0"

    def synchronize(self):
        pass


@dataclass
class Trace:
    P: int
    finish_at: list[int]
    budget: int
    alpha: float
    max_new: int
    score: Callable[[int, int], float]
    seed: int

    def official(self, rule: Rule = OFFICIAL) -> Outcome:
        return official_run(self.P, self.finish_at, self.budget, self.alpha, self.max_new, self.score, rule)

    def events(self, decode_chunk: int = 1) -> list:
        reward = CallableReward(lambda prompt, rs: [self.score(*map(int, r.split(":"))) for r in rs], name="table")
        config = RunConfig.build(SamplingConfig(temperature=1.0, top_p=1.0, top_k=0), method="sbon",
                                 n=len(self.finish_at), alpha=self.alpha, kv_budget=self.budget,
                                 max_new_tokens=self.max_new, seed=self.seed, decode_chunk=decode_chunk)
        return list(events(ScriptedGenerator(self.P, self.finish_at), reward, "p", config))


def random_trace(trial: int) -> Trace:
    """Finish times, scores, N, alpha and a budget drawn from ``trial``; one trace in three scores from three
    values only, so that ties occur."""
    rng = random.Random(trial)
    n, P, max_new = rng.randint(1, 12), rng.randint(1, 8), rng.randint(4, 40)
    finish_at = [rng.randint(2, max_new + 5) for _ in range(n)]  # > max_new: stops at the length limit
    alpha = rng.choice([0.0, 0.2, 0.5, 0.75, 0.9])
    budget = max(rng.randint(P + max_new, n * (P + max_new) + 5), n * (P + 1))
    draw = (lambda: float(rng.randint(0, 2))) if trial % 3 == 0 else rng.random
    table = {(k, t): draw() for k in range(n) for t in range(max_new + 7)}
    return Trace(P, finish_at, budget, alpha, max_new, lambda k, t: table[(k, t)], trial)


def ours(trace_events: list) -> Outcome:
    """The real run's decision points (tokens, live survivors, pruned), its eligible responses and its answer."""
    result = trace_events[-1].result
    cands = result.candidates
    decisions = [(p.tokens, sorted(k for k in p.survivors if not cands[k].finished or cands[k].tokens_generated > p.tokens),
                  p.pruned) for p in (e.decision for e in trace_events if isinstance(e, DecisionTaken))]
    pool = {(c.id, c.tokens_generated) for c in cands if c.finished and c.pruned_round is None}
    return Outcome(decisions, pool, (result.best_id, cands[result.best_id].tokens_generated))


TRIALS = range(150)


@functools.cache  # each trace runs once for every test that reads it
def plain_events(trial: int) -> list:
    return random_trace(trial).events()


def real(trial: int) -> Outcome:
    return ours(plain_events(trial))


@pytest.mark.parametrize("trial", TRIALS)
def test_the_real_algorithm_is_the_official_rule_with_our_departures(trial):
    assert real(trial) == random_trace(trial).official(OURS)


@pytest.mark.parametrize("departure", DEPARTURES)
def test_each_departure_changes_the_outcome_of_some_trace(departure):
    without = dataclasses.replace(OURS, **{departure: False})
    changed = [t for t in TRIALS if random_trace(t).official(without) != real(t)]
    assert changed, f"no trace shows what {departure} does"


def test_the_departures_applied_one_by_one_lead_from_the_official_code_to_ours():
    rule, differing = OFFICIAL, []
    for departure in DEPARTURES:
        rule = dataclasses.replace(rule, **{departure: True})
        differing.append(sum(random_trace(t).official(rule) != real(t) for t in TRIALS))
    assert differing[-1] == 0 and sum(random_trace(t).official() != real(t) for t in TRIALS) > differing[0]


@pytest.mark.parametrize("decode_chunk", [3, 8])
@pytest.mark.parametrize("trial", range(40))
def test_a_chunked_decode_decides_at_the_same_tokens(trial, decode_chunk):
    """Chunks of decode steps stop before a decision point: the same decisions, and the same events, as a
    decode that checks after every token (the final result differs in its timings only)."""
    trace = random_trace(trial)
    chunked = trace.events(decode_chunk)
    assert ours(chunked) == real(trial)
    plain = plain_events(trial)
    assert chunked[:-1] == plain[:-1]
    assert chunked[-1].result.candidates == plain[-1].result.candidates


# -- the batch `--kv-budget auto` starts with ---------------------------------------------------------------

class Memory:
    """Just what `plan_budget` asks a generator for `auto`: free memory and a token's KV size."""

    def __init__(self, free_tokens):
        self.free_tokens = free_tokens

    def free_memory_bytes(self):
        return self.free_tokens * 10

    def kv_bytes_per_token(self):
        return 8  # AUTO_BUDGET_SHARE (0.8) of free_tokens * 10 bytes, at 8 bytes a token: free_tokens tokens


@pytest.mark.parametrize("free_tokens,P,max_new", [(64_000, 30, 128), (9_000, 5, 64), (400_000, 50, 256),
                                                   (2_000, 12, 40), (150_000, 100, 512)])
def test_the_auto_batch_is_the_officials_largest_batch_with_8_first_tokens(free_tokens, P, max_new):
    """With a first decision of at most 8 tokens, `auto`'s N is the largest batch (at most 1000) whose first
    round has 8 tokens: the official's search done exactly (departure `exact`); our default first decision
    (32 tokens) asks for a longer first round, so fewer candidates."""
    n, budget = plan_budget(Memory(free_tokens), P, None, None, max_new, first_decision=8)
    assert abs(budget - free_tokens) <= 1  # the 80 % share of the free memory, in tokens
    assert n == official_auto_batch(budget, P, max_new, exact=True)
    default_n, _ = plan_budget(Memory(free_tokens), P, None, None, max_new)
    assert default_n < n or n == MAX_AUTO_CANDIDATES


def test_the_official_batch_search_in_steps_of_10_percent_can_start_smaller():
    assert official_auto_batch(20_000, 30, 128) == 477 < official_auto_batch(20_000, 30, 128, exact=True) == 526
