"""sbon.analysis.comparison: SBoN next to BoN on the same prompt and seed, and its saved form."""

import json

import pytest
import torch

from sbon.algorithms import Done, RoundStarted
from sbon.analysis.comparison import (Comparison, ComparisonReady, CounterfactualScored, MethodEvent, comparison_events, default_taus,
                             peak_kv_tokens, run_comparison, same_memory_batch_size)
from sbon.errors import SBoNError
from sbon.metrics import compare
from sbon.results import Candidate, RunResult
from sbon.rewards import CallableReward

from conftest import COMPARISON_PROMPT


def test_events_run_sbon_then_bon_then_the_counterfactual(comparison_events):
    kinds = [e.method if isinstance(e, MethodEvent) else type(e).__name__ for e in comparison_events]
    first_bon, ready = kinds.index("bon"), kinds.index("ComparisonReady")
    assert set(kinds[:first_bon]) == {"sbon"} and set(kinds[first_bon:ready]) == {"bon"}
    assert kinds[ready:] == ["ComparisonReady"] + ["CounterfactualScored"] * 3 + ["ComparisonDone"]
    # The runs are shown before the prefix rewards are scored: the same runs, without the partials.
    assert isinstance(comparison_events[ready], ComparisonReady)
    before, after = comparison_events[ready].comparison, comparison_events[-1].comparison
    assert before.partials == {} and sorted(after.partials) == [4, 8, 16]
    assert before.metrics == after.metrics and before.signal_scores == after.signal_scores
    assert isinstance(comparison_events[0].event, RoundStarted)
    dones = [e.event.result for e in comparison_events if isinstance(e, MethodEvent) and isinstance(e.event, Done)]
    assert [r.method for r in dones] == ["sbon", "bon"]
    assert [(e.tau, e.done, e.total) for e in comparison_events if isinstance(e, CounterfactualScored)] == \
        [(4, 1, 3), (8, 2, 3), (16, 3, 3)]


def test_the_counterfactual_asks_the_reward_once_per_decision_token_on_a_cpu_and_once_in_all_on_a_gpu():
    """A CPU shows the prefix rewards' progress token by token; on a GPU each call more is only waiting."""
    from sbon.analysis.comparison import counterfactual_chunks

    reward = CallableReward(lambda prompt, responses: [0.0] * len(responses))
    assert counterfactual_chunks([4, 8, 16], reward, torch.device("cpu")) == [[4], [8], [16]]
    assert counterfactual_chunks([4, 8, 16], reward, torch.device("cuda", 0)) == [[4, 8, 16]]


def test_pruned_candidates_get_their_final_reward_and_continuation_from_bon(comparison):
    assert len(comparison.speculative.decision_points) == 2
    pruned = [c for c in comparison.speculative.candidates if c.pruned_round is not None]
    assert pruned
    for c in pruned:
        twin = comparison.bon.candidates[c.id]
        assert twin.token_ids[:c.tokens_generated] == c.token_ids  # coupled sampling
        assert comparison.final_reward(c.id) == twin.final_reward
        assert c.text + comparison.continuation(c.id) == twin.text
    finished = [c for c in comparison.speculative.candidates if c.finished]
    assert finished
    for c in finished:
        assert comparison.final_reward(c.id) == c.final_reward and comparison.continuation(c.id) == ""
        if comparison.twin(c.id):  # one response, one final reward, whatever the batches it was scored in
            assert comparison.bon.candidates[c.id].final_reward == c.final_reward


def test_best_of_n_scores_every_response_and_keeps_the_final_reward_the_run_gave_it(gen):
    """A reward that rounds differently in a batch of another size: it adds a thousandth per response in the batch,
    as bfloat16 or int4 rounding of the generator's own likelihood does, by less. Best-of-N still asks it for every
    response, and a response Speculative Rejection finished keeps the final reward that run gave it."""
    batches: list[int] = []

    def rounding(prompt, responses):
        batches.append(len(responses))
        return [len(r) % 7 + len(r) / 100 + len(responses) / 1000 for r in responses]

    prompt_tokens = len(gen.encode_prompt(COMPARISON_PROMPT))
    comp = run_comparison(gen, CallableReward(rounding, name="rounding"), COMPARISON_PROMPT, 4, alpha=0.5,
                          kv_budget=4 * (prompt_tokens + 4), max_new_tokens=12, seed=2, taus=[])
    assert batches[-1] == 4  # Best-of-N's own scoring, all of it (no counterfactual asked for: taus=[])
    finished = [c.id for c in comp.speculative.candidates if c.finished]
    assert 0 < len(finished) < 4 and all(comp.twin(k) for k in range(4))
    for c in comp.bon.candidates:
        own = comp.speculative.candidates[c.id]
        expected = own.final_reward if own.finished else len(c.text) % 7 + len(c.text) / 100 + 4 / 1000
        assert c.final_reward == expected
    assert comp.metrics["normalized_score"] <= 100


def test_counterfactual_partials_match_the_real_decision_point(comparison):
    """At tau=8, the first decision point, the counterfactual's partial rewards are the ones SBoN cut on, to the
    bit: the replay of a real decision point decides as the run did."""
    assert list(comparison.partials) == [4, 8, 16]
    assert all(len(p) == comparison.n for p in comparison.partials.values())
    first = comparison.speculative.decision_points[0]
    assert first.tokens == 8
    for k in first.contenders:
        assert comparison.partials[8][k] == comparison.speculative.candidates[k].partial_reward_at(1)


def test_the_counterfactual_asks_the_reward_only_for_prefixes_the_run_did_not_score(gen):
    """A prefix Speculative Rejection scored at a decision point is Best-of-N's own prefix (the coupling): the
    counterfactual takes that score and asks the reward for every other prefix, each once."""
    asked: list[str] = []

    def length(prompt, responses):
        asked.extend(responses)
        return [len(r) % 7 + len(r) / 100 for r in responses]

    reward = CallableReward(length, name="length")
    prompt_tokens = len(gen.encode_prompt(COMPARISON_PROMPT))
    before_counterfactual = None
    for event in comparison_events(gen, reward, COMPARISON_PROMPT, 4, alpha=0.5, kv_budget=4 * (prompt_tokens + 4),
                                   max_new_tokens=12, seed=2, taus=[4, 6]):
        if isinstance(event, ComparisonReady):
            before_counterfactual = len(asked)
    comp = event.comparison
    point = comp.speculative.decision_points[0]
    assert point.tokens == 4 and len(point.contenders) == 4 and not point.final and 6 not in \
        [p.tokens for p in comp.speculative.decision_points]
    # at tau=4 every candidate's score is the one the run cut on; at tau=6 each live prefix was asked for once
    assert comp.partials[4] == [comp.speculative.candidates[k].partial_reward_at(1) for k in range(4)]
    assert sorted(asked[before_counterfactual:]) == sorted(
        gen.decode(c.token_ids[:6]) for c in comp.bon.candidates if c.tokens_generated > 6)


def test_metrics_are_the_library_metrics(comparison):
    assert comparison.metrics == compare(comparison.bon, comparison.speculative)
    assert comparison.metrics["sbon_tokens"] < comparison.metrics["bon_tokens"]


def test_json_round_trip_needs_no_model(comparison, tmp_path):
    path = tmp_path / "run.json"
    text = comparison.to_json(path)
    again = Comparison.load(path)
    assert again.to_dict() == json.loads(text)
    assert again.metrics == comparison.metrics
    assert list(again.partials) == [4, 8, 16]


def test_metrics_are_recomputed_on_load(comparison):
    d = comparison.to_dict()
    d["metrics"]["speedup"] = 1e9
    assert Comparison.from_dict(d).metrics["speedup"] == comparison.metrics["speedup"]


def _broken(comparison, change):
    d = json.loads(comparison.to_json())
    change(d)
    return json.dumps(d)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(format="something-else"), "expected format"),
    (lambda d: d.pop("bon"), "'bon' is missing"),
    (lambda d: d["sbon"].update(candidates="oops"), "malformed run"),
    (lambda d: d["sbon"]["candidates"].pop(), "Best-of-N candidates but 5 SBoN candidates"),
    (lambda d: d["bon"]["candidates"][0].update(final_reward="high"), "non-numeric final reward"),
    (lambda d: d["bon"]["candidates"][0].update(final_reward=None), "needs a final reward"),
    (lambda d: d["sbon"]["candidates"][0].update(token_ids=["a"]), "malformed"),
    (lambda d: d["sbon"].update(best_id=99), "IndexError"),
    (lambda d: d["sbon"].update(prompt="another prompt"), "differ in prompt or seed"),
    (lambda d: d["sbon"].update(method="bon"), "has method 'bon'"),
    (lambda d: d["partials"].update({"4": [0.1]}), "partial rewards at tau=4 have 1 entries"),
    (lambda d: d["partials"].update({"x": [0.1] * 6}), "bad partial rewards"),
    (lambda d: d["sbon"]["decision_points"][0].update(survivors=[42]), "decision point 1"),
    (lambda d: d["sbon"]["decision_points"][0].pop("cut"), "not a saved SBoN run"),
    (lambda d: d["sbon"]["decision_points"][0].update(scores=[1.0]), "decision point 1"),
])
def test_malformed_files_fail_with_one_clear_message(comparison, change, message):
    with pytest.raises(SBoNError, match=message) as info:
        Comparison.from_json(_broken(comparison, change))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("{not json", "invalid JSON"), ("[1, 2]", "no JSON object"), ("", "invalid JSON"),
    (b"\xff\xfe", "invalid JSON"), ('{"format": "sbon-comparison/1"}', "'bon' is missing"),
])
def test_files_that_are_not_runs(text, message):
    with pytest.raises(SBoNError, match=message):
        Comparison.from_json(text)


def test_missing_file(tmp_path):
    with pytest.raises(SBoNError, match="cannot read"):
        Comparison.load(tmp_path / "nope.json")


@pytest.mark.parametrize("settings, message", [
    (dict(method="bon"), "method must be one of"),
    (dict(alpha=1.0), "alpha"),
    (dict(method="sbon-tau", tau=64, max_new_tokens=64), "τ=64 .* must be below"),
    (dict(kv_budget=-1), "the KV budget"),
    (dict(n=0), "N must be at least 1"),
])
def test_bad_settings_fail_before_any_model_is_touched(settings, message):
    # gen and reward are None: a check that came after generation started would crash differently.
    with pytest.raises(SBoNError, match=message):
        next(comparison_events(None, None, "hi", **settings))


def test_default_taus():
    assert default_taus(64) == [4, 8, 16, 24, 32, 48]
    assert default_taus(64, (20, 64)) == [4, 8, 16, 20, 24, 32, 48]
    assert default_taus(1) == []
    assert all(1 <= t < 5 for t in default_taus(5))


def test_peak_memory_and_the_same_memory_batch():
    run = RunResult("sbon", "p", "g", "r", {"max_new_tokens": 5}, 10,
                    [Candidate(0, token_ids=[1, 2, 3]), Candidate(1, token_ids=[1]), Candidate(2, token_ids=[4, 5])])
    assert peak_kv_tokens(run) == 3 * 11  # step 1: three candidates of 10 + 1 tokens
    assert same_memory_batch_size(run) == 33 // 15
    run.prompt_tokens = 100
    assert same_memory_batch_size(run) == 2  # 3 * 101 // 105
    assert peak_kv_tokens(RunResult("sbon", "p", "g", "r", {}, 10, [])) == 0


def test_sbon_tau_comparison_with_best_of_n_under_the_same_memory(gen, likelihood):
    comp = run_comparison(gen, likelihood, "Name a colour.", 4, method="sbon-tau", tau=4, alpha=0.5,
                          max_new_tokens=8, seed=2, taus=[], bon_same_memory=True)
    assert comp.speculative.method == "sbon-tau" and comp.partials == {}
    assert comp.bon.settings["batch_size"] == same_memory_batch_size(comp.speculative) < 4
    for c in comp.speculative.candidates:  # batches do not change the candidates (coupled sampling)
        assert comp.bon.candidates[c.id].token_ids[:c.tokens_generated] == c.token_ids
    assert [p.tokens for p in comp.speculative.decision_points] in ([4], [])  # [] if every candidate stopped before tau
    assert Comparison.from_json(comp.to_json()).metrics == comp.metrics


def test_a_diverged_twin_has_no_continuation(comparison):
    d = comparison.to_dict()
    k = next(c.id for c in comparison.speculative.candidates if c.pruned_round is not None)
    d["bon"]["candidates"][k]["token_ids"][0] += 1  # as if bfloat16 rounding had flipped the first token
    comp = Comparison.from_dict(d)
    assert comp.diverged(k) and comp.continuation(k) == ""
    assert not comparison.diverged(k) and comparison.continuation(k)
