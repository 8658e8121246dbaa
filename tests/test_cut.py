"""The cut rule (sbon/cut.py): one function decides every decision point, in real runs and in replays.

- pure cases, the issue's finished-candidate-below-the-cut example among them;
- on 150 random traces (finish times, scores, N, alpha, budgets) driven through the real algorithm with a
  scripted generator, the memory-budget variant decides at the tokens the official code's rule gives
  and keeps the candidates a plain re-statement of the rule keeps; decoding in chunks of tokens
  (``decode_chunk``) changes none of it, nor any event;
- on the real model, a replay on Best-of-N's candidates equals a real ``sbon-tau`` run, a finished
  candidate below the cut included.
"""

import math
import random

import pytest
import torch

from sbon.algorithms import DecisionTaken, best_of_n, events, run, speculative_bon_tau
from sbon.analysis.counterfactual import prefix_rewards, simulate_tau
from sbon.analysis.replay import replay_tau
from sbon.analysis.signal_matrix import single_cut
from sbon.config import RunConfig
from sbon.cut import cut
from sbon.engine import SamplingConfig
from sbon.results import Candidate, RunResult
from sbon.rewards import CallableReward


def synthetic_bon(tokens: list[int], finals: list[float], stop: list[str]) -> RunResult:
    cands = []
    for k, (n, f, s) in enumerate(zip(tokens, finals, stop)):
        c = Candidate(k)
        c.token_ids, c.final_reward, c.stop_reason = [0] * n, f, s
        cands.append(c)
    best = max(range(len(cands)), key=lambda k: (finals[k], -k))
    return RunResult("bon", "p", "g", "r", {"n": len(cands)}, 1, cands, best_id=best)


# -- pure cases ----------------------------------------------------------------------------------

def test_finished_best_below_the_cut_is_retired_and_still_returned():
    """Best-of-N's best finished at 6 tokens with final reward 5; three live candidates at tau = 8 have
    partial rewards 10, 9, 8 and finals 1, 2, 0; alpha = 0.5. The real algorithm keeps two (the live
    10 and 9), retires the finished one -- its response stays eligible -- so the score is 100."""
    bon = synthetic_bon([6, 20, 20, 20], [5.0, 1.0, 2.0, 0.0], ["eos", "length", "length", "length"])
    partial = [None, 10.0, 9.0, 8.0]
    r = replay_tau(bon, partial, 8, 0.5)
    assert r.cut.kept == [1, 2] and r.cut.pruned == [3] and r.cut.retired == [0]
    assert r.best_id == 0 and r.eligible == [0, 1, 2]
    assert simulate_tau(bon, partial, 8, 0.5)["normalized_score"] == 100
    assert single_cut(bon, partial, 8, 0.5, rank_finished=True)["normalized_score"] == 100
    assert single_cut(bon, partial, 8, 0.5, rank_finished=False)["normalized_score"] == 100
    assert r.tokens == 6 + 20 + 20 + 8


def test_a_signal_off_the_reward_scale_ranks_live_candidates_only():
    c = cut({0: 5.0, 1: -0.1, 2: -0.2, 3: -0.3}, {0}, 0.5, rank_finished=False)
    assert c.ranked == [1, 2, 3] and c.kept == [0, 1, 2] and c.pruned == [3] and c.retired == []


def test_the_budget_halts_more_than_alpha_and_says_which():
    c = cut({0: 4.0, 1: 3.0, 2: 2.0, 3: 1.0}, set(), 0.0, fits=lambda live: live <= 2)
    assert c.kept == [0, 1] and c.pruned == [2, 3] and c.forced == [2, 3] and c.threshold == 1.0
    assert c.rank(3) == 4 and c.rank(9) is None


@pytest.mark.parametrize("n,alpha,expected", [(4, 0.5, 2), (5, 0.5, 3), (3, 0.5, 2), (1, 0.9, 1), (10, 0.0, 10)])
def test_survivors_round_halves_up_and_never_below_one(n, alpha, expected):
    assert len(cut({k: float(-k) for k in range(n)}, set(), alpha).kept) == expected


# -- random traces through the real algorithm --------------------------------------------------------

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


def official_rounds(P, finish_at, budget, alpha, max_new, score):
    """The official code's loop, re-stated: a round of R rows generates until R * (P + t) reaches the
    budget, whatever finishes meanwhile; then everything finished so far and every live candidate is
    ranked (live by the score of its partial text, finished by the score of its complete text), the best
    max(1, round-half-up((1 - alpha) n)) are kept, and live survivors that would not fit one more token
    are halted too (this project's progress rule). Returns [(tokens, kept live, pruned)]."""
    live, contenders, t, out = list(range(len(finish_at))), list(range(len(finish_at))), 0, []
    while live:
        end = min(budget // len(live) - P, max_new)
        live = [k for k in live if finish_at[k] > end]
        if not live or end >= max_new:
            break
        t = end
        length = {k: min(finish_at[k], t) for k in contenders}
        ranked = sorted(contenders, key=lambda k: (-score(k, length[k]), k))
        kept = ranked[:max(1, math.floor((1 - alpha) * len(ranked) + 0.5))]
        kept_live = [k for k in kept if k in live]
        while kept_live and len(kept_live) * (P + t + 1) > budget:
            kept.remove(kept_live.pop())
        out.append((t, sorted(kept_live), sorted(k for k in live if k not in kept)))
        live, contenders = kept_live, kept
    return out


def scripted_trace(trial: int, decode_chunk: int = 1):
    """A random trace (finish times, scores, N, alpha, budget) run through the real memory-budget variant with
    the scripted generator: its events, and the official rule's [(tokens, kept live, pruned)] for it."""
    rng = random.Random(trial)
    n, P, max_new = rng.randint(1, 12), rng.randint(1, 8), rng.randint(4, 40)
    finish_at = [rng.randint(2, max_new + 5) for _ in range(n)]  # > max_new: stops at the length limit
    alpha = rng.choice([0.0, 0.2, 0.5, 0.75, 0.9])
    budget = rng.randint(P + max_new, n * (P + max_new) + 5)
    budget = max(budget, n * (P + 1))
    table = {(k, t): rng.random() for k in range(n) for t in range(max_new + 6)}
    score = lambda k, t: table[(k, t)]  # noqa: E731
    reward = CallableReward(lambda prompt, rs: [score(*map(int, r.split(":"))) for r in rs], name="table")
    config = RunConfig.build(SamplingConfig(temperature=1.0, top_p=1.0, top_k=0), method="sbon", n=n, alpha=alpha,
                             kv_budget=budget, max_new_tokens=max_new, seed=trial, decode_chunk=decode_chunk)
    return list(events(ScriptedGenerator(P, finish_at), reward, "p", config)), \
        official_rounds(P, finish_at, budget, alpha, max_new, score)


def decisions(trace) -> list:
    """(tokens, kept live, pruned) of each decision point of a scripted run."""
    points = [e.decision for e in trace if isinstance(e, DecisionTaken)]
    result = trace[-1].result
    return [(p.tokens, sorted(k for k in p.survivors if not result.candidates[k].finished or
                              result.candidates[k].tokens_generated > p.tokens), p.pruned) for p in points]


@pytest.mark.parametrize("trial", range(150))
def test_decision_points_come_where_the_official_rule_puts_them(trial):
    trace, official = scripted_trace(trial)
    assert decisions(trace) == official


@pytest.mark.parametrize("decode_chunk", [3, 8])
@pytest.mark.parametrize("trial", range(40))
def test_a_chunked_decode_decides_at_the_same_tokens(trial, decode_chunk):
    """Chunks of decode steps stop before a decision point: the same decisions, and the same events, as a
    decode that checks after every token (the final result differs in its timings only)."""
    trace, official = scripted_trace(trial, decode_chunk)
    assert decisions(trace) == official
    plain, _ = scripted_trace(trial)
    assert trace[:-1] == plain[:-1]
    assert trace[-1].result.candidates == plain[-1].result.candidates


# -- a replay equals a real run, on the real model ---------------------------------------------------

def test_replay_equals_a_real_sbon_tau_run_with_a_finished_candidate_below_the_cut(gen):
    """Longer answers score higher, so candidates that stopped early rank low: at tau one is below the cut
    (retired). The replay on Best-of-N's candidates keeps the same survivors, retires the same finished
    ones, returns the same response and counts the same tokens as the real run with the same seed."""
    longest = CallableReward(lambda prompt, rs: [len(r) / 10 for r in rs], name="length")
    prompt, n, tau, alpha, tokens, seed = "Answer with one word: what colour is the sky?", 8, 10, 0.5, 24, 0
    bon = run(best_of_n(gen, longest, prompt, n, max_new_tokens=tokens, seed=seed))
    sbon = run(speculative_bon_tau(gen, longest, prompt, n, alpha=alpha, tau=tau, max_new_tokens=tokens, seed=seed))
    partial = prefix_rewards(bon, longest, gen.decode, [tau])[tau]
    replay = replay_tau(bon, partial, tau, alpha)
    [point] = sbon.decision_points
    assert replay.cut.retired, "the setting must put a finished candidate below the cut"
    assert point.retired == replay.cut.retired and point.pruned == replay.cut.pruned
    assert point.survivors == replay.cut.kept
    assert sbon.best_id == replay.best_id and sbon.best.text == bon.candidates[replay.best_id].text
    assert sbon.total_tokens == replay.tokens


def test_a_run_without_a_decision_point_says_why():
    bon = synthetic_bon([5, 7], [1.0, 2.0], ["eos", "eos"])
    assert bon.why_no_decision_point() is None  # Best-of-N takes none by design
    sbon = synthetic_bon([5, 7], [1.0, 2.0], ["eos", "eos"])
    sbon.method, sbon.settings, sbon.prompt_tokens = "sbon", {"kv_budget": 2 * (10 + 16)}, 10
    assert sbon.why_no_decision_point() == ("no decision point: the KV budget (52 tokens) holds all 2 candidates "
                                            "up to token 16, and every candidate had finished by token 7")
    sbon.method, sbon.settings = "sbon-tau", {"tau": 32}
    assert "before the decision token τ = 32" in sbon.why_no_decision_point()


def test_which_signals_rank_finished_candidates_with_live_ones():
    from sbon.signals import on_reward_scale

    assert on_reward_scale("reward", "minilm-pref")  # the reward itself
    assert not on_reward_scale("reward", "likelihood", run_reward="minilm-pref")  # a re-read with another reward
    assert on_reward_scale("value-head", "likelihood") and not on_reward_scale("value-head", "minilm-pref")
    assert not on_reward_scale("logprob", "likelihood") and not on_reward_scale("random", "likelihood")
