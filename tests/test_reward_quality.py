"""Pair building and accuracy of training.reward_quality on tiny hand-made rows (no data folder needed)."""

import math

import pytest

from training import reward_quality as rq
from training.pairs import Pair, is_validation


def prompts_in_fold(validation: bool, k: int) -> list[str]:
    found = [f"Instruction {i}" for i in range(200) if is_validation(f"Instruction {i}") == validation]
    return found[:k]


VAL, TRAIN = prompts_in_fold(True, 2), prompts_in_fold(False, 1)


def test_same_model_pairs_keep_only_samples_judged_apart_better_first():
    rows = [{"instruction": VAL[0], "output": text, "preference_vs_reference": pref}
            for text, pref in [("a", 1.9), ("b", 1.85), ("c", 1.2), ("c", 1.5)]]
    pairs = rq.same_model_pairs(rows)
    # a-b are 0.05 apart (a tie); the two identical "c" texts are never a pair.
    assert sorted((p.better, p.worse) for p in pairs) == [("a", "c"), ("a", "c"), ("b", "c"), ("b", "c")]
    assert {p.source for p in pairs} == {"same-model"}


def test_between_model_pairs_join_both_files_through_the_common_reference():
    gpt4 = [{"instruction": VAL[0], "output_1": "ref", "generator_1": "gpt4", "output_2": "x", "generator_2": "m1",
             "preference": 1.8}]
    more = [{"instruction": VAL[0], "generator": "m2", "output": "y", "preference_vs_reference": 1.1},
            {"instruction": VAL[0], "generator": "m3", "output": "z", "preference_vs_reference": 1.75}]
    pairs = rq.between_model_pairs(rq.model_answers(gpt4, more))
    assert sorted((p.better, p.worse) for p in pairs) == [("x", "y"), ("z", "y")]  # x-z: 0.05 apart, a tie
    ref = rq.reference_pairs(gpt4)
    assert [(p.better, p.worse) for p in ref] == [("x", "ref")]


def test_length_matched_means_word_counts_within_a_quarter():
    assert not rq.is_length_matched(Pair("s", "k", "p", "one two three four", "one two three four five six"))
    assert not rq.is_length_matched(Pair("s", "k", "p", "w " * 10, "w " * 13))  # 1.3 apart
    assert rq.is_length_matched(Pair("s", "k", "p", "w " * 10, "w " * 12))
    assert not rq.is_length_matched(Pair("s", "k", "p", "", "w " * 2))  # an empty answer counts as one word


def test_accuracy_counts_ties_half_and_clusters_the_error_by_prompt():
    one_per_prompt = [Pair("s", "k", f"p{i}", "a", "b") for i in range(4)]
    r = rq.accuracy_with_se(one_per_prompt, [1.0, -1.0, 0.0, 2.0])
    assert r["accuracy"] == pytest.approx(2.5 / 4)
    # One pair per prompt: the clustered error is the binomial one, sqrt(sum (c - acc)^2) / n.
    acc = 2.5 / 4
    assert r["se"] == pytest.approx(math.sqrt(sum((c - acc) ** 2 for c in (1, 0, 0.5, 1))) / 4, abs=1e-4)
    # Two prompts whose pairs all succeed or all fail together: a larger error than if independent.
    together = [Pair("s", "k", p, "a", "b") for p in ("x", "x", "y", "y")]
    assert rq.accuracy_with_se(together, [1, 1, -1, -1])["se"] > rq.accuracy_with_se(one_per_prompt, [1, 1, -1, -1])["se"]
    assert rq.accuracy_with_se([], [])["accuracy"] is None


def test_eval_sets_hold_out_training_prompts_and_split_by_length():
    short, long_ = "a short answer of some eight words here", "a much longer answer " * 10
    same = [Pair("same-model", "tulu-2", VAL[0], long_, short), Pair("same-model", "tulu-2", VAL[1], short, short + " x"),
            Pair("same-model", "tulu-2", TRAIN[0], short, long_)]
    hh = [Pair("hh", "human", VAL[0], "no", "yes"), Pair("hh", "human", TRAIN[0], "no", "yes")]
    sets = rq.eval_sets(rq.Data(same, [], [], hh))
    assert [p.prompt for p in sets["same-model"]] == VAL
    assert [p.prompt for p in sets["same-model, length-matched"]] == [VAL[1]]
    assert len(sets["hh (held-out)"]) == 1 and len(sets["hh (all 647)"]) == 2
    table = rq.evaluate({"length": rq.length_margins}, {"same-model": sets["same-model"]})
    assert table["same-model"]["length"]["accuracy"] == 0.5  # the longer answer wins once, loses once
    assert "same-model (n=2)" in rq.markdown(table)


def test_difference_from_length_is_paired_on_the_same_pairs():
    pairs = [Pair("s", "k", f"p{i}", "a", "b") for i in range(4)]
    d = rq.difference_with_se(pairs, [1, 1, 1, -1], [1, -1, -1, -1])
    assert d["difference"] == pytest.approx(0.5)
    assert d["se"] > 0
    assert rq.difference_with_se(pairs, [1, -1, 1, -1], [1, -1, 1, -1]) == {"difference": 0.0, "se": 0.0}


@pytest.mark.parametrize("command", ["train_reward", "reward_eval", "reward_quality"])
def test_a_training_command_without_the_preference_data_stops_with_one_line(command, tmp_path):
    """The preference data is not in the repository: a clone without ../shared (or with an empty --data) is told
    in one line what is missing, where it comes from and which option takes it."""
    import importlib

    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"training.{command}").main(["--data", str(tmp_path)])
    message = str(stop.value)
    assert "not found there" in message and "--data" in message and "\n" not in message
    assert "tatsu-lab/alpaca_eval" in message
