"""Best-of-N and Speculative Rejection on the real embedded model."""

import logging
import time
from dataclasses import replace

import pytest
import torch

from sbon import decoders
from sbon.algorithms import (CandidateFinished, DecisionTaken, Done, RunConfig, best_of_n, events, run,
                             speculative_bon_tau, speculative_rejection, survivors_count)
from sbon.analysis.counterfactual import prefix_rewards, simulate_tau
from sbon.engine import Generator
from sbon.rewards import CallableReward

PROMPT = "Give three tips for staying healthy."

N, TOKENS = 12, 40


def same_text_rate(candidates, reference) -> float:
    """Share of candidates whose tokens equal the reference candidate's with the same id, up to
    their own length. Exactly 1.0 on CPU in float32."""
    same = [c.token_ids == reference[c.id].token_ids[:c.tokens_generated] for c in candidates]
    return sum(same) / len(same)


@pytest.fixture(scope="module")
def gen(gen_fp32):
    """Float32 (tests/conftest.py): these tests hold the rewards of one text scored in two
    batches to 1e-4 (bfloat16 rounds a padded batch's rows differently)."""
    return gen_fp32


@pytest.fixture(scope="module")
def likelihood(likelihood_fp32):
    return likelihood_fp32


@pytest.fixture(scope="module")
def bon(gen, likelihood):
    return run(best_of_n(gen, likelihood, PROMPT, N, max_new_tokens=TOKENS, seed=3))


@pytest.fixture(scope="module")
def sbon(gen, likelihood):
    return run(speculative_rejection(gen, likelihood, PROMPT, N, alpha=0.5, max_new_tokens=TOKENS, seed=3,
                                     kv_budget=N * 50))


def test_bon_scores_every_candidate(bon):
    assert len(bon.candidates) == N
    assert all(c.finished and c.final_reward is not None for c in bon.candidates)
    assert bon.best.final_reward == max(bon.final_rewards)
    assert all(1 <= c.tokens_generated <= TOKENS for c in bon.candidates)
    assert len({c.text for c in bon.candidates}) > N // 2  # sampling, not copies


def test_coupling_sbon_survivors_equal_bon_candidates(bon, sbon):
    """Candidate k of SBoN is candidate k of BoN: survivors' texts are equal, pruned ones are prefixes."""
    assert sbon.decision_points, "the budget should force at least one decision point"
    survivors = [c for c in sbon.candidates if c.pruned_round is None]
    assert all(c.finished for c in survivors)
    assert same_text_rate(survivors, bon.candidates) >= 0.95
    assert same_text_rate(sbon.candidates, bon.candidates) >= 0.95
    # So SBoN never beats BoN (up to the reward's own batch-dependent rounding), and it uses fewer tokens.
    assert sbon.best.final_reward <= bon.best.final_reward + 1e-4
    assert sbon.total_tokens < bon.total_tokens


def test_bon_in_batches_matches_one_batch(gen, likelihood, bon):
    """Three batches (5, 5 and 2 rows) give each candidate the tokens one batch gave it: the first 16 of them
    (same_text_rate compares up to a candidate's own length)."""
    batched = run(best_of_n(gen, likelihood, PROMPT, N, batch_size=5, max_new_tokens=16, seed=3))
    assert same_text_rate(batched.candidates, bon.candidates) >= 0.95
    assert batched.settings["batch_size"] == 5


def test_rounds_follow_the_budget(sbon):
    """Each decision point keeps round((1 - alpha) n) contenders, ranked by reward."""
    contenders = list(range(N))
    for point in sbon.decision_points:
        assert point.contenders == contenders
        assert sorted(point.survivors + point.pruned) == contenders
        assert len(point.survivors) == survivors_count(len(contenders), 0.5)
        for k in point.pruned:
            assert sbon.candidates[k].pruned_round == point.round
            assert sbon.candidates[k].final_reward is None
        contenders = point.survivors
    # The budget of N * 50 tokens holds N candidates until prompt + t + 1 tokens no longer fit.
    first = sbon.decision_points[0]
    assert N * (sbon.prompt_tokens + first.tokens + 1) > N * 50 >= N * (sbon.prompt_tokens + first.tokens)
    assert sbon.best_id in contenders and sbon.best.finished
    assert set(sbon.timings) == {"prefill", "decode", "reward", "rejection", "total"}


def test_kv_cache_rows_are_dropped_in_place(gen, likelihood, monkeypatch):
    """After a rejection the cache's batch dimension shrinks to the survivors (no re-prefill)."""
    rows, prefills = [], []
    forward, prefill = Generator.forward, Generator.prefill
    monkeypatch.setattr(Generator, "forward", lambda self, batch, tokens: (rows.append(batch.cache_rows),
                                                                             forward(self, batch, tokens))[1])
    monkeypatch.setattr(Generator, "prefill", lambda self, ids: (prefills.append(len(ids)), prefill(self, ids))[1])
    events = list(speculative_bon_tau(gen, likelihood, PROMPT, 8, alpha=0.75, tau=6, max_new_tokens=12, seed=1))
    assert prefills == [events[-1].result.prompt_tokens]  # the prompt is prefilled once
    assert rows[0] == 8
    pruned = next(e for e in events if isinstance(e, DecisionTaken)).decision
    assert len(pruned.survivors) == 2
    after = rows[pruned.tokens:]  # forward calls after the decision point
    assert after and max(after) <= 2
    assert rows == sorted(rows, reverse=True)  # rows only ever leave


def test_finished_candidates_compete_and_leave_the_batch(gen):
    """Candidates that end early get a final reward, leave the batch, and can win a later round."""
    shortest = CallableReward(lambda prompt, responses: [-len(r) for r in responses], name="shortest")
    prompt = "Answer with one word: what colour is the sky?"
    events = list(speculative_bon_tau(gen, shortest, prompt, 8, alpha=0.5, tau=10, max_new_tokens=48, seed=0))
    result = events[-1].result
    finished = {e.candidate_id: e.tokens for e in events if isinstance(e, CandidateFinished)}
    early = [k for k, t in finished.items() if t < 48]
    assert early, "some candidates should end with EOS before the length limit"
    for k in early:
        c = result.candidates[k]
        assert c.stop_reason == "eos" and c.tokens_generated == finished[k]
        assert c.token_ids[-1] in gen.stop_ids
    # Finished candidates were ranked with their final reward at the next decision point.
    [point] = result.decision_points
    assert [k for k in point.contenders if result.candidates[k].tokens_generated < point.tokens]
    # The winner (shortest text) finished early and has the best final reward among the last survivors.
    last = result.decision_points[-1].survivors
    assert result.best.stop_reason == "eos" and result.best_id in last
    assert result.best.final_reward == max(result.candidates[k].final_reward for k in last)
    # A candidate that reached the limit stops with reason "length" at exactly max_new_tokens.
    assert all(c.tokens_generated == 48 for c in result.candidates if c.stop_reason == "length")


def test_single_decision_token(gen, likelihood, bon):
    """sbon-tau prunes once, at tau tokens, and matches the counterfactual replay of BoN."""
    tau, alpha = 8, 0.5
    result = run(speculative_bon_tau(gen, likelihood, PROMPT, N, alpha=alpha, tau=tau, max_new_tokens=TOKENS, seed=3))
    [point] = result.decision_points
    assert point.tokens == tau and len(point.survivors) == N // 2
    assert all(result.candidates[k].tokens_generated == tau for k in point.pruned)
    partial = prefix_rewards(bon, likelihood, gen.decode, [tau])[tau]
    replay = simulate_tau(bon, partial, tau, alpha)
    assert replay["token_rate"] == pytest.approx(result.total_tokens / bon.total_tokens)
    hi, lo = max(bon.final_rewards), min(bon.final_rewards)
    assert replay["normalized_score"] == pytest.approx(100 * (1 - (hi - result.best.final_reward) / (hi - lo)), abs=1e-3)


def test_prefix_rewards_in_one_pass_equal_scoring_each_prefix(gen, likelihood, bon):
    """The likelihood scores all of a candidate's prefixes from one pass over its longest one: the same
    numbers as asking it about each prefix's text, one call per tau (what any other reward gets)."""
    taus = [3, 8, 13, 20]
    fast = prefix_rewards(bon, likelihood, gen.decode, taus)
    slow = prefix_rewards(bon, CallableReward(likelihood.score, name="likelihood, one call per tau"), gen.decode, taus)
    assert any(s is not None for s in fast[20])
    for tau in taus:
        assert [s is None for s in fast[tau]] == [s is None for s in slow[tau]]
        assert [s for s in fast[tau] if s is not None] == pytest.approx([s for s in slow[tau] if s is not None], abs=1e-4)


def test_score_prefixes_rescores_a_prefix_that_tokenizes_differently(likelihood):
    """'Par' is not the first token of 'Paris' as the tokenizer splits it: that prefix gets a pass of its own."""
    prefixes = [["Par", "Paris is big"], [""], ["It is", "It is Paris."]]
    expected = [[likelihood.score(PROMPT, [text])[0] for text in group] for group in prefixes]
    got = likelihood.score_prefixes(PROMPT, prefixes)
    assert [len(g) for g in got] == [2, 1, 2] and got[1] == [0.0]
    for g, e in zip(got, expected):
        assert g == pytest.approx(e, abs=1e-4)


def test_events_end_with_done(gen, likelihood):
    events = list(best_of_n(gen, likelihood, PROMPT, 2, max_new_tokens=4, seed=0))
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1


def test_n_comes_from_the_budget_or_free_memory(gen, monkeypatch):
    """Given a budget and no N, start as many candidates as reach the first decision point in it; given
    neither, the budget is 80% of the device's free memory (here made small, so the run stays short),
    N as many as reach the first decision (at least MIN_ROUND_TOKENS) in it, at most MAX_AUTO_CANDIDATES."""
    from sbon.algorithms import AUTO_BUDGET_SHARE, MAX_AUTO_CANDIDATES, MIN_ROUND_TOKENS

    constant = CallableReward(lambda prompt, responses: [0.0] * len(responses))
    prompt_tokens = len(gen.encode_prompt(PROMPT))
    events = speculative_rejection(gen, constant, PROMPT, None, kv_budget=5 * (prompt_tokens + 16) + 3,
                                   max_new_tokens=24, first_decision=16)
    assert len(next(events).live) == 5

    # Half a token to spare, so float rounding cannot take the budget below 7 candidates. With 8 new
    # tokens the first decision would be at 4 tokens, but each candidate gets MIN_ROUND_TOKENS of room.
    per_candidate = prompt_tokens + MIN_ROUND_TOKENS
    monkeypatch.setattr(gen, "free_memory_bytes",
                        lambda: (7 * per_candidate + 0.5) * gen.kv_bytes_per_token() / AUTO_BUDGET_SHARE)
    result = run(speculative_rejection(gen, constant, PROMPT, None, max_new_tokens=8))
    assert len(result.candidates) == 7
    # Plenty of memory: N stops at the cap instead of filling it. A small cap here: the real one opens a batch of
    # MAX_AUTO_CANDIDATES rows of KV cache, gigabytes, to count its rows.
    import sbon.algorithms
    cap = 9
    assert cap < MAX_AUTO_CANDIDATES
    monkeypatch.setattr(sbon.algorithms, "MAX_AUTO_CANDIDATES", cap)
    monkeypatch.setattr(gen, "free_memory_bytes", lambda: 10**15)
    assert len(next(speculative_rejection(gen, constant, PROMPT, None, max_new_tokens=8)).live) == cap
    # ... and the budget is still the whole share of free memory (the first decision comes later), as the
    # official code lets its capped batch use all the memory.
    assert sbon.algorithms.plan_budget(gen, prompt_tokens, None, None, 8) == (
        cap, int(AUTO_BUDGET_SHARE * 10**15 / gen.kv_bytes_per_token()))


def test_alpha_zero_and_small_n_always_make_progress(gen):
    """alpha = 0 (or round((1 - alpha) n) = n) keeps every candidate, so with the budget full the cut alone would
    take the same decision forever: each decision point with the budget full halts the lowest-ranked live candidates
    until it fits."""
    length = CallableReward(lambda prompt, responses: [float(len(r)) for r in responses], name="length")
    prompt_tokens = len(gen.encode_prompt(PROMPT))
    for alpha, n in ((0.0, 4), (0.2, 2)):
        result = run(speculative_rejection(gen, length, PROMPT, n, alpha=alpha, max_new_tokens=24, seed=0,
                                           kv_budget=n * (prompt_tokens + 4)))
        assert result.decision_points and len(result.decision_points) <= n
        for point in result.decision_points:
            live = [k for k in point.contenders if not result.candidates[k].tokens_generated < point.tokens]
            live_kept = [k for k in point.survivors if k in live]
            assert point.pruned, "a decision point with the budget full must halt someone"
            assert len(live_kept) * (prompt_tokens + point.tokens + 1) <= n * (prompt_tokens + 4)
        assert result.best is not None and result.best.finished


def test_a_finished_candidate_ranked_out_later_is_still_returned(gen):
    """The paper returns the best among all completed responses. Constructed case: a candidate that
    finished before the decision point has the best final reward (5) but ranks below the live ones'
    partial rewards (10); the survivors finish with reward 1. It must be returned, not lost."""
    prompt, tau, n = "Answer with one word: what colour is the sky?", 10, 8
    bon = run(best_of_n(gen, CallableReward(lambda p, r: [0.0] * len(r)), prompt, n, max_new_tokens=24, seed=0))
    texts = [c.text for c in bon.candidates]
    early = [c.id for c in bon.candidates if c.tokens_generated <= tau]  # finished by the decision point
    live = n - len(early)
    assert early and live, "some candidates should end with EOS before the decision token, some after"
    star = texts[early[0]]

    def scripted(prompt, responses):
        return [5.0 if r == star else 1.0 if r in texts else 10.0 for r in responses]

    # alpha keeps exactly as many contenders as are still live: every finished one falls below the cut.
    result = run(speculative_bon_tau(gen, CallableReward(scripted), prompt, n, alpha=1 - live / n, tau=tau,
                                     max_new_tokens=24, seed=0))
    [point] = result.decision_points
    assert early[0] in point.retired and early[0] not in point.survivors + point.pruned
    assert result.candidates[early[0]].pruned_round is None
    assert result.best_id == early[0] and result.best.final_reward == 5.0
    # Survivors, halted and retired candidates account for every contender.
    assert sorted(point.survivors + point.pruned + point.retired) == point.contenders


def test_first_decision_point_comes_from_the_budget(gen, likelihood):
    """By default the budget holds N candidates of FIRST_DECISION_TOKENS; --first-decision overrides."""
    from sbon.algorithms import FIRST_DECISION_TOKENS

    events = speculative_rejection(gen, likelihood, PROMPT, 4, max_new_tokens=2 * FIRST_DECISION_TOKENS, seed=0)
    first = next(e.decision for e in events if isinstance(e, DecisionTaken))  # the rest of the run is not needed
    assert first.tokens == FIRST_DECISION_TOKENS
    chosen = run(speculative_rejection(gen, likelihood, PROMPT, 4, max_new_tokens=16, seed=0, first_decision=12))
    assert chosen.decision_points[0].tokens == 12 and chosen.settings["first_decision"] == 12


def test_a_process_s_first_run_does_not_count_loading_its_saved_step_as_decoding(gen, likelihood, monkeypatch):
    """A saved compiled step takes seconds to load into a process. Loaded in the first run's first decode step, it
    made that run's decode time (and the first of a comparison's two runs) seconds longer than its steps."""
    load_s = 2.0

    class Saved:  # a saved step that takes `load_s` to load, then runs the step as it is
        def fits(self, *args, like=None):
            return True

        def __call__(self, *args):
            return decoders._step(*args)

    def slow_load(self, args):
        time.sleep(load_s)
        return Saved()

    monkeypatch.setattr(decoders, "_use_our_inductor_cache", lambda: None)  # nothing is compiled here
    monkeypatch.setattr(decoders.CompiledDecoder, "load_or_build", slow_load)
    dec = decoders.CompiledDecoder(gen, compile=False, saved=True)
    monkeypatch.setattr(gen, "_compiled_decoder", dec, raising=False)
    result = run(events(gen, likelihood, PROMPT, RunConfig(method="bon", n=2, max_new_tokens=4, decode="compiled")))
    assert result.decode == "compiled" and dec.saved_step() is not None
    assert result.timings["decode"] < load_s, result.timings


def test_a_step_that_does_not_compile_decodes_eagerly_over_the_slab_in_one_logged_line(gen, likelihood, monkeypatch,
                                                                                       caplog):
    """A model whose forward Dynamo cannot trace whole (here a hook that breaks the graph, as a model's own code may):
    a run asked for the compiled step says in one line why it does not compile, goes on with the same step run
    eagerly over the slab, gives the eager run's candidates and says it decoded eagerly; the next run does not try
    again."""
    config = RunConfig(method="sbon", n=4, alpha=0.5, max_new_tokens=12, decode="eager")
    eager = run(events(gen, likelihood, PROMPT, config))
    monkeypatch.setattr(gen, "_compiled_decoder", None, raising=False)  # a decoder of its own, dropped afterwards
    hook = gen.model.register_forward_pre_hook(lambda module, args: torch._dynamo.graph_break())
    try:
        with caplog.at_level(logging.WARNING, logger="sbon.decoders"):
            first = run(events(gen, likelihood, PROMPT, replace(config, decode="compiled")))
            again = run(events(gen, likelihood, PROMPT, replace(config, method="bon", decode="compiled")))
    finally:
        hook.remove()
    assert first.decode == again.decode == "eager"
    assert [c.token_ids for c in first.candidates] == [c.token_ids for c in eager.candidates]
    best_of_n_eager = run(events(gen, likelihood, PROMPT, replace(config, method="bon")))
    assert [c.token_ids for c in again.candidates] == [c.token_ids for c in best_of_n_eager.candidates]
    failed = [r.getMessage() for r in caplog.records if "does not compile" in r.getMessage()]
    assert len(failed) == 1, failed
    assert failed[0].startswith("decode compiled: the step does not compile (Unsupported: ")
    assert failed[0].endswith("; decoding eagerly over the same slab")
