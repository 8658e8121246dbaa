"""The page's Instructions builder (components/instructions.py): picked types become JSON the reward
takes, edited arguments survive a new pick, an example fills it, a bad box is refused in one line."""

import json

import pytest

from components import instructions as builder
from components.controls import RunSettings
from components.scenarios import SCENARIOS
from sbon.errors import SBoNError

SEA = "Write a short poem about the sea in all lowercase letters, without any commas."


def test_a_click_in_the_list_always_adds_and_keeps_edited_arguments():
    picked = builder.on_types(["length_constraints:number_words"], "")
    assert picked["instruction_types"] == []  # the list empties: the next click adds again
    edited = picked["instructions"].replace('"num_words": 60', '"num_words": 25')
    box = builder.on_types(["punctuation:no_comma"], edited)["instructions"]
    assert json.loads(box) == [{"id": "length_constraints:number_words", "num_words": 25, "relation": "less than"},
                               {"id": "punctuation:no_comma"}]
    # clicking an instruction the box already holds (as after a scenario's example) never removes it
    again = builder.on_types(["punctuation:no_comma"], box)["instructions"]
    assert json.loads(again) == json.loads(box)
    assert builder.on_types([], box)["instructions"] == box


def test_a_prompt_of_your_own_clears_the_scenario_examples_instructions_only():
    example = SCENARIOS["instructions"].prompts[0]
    filled = builder.on_example(example)["instructions"]
    assert builder.on_prompt("Write a haiku about autumn.", filled) == {"instructions": ""}
    assert builder.on_prompt(example, filled) == {}  # the example itself keeps them
    own = '[{"id": "change_case:english_lowercase"}, {"id": "punctuation:no_comma"}]'
    assert builder.on_prompt("Write a haiku about autumn.", own) == {}  # instructions you wrote stay


def test_an_example_fills_the_builder_and_a_typed_prompt_runs_with_it():
    example = SCENARIOS["instructions"].prompts[0]
    filled = builder.on_example(example)
    assert filled["instruction_types"] == [] and json.loads(filled["instructions"])
    assert builder.on_example("What is Atlantis?") == {}
    box = '[{"id": "change_case:english_lowercase"}, {"id": "punctuation:no_comma"}]'
    RunSettings(prompt=SEA, reward="ifeval", instructions=box).check()  # the sea poem is accepted


def test_instructions_given_under_another_reward_switch_it_or_are_said_to_be_ignored():
    """Picking or typing instructions under the default reward switches the run to the instruction reward; a reward
    chosen afterwards is said, in one line, to ignore them; the note reads them in words, never as JSON."""
    picked = builder.on_types(["change_case:english_lowercase"], "", "minilm-pref")
    assert picked["reward"] == "ifeval"
    assert "reward" not in builder.on_types(["punctuation:no_comma"], picked["instructions"], "ifeval")
    assert builder.on_typed('["punctuation:no_comma"]', "minilm-pref") == {"reward": "ifeval"}
    assert builder.on_typed('["punctuation:no_co', "minilm-pref") == {}  # unfinished: nothing switches
    note = builder.on_text(picked["instructions"], "ifeval")["instructions_note"]
    assert "checks each" in note and "lowercase" in note and "{" not in note and "change_case" not in note
    ignored = builder.on_text(picked["instructions"], "minilm-pref")["instructions_note"].splitlines()[0]
    assert ignored.startswith("⚠") and "ignores these instructions" in ignored
    assert all("{" not in label and ":" not in label for label, _ in builder.type_choices())


def test_the_api_refuses_instructions_for_another_reward_before_running():
    """/compare with instructions and a reward that judges none refuses in one line (the run would go on without
    them); the page's builder may hold some under another reward, which its note says are ignored."""
    import gradio as gr

    import app
    from components.runs import Runs

    ran = []
    compare = app.compare_endpoint(Runs(lambda settings: ran.append(settings) or iter(())))
    with pytest.raises(gr.Error, match="instructions are checked only by the ifeval reward, not by minilm-pref") as e:
        compare(SEA, reward="minilm-pref", instructions="Answer in three bullet points.")
    assert "\n" not in str(e.value) and ran == []
    assert builder.on_text('[{"id": "punctuation:no_comma"}]', "minilm-pref")["instructions_note"].startswith(
        builder.ignored("minilm-pref"))


def test_the_note_reads_each_instruction_or_the_one_line_refusal():
    note = builder.on_text('[{"id": "punctuation:no_comma"}]')["instructions_note"]
    assert "no commas" in note
    bad = builder.on_text('[{"id": "punctuation:no_semicolon"}]')["instructions_note"]
    assert bad.startswith("⚠ instructions[0]: unknown IFEval instruction") and "\n" not in bad


def test_a_new_prompt_without_instructions_is_refused_once_in_one_line():
    try:
        RunSettings(prompt="A prompt nobody gave instructions", reward="ifeval").check()
    except SBoNError as e:
        message = str(e)
    assert message.count("add an instruction under Instructions") == 1 and "\n" not in message
    assert "sbon/" not in message and "register" not in message


def test_the_command_line_refuses_instructions_for_another_reward_before_loading(capsys):
    from sbon import cli

    assert cli.main(["run", "--prompt", SEA, "--reward", "minilm-pref", "--instructions",
                     '["punctuation:no_comma"]']) != 0
    err = capsys.readouterr().err
    assert "instructions are checked only by the ifeval reward, not by minilm-pref" in err and "loading" not in err
    assert cli.main(["run", "--prompt", SEA, "--reward", "ifeval", "--instructions", "[]"]) != 0
    assert "instructions: empty" in capsys.readouterr().err
