"""The cut rule (sbon/cut.py): one function decides every decision point, in real runs and in replays.

- pure cases, the issue's finished-candidate-below-the-cut example among them;
- (the memory-budget variant against the official code's rule, on random traces, is tests/test_official_rule.py);
- on the real model, a replay on Best-of-N's candidates equals a real ``sbon-tau`` run, a finished
  candidate below the cut included.
"""

import pytest

from sbon.algorithms import best_of_n, run, speculative_bon_tau
from sbon.analysis.counterfactual import prefix_rewards, simulate_tau
from sbon.analysis.replay import replay_tau
from sbon.analysis.signal_matrix import single_cut
from sbon.cut import cut
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
