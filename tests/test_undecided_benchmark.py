"""`python -m benchmarks undecided`'s two ways of not generating again (benchmarks/undecided.py), on the real small
model with tiny settings (2 IFEval evaluation prompts, N=4, 12 tokens, two rules):

- ``--resume`` keeps the prompts a result file holds (their saved Best-of-N runs, replayed again) and generates only
  the others, and the file records the command that really ran and which command generated which rows;
- ``--from FILE --check K`` replays every rule on the saved Best-of-N runs without generating, and ``--check`` runs
  each rule for real on the first K rows and records whether the run equals the replay -- false when it does not.

Which runs are generated is counted at ``benchmarks.undecided.events``, the one door to a decode.
"""

from __future__ import annotations

import json
import shutil

import pytest

from benchmarks import undecided
from benchmarks.__main__ import main
from sbon.models import load_reward

RULES = ["paper", "defer"]
TINY = ["--set", "ifeval", "--n", "4", "--max-new-tokens", "12", "--threads", "1", "--quiet", "--rules", *RULES]


@pytest.fixture(scope="module")
def decodes(gen):
    """The benchmark on the session's generator (no second load), every decode it starts recorded as (method,
    rule, prompt)."""
    seen: list[tuple[str, str, str]] = []
    patch = pytest.MonkeyPatch()
    patch.setattr(undecided, "load_generator", lambda **_: gen)
    patch.setattr(undecided, "load_reward", lambda name, generator: load_reward(name, generator=generator))
    real_events = undecided.events

    def counted(g, reward, prompt, config):
        seen.append((config.method, config.undecided, prompt))
        return real_events(g, reward, prompt, config)

    patch.setattr(undecided, "events", counted)
    yield seen
    patch.undo()


@pytest.fixture(scope="module")
def resumed(decodes, tmp_path_factory):
    """One prompt, then ``--resume`` up to two: the file after each, and the decodes each started."""
    out = tmp_path_factory.mktemp("undecided") / "ifeval.json"
    first_argv = ["undecided", *TINY, "--k", "1", "--check", "0", "--out", str(out)]
    assert main(first_argv) == 0
    first, first_decodes = json.loads(out.read_text()), list(decodes)
    decodes.clear()
    argv = ["undecided", *TINY, "--k", "2", "--check", "0", "--resume", "--out", str(out)]
    assert main(argv) == 0
    second, second_decodes = json.loads(out.read_text()), list(decodes)
    decodes.clear()
    return out, (first_argv, first, first_decodes), (argv, second, second_decodes)


def test_resume_keeps_the_files_prompts_and_generates_only_the_others(resumed):
    _, (first_argv, first, first_decodes), (argv, second, second_decodes) = resumed
    (kept,) = first["rows"]
    assert [m for m, _, _ in first_decodes] == ["bon"]
    assert len(second["rows"]) == 2 and second["rows"][0]["id"] == kept["id"] != second["rows"][1]["id"]
    # only the new prompt was decoded; the kept row is its saved Best-of-N run, with its generation time
    assert second_decodes == [("bon", "paper", second["rows"][1]["item"]["prompt"])]
    assert second["rows"][0]["bon_run"] == kept["bon_run"]
    assert second["rows"][0]["seconds"]["best_of_n"] == kept["seconds"]["best_of_n"]
    for rule in RULES:  # replayed again, under the same rule: the same outcome
        assert second["rows"][0][rule]["winner"] == kept[rule]["winner"]
        assert second["rows"][0][rule]["decision_tokens"] == kept[rule]["decision_tokens"]
    assert sum(second["rows"][0][rule]["decision_points"] for rule in RULES) > 0  # the rules had cuts to make
    for row in second["rows"]:  # how the winner was pruned is recorded exactly when it was pruned while undecided
        for rule in RULES:
            assert (row[rule]["bon_winner_pruned_how"] is None) == (row[rule]["bon_winner_pruned_undecided"] == 0)
    # the recorded command is the one that ran, and each row says which command generated it
    assert first["command"].endswith("python -m benchmarks " + " ".join(first_argv))
    assert second["command"].endswith("python -m benchmarks " + " ".join(argv))
    assert [(g["rows"], g["command"]) for g in second["generated_by"]] == \
           [("1-1", first["command"]), ("2-2", second["command"])]
    assert second["summary"]["prompts"] == 2


def test_resume_refuses_a_file_made_with_other_settings(resumed, decodes, capsys):
    out = resumed[0]
    before = out.read_text()
    assert main(["undecided", *TINY, "--n", "6", "--k", "2", "--resume", "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err and out.read_text() == before and not decodes


def test_from_replays_without_generating_and_check_runs_each_rule_for_real(resumed, decodes, tmp_path):
    path = tmp_path / "ifeval.json"
    shutil.copy(resumed[0], path)
    saved = json.loads(path.read_text())
    argv = ["undecided", "--from", str(path), "--check", "1", "--rules", *RULES, "--threads", "1"]
    assert main(argv) == 0
    again = json.loads(path.read_text())
    first_prompt = saved["rows"][0]["item"]["prompt"]
    # no Best-of-N decode; one real run per rule, on the first row only
    assert sorted(decodes) == sorted(("sbon", rule, first_prompt) for rule in RULES)
    assert [r["bon_run"] for r in again["rows"]] == [r["bon_run"] for r in saved["rows"]]
    assert all(again["rows"][0][rule]["real_run_agrees"] is True for rule in RULES)
    assert all("real_run_agrees" not in again["rows"][1][rule] for rule in RULES)
    assert all((again["summary"][rule]["real_runs_checked"], again["summary"][rule]["real_runs_agree"]) == (1, 1)
               for rule in RULES)
    assert again["replayed_again"]["command"].endswith("python -m benchmarks " + " ".join(argv))
    assert again["command"] == saved["command"] and again["generated_by"] == saved["generated_by"]
    decodes.clear()

    # without --check, a row keeps its earlier check while its replay is the one that was checked
    unchecked = ["undecided", "--from", str(path), "--check", "0", "--rules", *RULES, "--threads", "1"]
    assert main(unchecked) == 0 and not decodes
    kept = json.loads(path.read_text())
    assert all(kept["rows"][0][rule]["real_run_agrees"] is True for rule in RULES)

    # a saved run that is not what the generator samples: its replay changes, so the earlier check goes; checked
    # again for real, the run and the replay differ
    tampered = json.loads(path.read_text())
    longest = max(tampered["rows"][0]["bon_run"]["candidates"], key=lambda c: len(c["token_ids"]))
    longest["token_ids"] = longest["token_ids"][:2]  # as if it had ended after two tokens
    path.write_text(json.dumps(tampered))
    assert main(unchecked) == 0 and not decodes
    dropped = json.loads(path.read_text())
    assert all("real_run_agrees" not in dropped["rows"][0][rule] for rule in RULES)
    assert main(argv) == 0
    checked = json.loads(path.read_text())
    assert len(decodes) == len(RULES)
    assert all(checked["rows"][0][rule]["real_run_agrees"] is False for rule in RULES)
    assert all(checked["summary"][rule]["real_runs_agree"] == 0 for rule in RULES)
    decodes.clear()


def test_how_the_winner_was_pruned_and_what_defers_waits_bought():
    from sbon.results import DecisionPoint

    first = DecisionPoint(1, 32, [0, 1, 2, 3], [0, 1, 2], [3], 0.5, undecided=[1, 2, 3], undecided_rule="defer")
    catch_up = DecisionPoint(2, 38, [0, 1, 2], [0], [1, 2], 0.9, undecided=[1, 2], undecided_rule="defer")
    assert undecided.pruned_how([first, catch_up], 1, "defer") == {"decision_point": 2, "tokens": 38, "how": "draw",
                                                                   "waited": True}
    assert undecided.pruned_how([first, catch_up], 0, "defer") is None  # never pruned
    assert undecided.pruned_how([first], 3, "paper")["how"] == "rank"
    halted = DecisionPoint(1, 32, [0, 1, 2, 3], [0, 1], [2, 3], 0.5, forced=[2], undecided=[1, 2, 3])
    assert undecided.pruned_how([halted], 2, "random") == {"decision_point": 1, "tokens": 32, "how": "budget",
                                                           "waited": False}
    assert undecided.waits([first, catch_up]) == [{"tokens": 6, "waited": 2, "still_undecided": 2, "kept": 0}]

