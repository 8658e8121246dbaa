"""The ifeval reward: prompt lookup, final and partial rewards, verdicts, data-file checks, registry."""

import json

import pytest

from sbon.errors import SBoNError
from sbon.ifeval.checkers import build
from sbon.ifeval.data import SHIPPED_FILE, is_calibration, load_prompts
from sbon.ifeval.progress import ProgressModel
from sbon.ifeval.reward import TIE_BREAK, IFEvalReward, tie_break
from sbon.ifeval.verdicts import Verdict

PROMPT = "Describe the sea in fewer than 6 words, without commas."


@pytest.fixture
def reward():
    IFEvalReward.register(PROMPT, ["punctuation:no_comma", "length_constraints:number_words"],
                          [{}, {"num_words": 6, "relation": "less than"}])
    # Constant open values (no count model) keep the arithmetic readable; tests/test_ifeval_progress.py
    # checks the calibrated progress model.
    yield IFEvalReward(progress=ProgressModel(types={}, prior=0.5, open_rates={
        "punctuation:no_comma": 0.3, "length_constraints:number_words": 0.8}))
    IFEvalReward.unregister(PROMPT)


def test_final_reward_is_the_fraction_followed_plus_a_small_tie_break(reward):
    both, one, none = reward.score(PROMPT, ["Blue and endless", "Blue, endless", "Blue, wide, deep, cold, vast, old"])
    assert both == pytest.approx(1 + tie_break("Blue and endless"))
    assert one == pytest.approx(0.5 + tie_break("Blue, endless"))
    assert none == pytest.approx(tie_break("Blue, wide, deep, cold, vast, old"))
    assert 0 < tie_break("x") <= TIE_BREAK


def test_shorter_response_wins_ties(reward):
    short, long = reward.score(PROMPT, ["Blue sea", "Blue endless sea"])
    assert short > long and short - long < TIE_BREAK


def test_partial_reward_is_the_expected_final_reward(reward):
    (open_both, violated, settled_long) = reward.score_partial(PROMPT, ["Blue", "Blue, ", "one two three four five six"])
    assert open_both == pytest.approx((0.3 + 0.8) / 2 + tie_break("Blue"))
    assert violated == pytest.approx((0 + 0.8) / 2 + tie_break("Blue, "))
    assert settled_long == pytest.approx((0.3 + 0) / 2 + tie_break("one two three four five six"))


def test_explain_gives_one_verdict_per_instruction(reward):
    partial = reward.explain(PROMPT, "Across the sea, the", final=False)
    assert [v.instruction_id for v in partial] == ["punctuation:no_comma", "length_constraints:number_words"]
    comma = partial[0]
    assert isinstance(comma, Verdict) and not comma.final
    assert (comma.status, comma.reason, comma.span, comma.value) == ("violated", "comma at ‘sea, the’", (14, 15), 0.0)
    assert comma.followed is False and partial[1].status == "open" and partial[1].followed is None
    final = reward.explain(PROMPT, "Across the sea, the", final=True)
    assert [v.status for v in final] == ["fail", "pass"] and all(v.final for v in final)


def test_empty_response_follows_nothing(reward):
    assert [v.status for v in reward.explain(PROMPT, "  ", final=True)] == ["fail", "fail"]


def test_loose_also_accepts_trimmed_variants():
    prompt = "Say bye; end with 'Bye.'"
    IFEvalReward.register(prompt, ["startend:end_checker"], [{"end_phrase": "Bye."}])
    try:
        text = "Hello. Bye.\n*Hope this helps*"
        assert IFEvalReward().explain(prompt, text)[0].status == "fail"
        loose = IFEvalReward(mode="loose").explain(prompt, text)[0]
        assert loose.status == "pass" and "without last line" in loose.reason
        comma = "Hello, friend.\nBye."
        IFEvalReward.register(prompt, ["punctuation:no_comma"], [{}])
        assert IFEvalReward().explain(prompt, comma, final=False)[0].status == "violated"
        assert IFEvalReward(mode="loose").explain(prompt, comma, final=False)[0].status == "open"
        assert IFEvalReward(mode="loose").explain(prompt, comma + "\nok", final=True)[0].status == "pass"
    finally:
        IFEvalReward.unregister(prompt)


def test_a_run_s_own_instructions_stay_in_its_copy_and_come_back_from_its_record():
    shared = IFEvalReward()
    lower = shared.with_instructions(PROMPT + " (a)", '["change_case:english_lowercase"]')
    words = shared.with_instructions(PROMPT + " (a)", [{"id": "length_constraints:number_words", "num_words": 3,
                                                         "relation": "less than"}])
    text = "blue and endless sea"
    assert [v.status for v in lower.explain(PROMPT + " (a)", text)] == ["pass"]
    assert [v.status for v in words.explain(PROMPT + " (a)", text)] == ["fail"]
    with pytest.raises(SBoNError, match="add an instruction"):  # neither copy gave the shared reward any
        shared.score(PROMPT + " (a)", [text])
    recorded = words.instructions_of(PROMPT + " (a)")
    assert recorded == [{"id": "length_constraints:number_words", "num_words": 3, "relation": "less than"}]
    reloaded = IFEvalReward().with_instructions(PROMPT + " (a)", recorded)
    assert reloaded.score(PROMPT + " (a)", [text]) == words.score(PROMPT + " (a)", [text])


def test_shipped_prompt_found_by_its_text():
    row = load_prompts()[0]
    verdicts = IFEvalReward().explain(row.prompt, "some answer", final=True)
    assert [v.instruction_id for v in verdicts] == list(row.instruction_ids)


def test_prompt_without_instructions_is_refused_in_one_line():
    with pytest.raises(SBoNError, match="add an instruction under Instructions.*or pick an example") as e:
        IFEvalReward().score("Tell me a joke.", ["ok"])
    assert "\n" not in str(e.value)
    with pytest.raises(SBoNError, match="unknown IFEval instruction"):
        IFEvalReward.register("x", ["punctuation:no_semicolon"], [{}])
    with pytest.raises(SBoNError, match="mode"):
        IFEvalReward(mode="lenient")


@pytest.mark.parametrize("typed, meant", [("no_comma", "punctuation:no_comma"),
                                           ("change_case:english_lowercas", "change_case:english_lowercase"),
                                           ("punctuation:no_semicolon", None)])
def test_an_unknown_instruction_names_the_one_meant_where_it_is_clear(typed, meant):
    with pytest.raises(SBoNError) as e:
        build(typed, {})
    assert str(e.value) == f"unknown IFEval instruction '{typed}'" + (f": did you mean '{meant}'?" if meant else "")


def test_shipped_file_has_every_type_and_both_splits():
    rows = load_prompts(SHIPPED_FILE)
    assert len(rows) == 400
    assert len({i for r in rows for i in r.instruction_ids}) == 25
    assert 0 < sum(is_calibration(r.key) for r in rows) < 400


@pytest.mark.parametrize("bad_row,message", [
    ({"key": 2, "prompt": "p", "instruction_id_list": ["punctuation:no_semicolon"], "kwargs": [{}]},
     "line 2: unknown IFEval instruction 'punctuation:no_semicolon'"),
    ({"key": 2, "prompt": "p", "instruction_id_list": ["length_constraints:number_words"],
      "kwargs": [{"num_words": "ten", "relation": "less than"}]}, "line 2: length_constraints:number_words needs 'num_words'"),
    ({"key": 2, "prompt": "p", "instruction_id_list": ["keywords:frequency"],
      "kwargs": [{"keyword": "a", "frequency": 2, "relation": "at most"}]}, "line 2: keywords:frequency: 'relation'"),
    ({"key": 2, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": []}, "line 2: instruction_id_list"),
])
def test_a_bad_data_file_is_refused_with_its_line_number(tmp_path, bad_row, message):
    good = {"key": 1, "prompt": "q", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    path = tmp_path / "ifeval.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad_row) + "\n")
    with pytest.raises(SBoNError, match=message.replace("(", r"\(")):
        load_prompts(path)


def test_registered_as_an_offline_reward_preset():
    from sbon.models import REWARDS, load_reward

    assert REWARDS["ifeval"].offline and not REWARDS["ifeval"].needs_generator
    assert isinstance(load_reward("ifeval"), IFEvalReward)


def test_reward_signal_scores_partial_texts_with_score_partial(reward):
    from sbon.signals import RewardSignal

    texts = ["Blue", "Blue, "]
    assert RewardSignal(reward).score(PROMPT, [0, 1], texts) == reward.score_partial(PROMPT, texts)


def test_the_cut_rule_prunes_on_partial_verdicts(reward):
    """Replayed through the run's own cut rule (sbon.analysis.replay): at tau the candidates with an early
    comma are pruned, the comma-free ones kept, and the answer follows the instruction."""
    from sbon.analysis.replay import replay_tau
    from sbon.results import Candidate, RunResult

    texts = ["Blue, wide sea", "Blue sea", "Grey, cold", "Calm"]
    finals = reward.score(PROMPT, texts)
    cands = []
    for k, (t, f) in enumerate(zip(texts, finals)):
        c = Candidate(k)
        c.token_ids, c.text, c.final_reward, c.stop_reason = list(range(10)), t, f, "eos"
        cands.append(c)
    bon = RunResult("bon", PROMPT, "g", "ifeval", {"n": 4}, 1, cands, best_id=max(range(4), key=lambda k: finals[k]))
    partial = reward.score_partial(PROMPT, [t[:6] for t in texts])  # "Blue, " "Blue s" "Grey, " "Calm"
    r = replay_tau(bon, partial, 5, 0.5)
    assert r.cut.pruned == [0, 2] and r.cut.kept == [1, 3]
    assert all(v.followed for v in reward.explain(PROMPT, texts[r.best_id], final=True))


def test_calibration_rates_are_smoothed_toward_the_pooled_prior():
    from sbon.ifeval.calibrate import next_prompt, smoothed_rates
    from sbon.ifeval.data import IFEvalPrompt

    rates, prior = smoothed_rates({"a": 4, "b": 12}, {"a": 0, "b": 8}, pseudo=8)
    assert prior == pytest.approx(0.5)
    assert rates["a"] == pytest.approx(4 / 12, abs=1e-4) and rates["b"] == pytest.approx(12 / 20, abs=1e-4)
    rows = [IFEvalPrompt(1, "p", ("a",), ({},)), IFEvalPrompt(3, "q", ("b", "c"), ({}, {}))]
    assert next_prompt(rows, __import__("collections").Counter({"a": 0, "b": 4, "c": 0})).key == 1
    assert next_prompt(rows, __import__("collections").Counter({"a": 4, "b": 4, "c": 0})).key == 3
