"""`python -m benchmarks scenarios` (the default scenario's evidence): its prompts are held out from every choice
this project made, and its readability check tells a looping answer from a plain one."""

import json

from benchmarks import default_scenario
from components.controls import load_examples
from components.scenarios import IFEVAL_EXAMPLE_KEYS, SCENARIOS
from sbon.ifeval.data import is_calibration


def test_every_scenario_s_prompts_are_held_out_from_every_choice():
    used = {i for f in default_scenario.DEFAULTS_RESULTS.glob("*.json")
            for i in json.loads(f.read_text()).get("settings", {}).get("prompt_ids") or []}
    examples = {e.prompt for e in load_examples()}
    assert len(SCENARIOS) > 1 and examples
    for key in SCENARIOS:
        prompts = default_scenario.scenario_prompts(key, 6, 30)
        assert len(prompts) == 6 and not {p["prompt"] for p in prompts} & (examples | set(SCENARIOS[key].prompts))
        if SCENARIOS[key].reward == "ifeval":  # the evaluation split, never the calibration's, each with its own
            assert all(not is_calibration(p["id"]) and p["id"] not in IFEVAL_EXAMPLE_KEYS and p["instructions"]
                       for p in prompts)
        else:  # not a prompt the former page default was chosen on
            assert used and not {p["id"] for p in prompts} & used


def test_a_looping_answer_reads_worse_than_a_plain_one():
    plain = "Mix the flour with the butter, add sugar, and bake the dough for twenty minutes."
    looping = "Add the sugar and stir. " * 8
    assert default_scenario.repeated_trigrams(plain) == 0 < 0.5 < default_scenario.repeated_trigrams(looping)
    assert default_scenario.english(plain) and not default_scenario.english("1234 5678")
