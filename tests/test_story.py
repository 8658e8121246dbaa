"""One story, one source: every view of a run says what the record says, and where the two runs' coupling broke
(Best-of-N's candidate k came out as another text than Speculative Rejection's k) the page says so first and
speaks of the run that happened. The divergence is forced by editing the recorded run: no model needed."""

import copy
import math
import re

import pytest

from components import figures, page_export, rounds, signals_view, tables
from components.controls import ASSETS
from components.gallery import caption
from components.page_text import machine_words
from components.views import VIEWS, Shown
from sbon.analysis.comparison import Comparison, coupling_note, headline_text, wall_time_text
from sbon.ifeval.instructions import parse_instructions
from sbon.metrics import decision_quality

RECORDED = ASSETS / "gallery" / "coin-toss.json"  # three rounds; its candidates 3, 6 and 10 are parted below
PARTED_WINNER, PARTED_PRUNED, PARTED_SHORTER = 3, 6, 10  # Best-of-N's winner, a pruned one, one shorter in Best-of-N


def _part(cand: dict, at: int, length: int | None = None) -> None:
    """Best-of-N's version of a candidate parts from Speculative Rejection's at token ``at`` (another token, another
    text from there on), as a flipped token in reduced precision makes it."""
    ids = cand["token_ids"][:length] if length else list(cand["token_ids"])
    ids[at] = (ids[at] + 1) % 49152
    cand["token_ids"] = ids
    cand["text"] = cand["text"][:at] + " otherwise" + cand["text"][at + 9:]


@pytest.fixture(scope="module")
def recorded():
    return Comparison.load(RECORDED)


@pytest.fixture(scope="module")
def parted(recorded):
    """The recorded run with three Best-of-N candidates parted from their Speculative Rejection twins: Best-of-N's
    winner becomes candidate 3 (finished early in both runs, another text in Best-of-N's), a pruned candidate's
    continuation is another text, and candidate 10 is shorter in Best-of-N's run than in Speculative Rejection's."""
    d = copy.deepcopy(recorded.to_dict())
    bon = d["bon"]["candidates"]
    _part(bon[PARTED_WINNER], 20)
    bon[PARTED_WINNER]["final_reward"] = max(c["final_reward"] for c in bon) + 1.0
    d["bon"]["best_id"] = PARTED_WINNER
    _part(bon[PARTED_PRUNED], 10)
    _part(bon[PARTED_SHORTER], 30, length=60)
    bon[PARTED_SHORTER]["tokens_generated"] = 60
    comp = Comparison.from_dict(d)
    assert comp.diverged_ids == [PARTED_WINNER, PARTED_PRUNED, PARTED_SHORTER]
    assert comp.speculative.best_id != comp.bon.best_id and comp.speculative.candidates[PARTED_WINNER].final_reward is not None
    return comp


def _views(comp):
    return {name: view(Shown(comp, "the test's run")) for name, view in VIEWS.items()}


def test_a_coupled_run_tells_no_divergence(recorded):
    assert recorded.diverged_ids == [] and coupling_note(recorded) == ""
    assert "came out differently" not in headline_text(recorded)


def test_where_coupling_broke_the_headline_says_so_first_in_one_line(parted):
    head = headline_text(parted)
    first = head.split("\n\n")[0]
    assert first == ("3 of 16 candidates came out differently in the two runs on this machine: the comparison is "
                     "approximate.")
    assert head.count("came out differently") == 1
    summary = _views(parted)["summary"]
    assert summary.startswith(first) and summary.count(first) == 1


def test_round_captions_and_reports_speak_of_the_run_that_happened(parted):
    views = _views(parted)
    captions = rounds.run_captions(parted)
    assert len(captions) == len(parted.speculative.decision_points) == 3
    for text in captions:
        assert "Best-of-N will pick" not in text  # its candidate 3 is not in this run
    assert all(q["winner"] == "diverged" for q in decision_quality(parted.bon, parted.speculative))
    report = tables.prediction_report(parted)
    assert "came out differently in this run" in report
    assert "winner survived" not in report and "winner was **pruned**" not in report
    for step in range(rounds.present_steps(parted)):
        assert "Best-of-N will pick" not in rounds.present_step(parted, step)[1]
    assert "the answer Best-of-N picks" not in views["caption"]
    assert "winner kept" not in caption(parted) and "came out differently" in caption(parted)


def test_final_rewards_and_the_returned_marks_name_one_text(parted):
    table = tables.candidates_table(parted).set_index("candidate")
    # Best-of-N's winner is another text than this run's candidate 3: no row says Best-of-N returned it
    assert "Best-of-N" not in table.loc[PARTED_WINNER, "returned"]
    assert table.loc[PARTED_WINNER, "final reward"] == pytest.approx(parted.speculative.candidates[PARTED_WINNER].final_reward, abs=0.01)
    assert "another text" in table.loc[PARTED_WINNER, "final from"]
    # a pruned candidate whose twin parted has no final reward: Best-of-N's scores another text
    assert parted.final_reward(PARTED_PRUNED) is None
    assert table.loc[PARTED_PRUNED, "final reward"] is None or math.isnan(table.loc[PARTED_PRUNED, "final reward"])
    assert table.loc[PARTED_PRUNED, "final from"].startswith("none")
    assert tables.pruning_cost(parted, PARTED_PRUNED) == ""
    detail = tables.candidate_detail_html(parted, PARTED_WINNER)
    assert "Best-of-N returned this" not in detail and "diverged" in detail
    # Savings states each run's own returned candidate and its own final reward
    savings = tables.savings_table(parted).set_index("")
    assert savings.loc["returned candidate", "Best-of-N"] == str(PARTED_WINNER)
    assert float(savings.loc["its final reward", "Best-of-N"]) == pytest.approx(parted.bon.best.final_reward, abs=0.01)


def test_token_bars_draw_a_parted_twin_as_another_text(parted):
    fig = figures.tokens_per_candidate(parted)
    bon = next(t for t in fig.data if t.name == "Best-of-N")
    other = next(t for t in fig.data if t.name == "Best-of-N: a different text")
    assert not set(parted.diverged_ids) & set(bon.x) and sorted(other.x) == parted.diverged_ids
    shorter = dict(zip(other.x, other.y))[PARTED_SHORTER]
    assert shorter < parted.speculative.candidates[PARTED_SHORTER].tokens_generated  # the bar that read as a contradiction


def test_one_kendall_per_signal_and_round_on_the_whole_page(parted, recorded):
    for comp in (recorded, parted):
        quality = decision_quality(comp.bon, comp.speculative)
        assert quality
        summary = signals_view.summary_table(comp)
        report = tables.prediction_report(comp)
        for q in quality:
            stated = re.search(rf"round {q['round']}, after {q['tokens']} tokens, by [^:]+: Kendall (\S+) ", report).group(1)
            row = summary[(summary["signal"] == "partial reward")
                          & (summary["decision point"] == f"round {q['round']} · {q['tokens']} tokens")]
            assert len(row) == 1
            assert stated == f"{row['Kendall with final reward'].iloc[0]:.2f}"
            scatter = figures.partial_final_scatter(comp, q["round"]).layout.title.text
            assert f"Kendall {stated}" in scatter


def test_the_downloaded_page_tells_the_same_story_once(parted):
    page = page_export.page_html(parted, caption(parted), "the test's run")
    assert page.count("came out differently in the two runs") == 1
    told = page[page.index("<h1>"):page.index('<section id="answers">')]  # the caption, headline and reports
    assert "**" not in told and "<strong>" in told  # Markdown rendered, not printed with its marks
    assert told.count("Speculative Rejection returned") == 1  # the headline once


def test_a_gallery_story_sets_every_control_so_run_reruns_its_configuration():
    from components.controls import SETTING_NAMES, settings_from
    from components.replays import GALLERY, on_gallery, open_link

    checked = 0
    for key, run in GALLERY.runs.items():
        for opened in (on_gallery(key, "curves"), open_link(f"gallery={key}", "curves")):
            assert set(SETTING_NAMES) <= set(opened), key
            settings = settings_from(tuple(opened[name] for name in SETTING_NAMES))  # what Run would run
            comp = run.comp
            assert (settings.method, settings.prompt, settings.generator, settings.reward) == \
                (comp.speculative.method, comp.speculative.prompt, comp.speculative.generator, comp.speculative.reward), key
            config = settings.config().settings()
            for name, value in comp.speculative.settings.items():
                if name in ("kv_budget", "first_decision"):  # automatic in every story: what automatic gave
                    assert opened[name] == 0
                else:
                    assert config[name] == value, (key, name)
            assert settings.bon_same_memory == (comp.bon.settings.get("batch_size") is not None)
            judged = [i for i, _ in parse_instructions(settings.instructions)] if settings.instructions else []
            assert judged == [i["id"] for i in comp.speculative.instructions], key
            checked += 1
    assert checked == 2 * len(GALLERY.runs) >= 6
    assert GALLERY.runs["high-alpha"].comp.speculative.settings["alpha"] == 0.8 and on_gallery("high-alpha", "curves")["alpha"] == 0.8


def test_a_run_names_its_machine_and_press_run_shows_only_where_it_reproduces(comparison, recorded):
    from sbon.machine import machine_class

    here = machine_class("cpu")
    assert comparison.speculative.machine == comparison.bon.machine == here  # recorded at run time, in the core result
    assert Comparison.from_json(comparison.to_json()).speculative.machine == here  # and saved with it
    assert f"Wall time on {here}:" in wall_time_text(comparison)
    path = comparison.speculative.decode
    assert tables.reproduction_note(comparison, here, comparison.speculative.weights, path).startswith("Press ▶ Run")
    # while the app still measures faster ways of decoding, a Run reproduces it only until it takes one of them
    measuring = tables.reproduction_note(comparison, here, comparison.speculative.weights, path, settled=False)
    assert measuring.startswith("Press ▶ Run to reproduce it now, while") and "may give other candidates" in measuring
    elsewhere = tables.reproduction_note(comparison, "Intel Xeon (AVX2)", comparison.speculative.weights, path)
    # the page names processors, not their instruction sets
    assert "Press" not in elsewhere and "this machine is Intel Xeon," in elsewhere and "AVX" not in elsewhere
    assert f"it ran on {machine_words(here)}," in elsewhere
    same_model = tables.reproduction_note(comparison, f"{machine_words(here)} (another set)",
                                          comparison.speculative.weights, path)
    assert "Press" not in same_model and "other processor features" in same_model
    isa = here.rpartition(" (")[2].rstrip(")")  # the class's instruction set, 'AVX-512 with BF16'
    page_wall_time = tables.headline_parts(comparison)[1]
    assert page_wall_time.startswith(f"Wall time on {machine_words(here)}:") and isa not in page_wall_time
    assert isa not in figures.phase_times(comparison).layout.title.text
    other = "compiled" if path == "eager" else "eager"
    other_path = tables.reproduction_note(comparison, here, comparison.speculative.weights, other)
    steps = {"eager": "one operation at a time", "compiled": "compiled into one step"}
    assert "Press" not in other_path and f"{steps[path]}; a Run here decodes with" in other_path \
        and other_path.endswith(f"{steps[other]}, and they round differently.")
    unnamed = copy.deepcopy(comparison)
    unnamed.speculative.machine = None
    assert "Press" not in tables.reproduction_note(unnamed, here, comparison.speculative.weights, path)
    # a recorded run's wall times name the machine they were measured on, never "this machine"
    for comp in (recorded, comparison):
        assert "this machine" not in wall_time_text(comp) and "Wall time on" in wall_time_text(comp)


def test_live_lines_count_in_words_and_say_what_a_person_waits_for(comparison_events, comparison):
    from components.live import LiveTracker

    tracker, lines = LiveTracker(24, reward="likelihood"), []
    for event in comparison_events:
        tracker.update(event)
        lines += [tracker.caption(), tracker.status()]
    assert not any(re.search(r"\b1 (candidates|steps)\b", line) for line in lines)
    assert any(re.search(r"Preparing the what-if views\*\*: \d+ of \d+", line) for line in lines)
    assert not any("Counterfactual" in line or "prefixes" in line for line in lines)


def test_best_of_n_s_phase_is_narrated_step_by_step_against_speculative_rejection(gen, likelihood):
    """While Best-of-N runs in batches after Speculative Rejection has answered, the caption moves at every step: its
    steps and tokens so far against Speculative Rejection's in all, its batch, how many candidates have finished, and
    its best final reward so far (known batch by batch) against Speculative Rejection's answer; two lines, each short
    enough for the presenter view."""
    from components.live import CAPTION_LINE_CHARS, LiveTracker
    from sbon.analysis.comparison import ComparisonReady, comparison_events
    from conftest import COMPARISON_PROMPT

    events = comparison_events(gen, likelihood, COMPARISON_PROMPT, 6, alpha=0.5, max_new_tokens=24, seed=2, taus=[8],
                               bon_same_memory=True, signals=())
    tracker, captions = LiveTracker(24, reward="likelihood"), []
    for event in events:
        tracker.update(event)
        if isinstance(event, ComparisonReady):
            comp = event.comparison
            break
        if tracker.phase == "bon" and tracker.tokens_of.get("bon"):
            captions.append(tracker.caption())
    size = comp.bon.settings["batch_size"]
    batches = -(-comp.n // size)
    assert batches > 1, "the same-memory baseline runs in batches here"
    assert all(len(line) <= CAPTION_LINE_CHARS for c in captions for line in c.split("  \n")) and \
        all(c.count("  \n") == 1 for c in captions)
    steps = [int(re.search(r"Best-of-N so far: (\d+) steps?", c).group(1)) for c in captions]
    assert steps == sorted(steps) and steps[-1] == comp.bon.decode_steps
    assert set(steps) == set(range(1, steps[-1] + 1))  # every step moves it
    assert all(f"Speculative Rejection used {comp.speculative.decode_steps} and {comp.speculative.total_tokens:,}" in c
               for c in captions)
    # the batch, where the line has room for it (a long reward leaves it out before the best so far)
    seen = [int(b) for c in captions for b in re.findall(r"batch (\d+) of \d+", c)]
    assert seen and seen[0] == 1 and seen == sorted(seen) and set(seen) <= set(range(1, batches + 1))
    assert all(f"of {batches}" in m for c in captions for m in re.findall(r"batch \d+ of \d+", c))
    finished = [int(re.search(r"(\d+) of %d done" % comp.n, c).group(1)) for c in captions]
    assert finished == sorted(finished) and finished[-1] == comp.n
    first_scored = next(i for i, c in enumerate(captions) if "its best" in c)
    assert 0 < first_scored < len(captions) - 1  # the first batch's rewards come before the last batch ends
    assert (f"its best {comp.bon.best.final_reward:.2f} (candidate {comp.bon.best_id}), Speculative Rejection's "
            f"{comp.speculative.best.final_reward:.2f}") in captions[-1]


