"""Partial values that know progress (sbon.ifeval.progress) and instructions for any prompt
(sbon.ifeval.instructions): the value of an open instruction moves with the counts against their target
and with the room left; settled verdicts stay exact; bad instructions are refused in one line naming
the field."""

import dataclasses
import json

import pytest

from sbon.cli import build_parser
from sbon.errors import SBoNError
from sbon.ifeval.checkers import build
from sbon.ifeval.instructions import DESCRIPTIONS, EXAMPLE_ARGS, by_frequency, parse_instructions
from sbon.ifeval.progress import ProgressModel, TypeModel
from sbon.ifeval.reward import PASS_RATES_FILE, IFEvalReward

# A fixed model (not the calibration file) so the assertions do not move with a recalibration.
MODEL = ProgressModel(resolution=0.0, types={t: TypeModel(rate=0.01, strength=200.0) for t in (
    "detectable_format:number_highlighted_sections", "detectable_content:postscript", "punctuation:no_comma",
    "length_constraints:number_words", "detectable_format:number_bullet_lists")},
    open_rates={"detectable_format:json_format": 0.2}, prior=0.3, chars_per_token=4.0, horizon_tokens=128)


def value(instruction_id, kwargs, text, model=MODEL):
    return model.value(build(instruction_id, kwargs), text)


def test_closer_to_an_at_least_target_is_worth_more():
    three = ("detectable_format:number_highlighted_sections", {"num_highlights": 3})
    none, one, two = (value(*three, t) for t in ("Plain words here, no marks ", "An *idea* here, ", "*a* and *b* so "))
    assert none < one < two < 1.0


def test_a_missing_ending_loses_value_as_room_runs_out():
    ps = ("detectable_content:postscript", {"postscript_marker": "P.S."})
    assert value(*ps, "x" * 40) > value(*ps, "x" * 300) > value(*ps, "x" * 520) == 0.0


def test_a_clean_prefix_gains_value_as_it_goes_on():
    comma = ("punctuation:no_comma", {})
    assert value(*comma, "word " * 10) < value(*comma, "word " * 60) < value(*comma, "word " * 100) < 1.0


def test_exactly_n_is_out_of_reach_when_no_room_is_left():
    bullets = ("detectable_format:number_bullet_lists", {"num_bullets": 3})
    assert value(*bullets, "* a\n* b\n* c\n" + "x" * 600) == pytest.approx(1.0)
    assert value(*bullets, "* a\n" + "x" * 600) == pytest.approx(0.0)


def test_a_type_without_counts_is_worth_its_calibrated_open_rate():
    assert value("detectable_format:json_format", {}, '{"a": ') == 0.2
    assert value("startend:quotation", {}, '"Hi') == 0.3  # never calibrated: the prior


def test_a_response_that_may_end_early_is_priced_so():
    # With a chance to stop at every token, many more words are less likely and staying under a cap more likely.
    ending = dataclasses.replace(MODEL, stop_rate=0.02)
    at_least = ("length_constraints:number_words", {"num_words": 60, "relation": "at least"})
    less_than = ("length_constraints:number_words", {"num_words": 50, "relation": "less than"})
    prefix = "word " * 20
    assert value(*at_least, prefix, ending) < value(*at_least, prefix)
    assert value(*less_than, prefix, ending) > value(*less_than, prefix)


def test_a_type_the_count_model_overrates_is_pulled_toward_its_open_rate():
    shrunk = dataclasses.replace(MODEL, types={"punctuation:no_comma": TypeModel(0.01, 200.0, weight=0.5, base=0.4)})
    comma = ("punctuation:no_comma", {})
    assert value(*comma, "word " * 100, shrunk) == pytest.approx(0.5 * value(*comma, "word " * 100) + 0.2)


def test_the_response_language_is_read_from_the_prefix():
    model = dataclasses.replace(MODEL, open_rates={"language:response_language": 0.2},
                                evidence_rates={"language:response_language": {"required": 0.8, "other": 0.01}})
    english = "The sea is wide and grey, and the waves roll slowly toward the old harbour wall."
    assert value("language:response_language", {"language": "en"}, english, model) == 0.8
    assert value("language:response_language", {"language": "de"}, english, model) == 0.01
    assert value("language:response_language", {"language": "de"}, "", model) == 0.2  # nothing to read yet


def test_the_shipped_calibration_beats_a_constant_value_out_of_sample():
    error = json.loads(PASS_RATES_FILE.read_text())["calibration_error_at_decision"]
    model, constant = error["progress_model"], error["constant_pass_rate"]
    assert model["log_loss"] < constant["log_loss"] and model["brier"] < constant["brier"]


def test_settled_verdicts_stay_exact_and_the_scale_is_the_expected_fraction():
    prompt = "Describe the sea, progress test."
    IFEvalReward.register(prompt, ["punctuation:no_comma", "detectable_content:postscript"],
                          [{}, {"postscript_marker": "P.S."}])
    try:
        reward = IFEvalReward(progress=MODEL)
        verdicts = reward.explain(prompt, "Blue, grey", final=False)
        assert [v.value for v in verdicts][0] == 0.0 and 0 < verdicts[1].value < 1
        (score,) = reward.score_partial(prompt, ["Blue, grey"])
        assert score == pytest.approx(sum(v.value for v in verdicts) / 2, abs=1e-3)
    finally:
        IFEvalReward.unregister(prompt)


def test_the_shipped_calibration_loads_and_values_every_type():
    from sbon.ifeval.reward import load_progress_model

    model = load_progress_model()
    assert len(by_frequency()) == 25  # every instruction type
    for instruction_id in by_frequency():
        assert 0.0 <= model.value(build(instruction_id, EXAMPLE_ARGS.get(instruction_id, {})), "The ") <= 1.0


def test_every_type_has_a_description_and_builds_from_its_example_arguments():
    assert set(DESCRIPTIONS) == set(by_frequency())
    for instruction_id in by_frequency():
        build(instruction_id, EXAMPLE_ARGS.get(instruction_id, {}))


@pytest.mark.parametrize("given", [
    '[{"id": "punctuation:no_comma"}, {"id": "change_case:english_lowercase"}]',
    '{"instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, {}]}',
    '["punctuation:no_comma", "change_case:english_lowercase"]',
    '[{"id": "punctuation:no_comma", "kwargs": {}}, {"id": "change_case:english_lowercase"}]'])
def test_instructions_in_every_accepted_form(given):
    assert parse_instructions(given) == [("punctuation:no_comma", {}), ("change_case:english_lowercase", {})]


@pytest.mark.parametrize("given,message", [
    ('[{"id": "punctuation:no_semicolon"}]', r"instructions\[0\]: unknown IFEval instruction"),
    ('[{"id": "length_constraints:number_words", "num_words": "many", "relation": "less than"}]',
     r"instructions\[0\]: .*'num_words' \(int\)"),
    ("[]", "instructions: empty"),
    ("not json", "instructions: not JSON"),
    (json.dumps(["punctuation:no_comma"] * 200), "instructions: 200 instructions, at most"),
    ('[{"kwargs": {}}]', r"instructions\[0\]: expected an object with an 'id'")])
def test_bad_instructions_are_refused_in_one_line_naming_the_field(given, message):
    with pytest.raises(SBoNError, match=message) as e:
        parse_instructions(given)
    assert "\n" not in str(e.value)


def test_instructions_from_a_file_reach_the_reward(tmp_path):
    prompt = "Write a short poem about the sea in all lowercase letters, without any commas."
    path = tmp_path / "instructions.json"
    path.write_text('[{"id": "change_case:english_lowercase"}, {"id": "punctuation:no_comma"}]')
    given = build_parser().parse_args(["run", "--instructions", str(path)]).instructions  # the command line reads it
    verdicts = IFEvalReward().with_instructions(prompt, given).explain(prompt, "the sea is wide and grey")
    assert [(v.instruction_id, v.status) for v in verdicts] == [
        ("change_case:english_lowercase", "pass"), ("punctuation:no_comma", "pass")]


def test_a_missing_instructions_file_is_named_as_missing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--instructions", str(tmp_path / "mine.json")])
    assert f"no file {tmp_path / 'mine.json'}: give JSON text or the path of a JSON file" in capsys.readouterr().err
