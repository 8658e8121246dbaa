"""The app's handlers as plain functions (no browser): what each returns, by page element name."""

from __future__ import annotations

import inspect
import json
import re
import time
from pathlib import Path

import pytest

from components import controls, page_text, presenter, runs, scenarios, tables, tuning, views
from components.style import Look
from sbon.analysis.comparison import Comparison, ComparisonDone

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def app():
    """The app module: importing it builds, loads and sets nothing (create_app and main do)."""
    import app as module
    return module


@pytest.fixture(scope="module")
def slot(app):
    """The generation slot the page's Run button and its /compare API share."""
    return app.Runs(app.comparison_on_gpu)


@pytest.fixture(scope="module")
def demo(app, slot):
    """The page, built around `slot`."""
    return app.create_app(runs=slot)


def test_showing_the_recorded_run_fills_every_view(app):
    shown = app.show_recorded("heatmap")
    assert set(shown) == set(app.SHOWN)
    comp = shown["comparison"]
    assert isinstance(comp, Comparison) and comp.speculative.decision_points
    assert "recorded run" in shown["source"] and shown["status"] == ""
    assert shown["decision_point"].value == comp.speculative.decision_points[0].round
    assert shown["tradeoff_plot"].data[0].type == "heatmap"  # the kind the page asked for


def test_whether_a_run_here_reproduces_the_recorded_run_is_said_as_of_each_open(app, machine_without_choice,
                                                                              monkeypatch):
    """The recorded run's views are computed once for every page load; whether a Run here gives its candidates
    depends on how runs decode here, which the app measures after it starts: each open, and the Replay button, says
    it as of then, in words (no format names)."""
    from components import replays
    from components.decode_paths import DecodePaths
    from sbon.machine import Measured, choose, decode_threads, fingerprint, save_choice

    recorded = app.show_recorded("curves")["comparison"].speculative
    assert (recorded.weights, recorded.decode) == ("fp32", "eager")
    # this machine as the one it was recorded on (another kind of processor would say so instead)
    monkeypatch.setattr(views, "machine_class", lambda device: recorded.machine)
    monkeypatch.setattr(views.MODELS, "decode_paths", DecodePaths())

    def measured(fastest):
        save_choice(choose(recorded.generator, fingerprint("cpu", decode_threads()),
                           [Measured(w, "eager", ms={7: 50.0 if w == fastest else 100.0}, exact=True)
                            for w in ("fp32", "int4")]))
        return replays.on_open("curves", None, {})["source"]

    opened = replays.on_open("curves", None, {})["source"]
    assert "the app is still measuring faster ways of decoding here" in opened  # nothing measured yet
    to_int4 = measured("int4")
    assert "may give other candidates than this recording: it decoded with full-precision numbers" in to_int4 \
        and "a Run here decodes with 4-bit weights" in to_int4 and "fp32" not in to_int4 and "int4" not in to_int4
    assert app.show_recorded("curves")["source"] == to_int4
    assert "Run here reproduces it" in (kept := measured("fp32")) or kept.endswith(
        "Press ▶ Run to reproduce it: this machine, decoding the same way, gives the same candidates.")
    assert "still measuring" not in kept and "other candidates" not in kept


def test_the_one_converter_gives_gradio_what_the_plain_handlers_mean(app):
    """Handlers return plain records; app.for_gradio turns a whole page's worth into Gradio's values: updates
    of the properties given (and only those), frozen figures as the plot's data, a notice as a toast, a
    refusal as the error dialog."""
    import gradio as gr
    from gradio.components.plot import PlotData

    from components.updates import WARNING, FrozenFigure, Refused, Update

    shown = app.show_recorded("curves")
    comp = shown["comparison"]
    page = app.for_gradio(lambda: {**shown, "stop_btn": Update(visible=False), "live_plot": FrozenFigure("{}")})()
    assert set(page) == set(shown) | {"stop_btn"}
    assert page["decision_point"] == gr.update(choices=shown["decision_point"].choices, value=comp.speculative.decision_points[0].round)
    assert page["stop_btn"] == {"__type__": "update", "visible": False}  # nothing else changes
    assert isinstance(page["live_plot"], PlotData) and page["live_plot"].plot == "{}"
    assert page["comparison"] is comp and page["source"] == shown["source"]  # plain values pass as they are
    assert not any(isinstance(v, (Update, FrozenFigure)) for v in page.values())

    with pytest.warns(UserWarning, match="a one-line notice"):
        assert app.for_gradio(lambda: {"status": "⚠ x", WARNING: "a one-line notice"})() == {"status": "⚠ x"}
    assert app.for_gradio(lambda: {})() == gr.skip()  # nothing to change: every output stays as it is

    def refuse(_):
        raise Refused("not now", duration_s=6)
        yield
    with pytest.raises(gr.Error, match="not now") as e:
        list(app.for_gradio(refuse)(None))
    assert e.value.duration == 6 and e.value.title == "Not now"  # nothing went wrong: not titled "Error"


def test_a_bad_setting_stops_the_run_in_one_line_before_any_model_loads(app, slot, monkeypatch):
    monkeypatch.setattr(app.MODELS, "load_async", lambda *a: pytest.fail("no model may load for bad settings"))
    values = dict(zip(app.SETTING_NAMES, [app.DEFAULTS.to_dict()[name] for name in app.SETTING_NAMES]))
    values.update(prompt="What is Atlantis?", alpha=1.0)
    recorded = app.show_recorded("curves")
    updates = list(slot.run(*values.values(), "curves", recorded["comparison"], recorded["origin"], Look(), None))
    assert len(updates) == 1
    assert updates[0]["status"].startswith("⚠ alpha") and "\n" not in updates[0]["status"]
    assert updates[0]["running"] is None and updates[0]["stop_btn"].visible is False
    assert updates[0]["source"] == recorded["source"] and updates[0]["summary"] == recorded["summary"]
    # the caption above the chart says it too (the Run click had set it to "Starting…"; the presenter view shows
    # the caption, not the status line), over the chart and answers of the run still shown
    assert updates[0]["caption"] == updates[0]["status"]
    assert updates[0]["live_plot"] == recorded["live_plot"]
    assert updates[0]["sbon_text"].value == recorded["sbon_text"].value != ""


def test_each_method_shows_its_own_knobs(app):
    rounds, tau = controls.on_method("sbon"), controls.on_method("sbon-tau")
    assert rounds["kv_budget"].visible and rounds["first_decision"].visible and not rounds["tau"].visible
    assert tau["tau"].visible and not tau["kv_budget"].visible and not tau["first_decision"].visible


def test_every_control_sets_a_run_setting_and_defaults_pass_the_checks(app):
    fields = app.DEFAULTS.to_dict()
    assert set(app.SETTING_NAMES) <= set(fields)
    settings = controls.settings_from([fields[name] or ("Hi" if name == "prompt" else 0) for name in app.SETTING_NAMES])
    assert settings.config() == app.DEFAULTS.config()


def test_a_tuning_result_loads_and_puts_its_setting_in_the_controls(app, tmp_path):
    tune = tmp_path / "tune.json"
    tune.write_text(json.dumps({
        "experiment": "tune", "generator": "smollm2-135m", "reward": "minilm-pref", "prompts": 10, "floor": 98.0,
        "run_config": {"method": "sbon-tau", "n": 32, "tau": 16, "alpha": 0.8, "first_decision": 16,
                       "prune_by": "reward", "max_new_tokens": 128},
        "per_signal": {"reward": {"t": 16, "alpha": 0.8, "normalized_score": 98.4, "token_speedup": 3.39,
                                  "winner_kept": 0.6, "kendall": 0.25}, "deepconf": None}}))
    shown = tuning.on_tune_upload(str(tune))
    assert "α = 0.8" in shown["tune_summary"] and shown["use_tuned"].visible
    table = shown["tune_table"].set_index("signal")
    assert table.loc["reward", "token speedup"] == 3.39 and table.loc["deepconf", "winner kept"] == "never reached the floor"
    settings = tuning.on_use_tuned(shown["tuning"])
    assert settings == {"method": "sbon-tau", "alpha": 0.8, "tau": 16, "prune_by": "reward", "n": 32,
                        "max_new_tokens": 128, "first_decision": 16}
    controls.settings_from([{**app.DEFAULTS.to_dict(), "prompt": "Hi", **settings}[name] or 0
                       for name in app.SETTING_NAMES])  # the tuned setting passes the page's checks

    recorded = tuning.on_tune_upload(str(ROOT / "assets" / "recorded_run.json"))
    assert recorded["tune_summary"].startswith("⚠ could not read that file: not a tuning result")
    assert recorded["use_tuned"].visible is False


def test_model_status_says_what_is_loaded_now_after_runs_failures_and_reloads(app, monkeypatch):
    """The sequence a lecturer went through: the defaults load, runs with two other rewards evict them,
    a load fails, a fresh page opens. Each time the status line names what is in memory now."""
    import components.model_cache as mc
    from sbon.errors import SBoNError

    monkeypatch.setattr(mc, "_warm_up", lambda gen: None)

    def load_rew(name, generator, device):
        if name == "broken":
            raise SBoNError("cannot load reward model 'broken': is the hub reachable?")
        return f"R:{name}"

    cache = mc.ModelCache(size=2, load_gen=lambda name, device: f"G:{name}", load_rew=load_rew)
    monkeypatch.setattr(runs, "MODELS", cache)
    monkeypatch.setattr(runs, "PRELOAD", [])
    assert runs.models_status().startswith("No model is loaded")

    runs.PRELOAD.append(cache.load_async("smollm2-135m", "likelihood"))  # the app's start-up load
    runs.PRELOAD[0].result()
    status = runs.models_status()
    # models by their human names (the presets' titles), never the identifiers
    assert "SmolLM2-135M-Instruct (a small chat model)" in status and "judged by likelihood" in status
    assert "⏳" not in status

    for reward in ("minilm-pref", "minilm-pref-nolength"):  # two runs with other rewards evict the default reward
        cache.load_async("smollm2-135m", reward).result()
    status = runs.models_status()
    assert "a small preference model, a small preference model, length left out" in status
    assert "likelihood" not in status
    assert "⏳" not in status  # the old bug: "Loading the models…" forever once the defaults were evicted

    failed = cache.load_async("smollm2-135m", "broken")
    with pytest.raises(SBoNError):
        failed.result()
    status = runs.models_status()
    assert "⚠ loading SmolLM2-135M-Instruct (a small chat model) with broken failed: cannot load reward model 'broken'" \
        in status
    assert "length left out" in status  # a failed load leaves what is loaded as it was

    # a page reload computes the line afresh (a callable value, not one fixed at build time)
    page = app.create_app()
    model_status = next(b for b in page.blocks.values() if getattr(b, "elem_id", None) == "model-status")
    assert callable(model_status.value) or model_status.value == status
    reload = runs.on_model_timer()
    assert reload["model_status"] == status and reload["model_timer"].value == runs.MODEL_STATUS_IDLE_S

    cache.load_async("smollm2-135m", "likelihood").result()  # the default again: the failure stays listed
    status = runs.models_status()
    # the cache holds two rewards: the default's return evicts the oldest (minilm-pref)
    assert "judged by a small preference model, length left out, likelihood" in status and "⚠ loading" in status


def test_a_second_run_is_refused_or_queued_with_a_reason(app, slot, monkeypatch):
    import gradio as gr

    with pytest.raises(gr.Error, match="A run is already going"):
        app.for_gradio(slot.request)(1.0)  # this session's run started at t=1: the page's error dialog
    monkeypatch.setattr(slot, "generating", 0)
    start = slot.request(None)
    assert start["status"] == "Starting…" and start["running"] and start["stop_btn"].visible
    assert "New run starting" in start["summary"]  # the old headline goes at once
    monkeypatch.setattr(slot, "generating", 1)  # another session's run holds the slot
    queued = slot.request(None)
    assert queued["status"].startswith("⏳ Queued") and "New run queued" in queued["summary"]


def test_a_run_s_figures_fit_the_window_as_it_is_at_the_click(slot):
    """The Run click sends the window's size (VIEWPORT_JS): a window resized, or a phone turned, since the page
    opened gets figures for its size now; a click that reports none (an API client) keeps the look it had."""
    opened = Look(presenter=True, screen_px=480, live_px=300, width_px=853)
    turned = slot.request(None, opened, {"screen": 844, "live": 600, "width": 390})["look"]
    assert turned == Look(presenter=True, screen_px=844, live_px=600, width_px=390)
    assert slot.request(None, opened, None)["look"] == opened and slot.request(None)["look"] == Look()


def test_new_seed_is_a_different_valid_seed(app):
    seeds = {controls.on_new_seed(7) for _ in range(50)}
    assert 7 not in seeds and len(seeds) > 40 and all(0 <= s <= 999_999 for s in seeds)  # six digits at most
    controls.settings_from([{**app.DEFAULTS.to_dict(), "prompt": "Hi", "seed": seeds.pop()}[name] or 0
                       for name in app.SETTING_NAMES])


def test_the_api_describes_every_parameter_and_its_return(app, slot, demo):
    from dataclasses import fields

    from components.controls import MAX_N, MAX_NEW_TOKENS
    from sbon.analysis.comparison import FORMAT
    from sbon.config import RunConfig

    info = demo.get_api_info()["named_endpoints"]["/compare"]
    params = {p["parameter_name"]: p for p in info["parameters"]}
    assert list(params) == list(inspect.signature(app.compare_endpoint(slot)).parameters)
    for name, p in params.items():
        assert p["python_type"]["description"], f"{name} has no description"
    help_of = {f.name: f.metadata["help"] for f in fields(RunConfig)}
    assert params["alpha"]["python_type"]["description"].startswith(help_of["alpha"])  # the settings' own words
    assert params["n"]["type"]["maximum"] == MAX_N and params["max_new_tokens"]["type"]["maximum"] == MAX_NEW_TOKENS
    assert params["alpha"]["type"]["minimum"] == 0 and params["method"]["type"]["enum"] == ["sbon", "sbon-tau"]
    assert params["prompt"]["python_type"]["type"] == "str" and params["n"]["python_type"]["type"] == "int"
    returned = info["returns"][0]["python_type"]["description"]
    assert FORMAT in returned and "normalized_score" in returned


def test_the_api_names_every_key_of_the_json_it_returns(app):
    """/compare's description of its JSON is made from the saved-run dataclasses: every key the file holds, at
    every level (the comparison, a run, a candidate, a partial reward, a decision point), is named in it."""
    import re

    saved = app.show_recorded("curves")["comparison"].to_dict()
    run, candidates, points = saved["sbon"], saved["sbon"]["candidates"], saved["sbon"]["decision_points"]
    partials = [p for c in candidates for p in c["partial_rewards"]]
    assert candidates and points and partials  # the recorded run has every level to check
    assert list(page_text.COMPARISON_KEYS) == list(saved)  # each top-level key with its meaning, in the file's order
    described = set(re.findall(r"[a-z_]+", page_text.api_returns()))
    for level in (saved, run, candidates[0], partials[0], points[0]):
        assert set(level) <= described, f"undescribed keys: {set(level) - described}"


def test_importing_the_app_starts_nothing_loads_nothing_and_sets_nothing():
    """`import app` in a fresh process: torch's threads as they were (SBON_THREADS asks for another count, which
    only main() applies), no new thread, no model in the cache, and a mistyped SBON_DECODE does not stop it."""
    import os
    import subprocess
    import sys

    probe = ("import threading, torch; threads = torch.get_num_threads(); running = threading.active_count(); "
             "import app; from components.model_cache import MODELS; "
             "print(threads, torch.get_num_threads(), running, threading.active_count(), MODELS.loaded(), "
             "len(MODELS.decode_paths._children), sep='|')")
    env = {**os.environ, "SBON_THREADS": "7", "SBON_DECODE": "fast"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, running, running_after, loaded, children = done.stdout.strip().splitlines()[-1].split("|")
    assert before == after != "7" and running == running_after
    assert (loaded, children) == ("([], [])", "0")


def test_a_scenario_sets_a_reward_that_can_judge_its_prompts(app):
    from components.controls import RunSettings
    from components.scenarios import SCENARIOS
    from sbon.errors import SBoNError

    update = scenarios.on_scenario("instructions")
    assert update["reward"] == "ifeval" and update["prompt"] in SCENARIOS["instructions"].prompts
    assert len(SCENARIOS["instructions"].prompts) >= 4
    RunSettings(prompt=update["prompt"], reward="ifeval").check()  # an IFEval prompt: accepted
    with pytest.raises(SBoNError, match="add an instruction under Instructions, or pick an example") as e:
        RunSettings(prompt="Tell me a joke.", reward="ifeval").check()
    assert "\n" not in str(e.value)
    assert scenarios.on_scenario("fluency")["prune_by"] == "logprob"
    assert "length" in SCENARIOS["helpful"].label  # the caveat is in the dropdown itself
    # a prompt the visitor typed is never replaced by a scenario's example; an example prompt is
    own = "Write a short poem about autumn in all lowercase, no commas."
    kept = scenarios.on_scenario("instructions", own)
    assert "prompt" not in kept and kept["reward"] == "ifeval" and kept["scenario_prompts"].value is None
    assert scenarios.on_scenario("instructions", SCENARIOS["helpful"].prompts[0])["prompt"] in \
        SCENARIOS["instructions"].prompts
    assert scenarios.on_scenario("instructions", "  ")["prompt"] == SCENARIOS["instructions"].prompts[0]


def test_a_run_shows_sbon_s_answer_then_every_run_view_then_the_prefix_scored_ones(app, slot, monkeypatch):
    """The order a lecture watches: Speculative Rejection's answer under the race while
    Best-of-N still runs, then every view of both runs, then the views drawn from the prefix rewards."""
    from components.rounds import run_captions

    monkeypatch.setattr(runs, "LIVE_FRAME_EVERY_S", 0.0)  # this small Best-of-N can finish within one frame's wait
    values = dict(zip(app.SETTING_NAMES, [app.DEFAULTS.to_dict()[name] for name in app.SETTING_NAMES]))
    values.update(prompt="What is Atlantis?", n=4, max_new_tokens=12, alpha=0.5, method="sbon-tau", tau=4)
    recorded = app.show_recorded("curves")
    clicked = time.time() - 30  # Run was clicked 30 s ago: other visitors' runs held the slot meanwhile
    updates = list(slot.run(*values.values(), "curves", recorded["comparison"], recorded["origin"], Look(), clicked))
    assert updates[0]["sbon_text"].value == "" and updates[0]["bon_text"].value == ""  # no stale answers

    answered = next(i for i, u in enumerate(updates) if u.get("sbon_text") is not None and u["sbon_text"].value)
    ready = next(i for i, u in enumerate(updates) if str(u.get("status", "")).startswith("Done in"))
    assert answered < ready
    assert "Speculative Rejection answered after" in updates[answered]["summary"]
    assert "| Best-of-N | waiting |" in updates[answered]["summary"]  # Best-of-N has not started yet
    assert updates[answered]["sbon_text"].label.startswith("Speculative Rejection returned candidate")
    # Where the audience looks: the caption over the live chart names the answer, and while Best-of-N runs
    # the live chart shows its candidates' tokens growing.
    assert "Speculative Rejection answered: candidate" in updates[answered]["caption"]
    progress = [u["live_plot"] for u in updates[answered:ready] if u.get("live_plot") is not None]
    assert progress and "Best-of-N" in progress[-1].layout.title.text
    assert any(t.name in ("Best-of-N generating", "Best-of-N finished") and len(t.x) for t in progress[-1].data)
    # and the caption narrates Best-of-N's steps against Speculative Rejection's
    assert any(str(u.get("caption", "")).startswith("Best-of-N so far:") for u in updates[answered:ready])

    shown = updates[ready]
    # its own time, and the wait a visitor also sat through (the run's clock starts when the slot is its)
    assert re.match(r"Done in \d+\.\d s from its start, after 3\d s in the queue;", shown["status"]), shown["status"]
    assert set(app.SHOWN) <= set(shown) and shown["comparison"].partials == {}
    assert "Preparing the what-if views" in shown["status"] and "running" not in shown  # the run still holds the slot
    assert "Best-of-N returned candidate" in shown["bon_text"].label
    # the trade-off says it is being prepared, not that the run was too short to score
    assert shown["tradeoff_plot"].layout.annotations[0].text == views.WHAT_IF_PENDING
    # and still says so when switched to the heatmap meanwhile; a run that ended unscored says why
    switched = views.on_tradeoff_kind(shown["comparison"], "heatmap", Look(), clicked)
    assert switched["tradeoff_plot"].layout.annotations[0].text == views.WHAT_IF_PENDING
    ended = views.on_tradeoff_kind(shown["comparison"], "heatmap", Look(), None)
    assert ended["tradeoff_plot"].layout.annotations[0].text.startswith("No prefix of Best-of-N's candidates")
    # "Present rounds" waits while the run draws its frames, and works from the moment its result is shown ...
    present = [u["present"] for u in updates if "present" in u]
    assert present[0] == views.LIVE and [i for i, u in enumerate(updates) if "present" in u][-1] == ready
    pressed = presenter.on_present(shown["comparison"], shown["present"], Look())
    assert pressed["caption"] == run_captions(shown["comparison"])[0]

    last = updates[-1]  # ... and the prefix-scored views, which come after, leave the presentation going
    assert set(app.SHOWN) - set(views.LIVE_CHART) <= set(last)
    done = shown["status"].split(";")[0]  # "Done in … s from its start, after … s in the queue"
    assert last["status"].startswith(done + ";") and "; every view ready after" in last["status"], last["status"]
    assert not set(views.LIVE_CHART) & set(last)
    assert last["comparison"].partials and last["running"] is None and last["stop_btn"].visible is False
    assert last["tradeoff_plot"].data  # the curves, now that the prefixes are scored
    assert last["comparison"].metrics == shown["comparison"].metrics


def test_stop_says_what_the_views_show(app):
    import dataclasses

    recorded = app.show_recorded("curves")["comparison"]
    before = runs.on_stop(recorded, "the recorded run")
    assert before["status"] == "Stopped: the views still show the previous run" and before["running"] is None
    # ... and once the run is cancelled, they do: the stopped run's half-drawn chart and answers are replaced
    after, shown = runs.after_stop(recorded, "the recorded run"), app.show_recorded("curves")
    assert after["status"] == before["status"] and after["running"] is None
    assert after["present"] is None  # the live chart is the run shown again: its rounds can be presented
    assert after["live_plot"] == shown["live_plot"] and after["bon_text"].value == shown["bon_text"].value != ""
    ready = dataclasses.replace(recorded, partials={})  # a run stopped after its final frame, before its prefixes
    during = runs.on_stop(ready, "your run")
    assert "Trade-off and Pruning-signals views of this run stay empty" in during["status"]


def test_presenter_controls_say_what_to_do_and_step_through_the_rounds(app):
    """"Present rounds": without a run, one line says what to do; on the recorded run each step
    is one decision point with its caption, then the result; the timer starts over after the result."""
    from components.rounds import run_captions

    none = presenter.on_present(None, None, Look())
    assert none["caption"] == views.NO_RUN and "\n" not in none["caption"] and "present" not in none
    comp = app.show_recorded("curves")["comparison"]
    # while a run draws its frames, the previous run is not presented over them, and the timer waits
    assert "once its result is shown" in presenter.on_present(comp, views.LIVE, Look())["caption"]
    assert presenter.on_present_tick(comp, views.LIVE, Look()) == {}
    update = presenter.on_present(comp, None, Look())
    captions = [update["caption"]]
    for _ in range(len(comp.speculative.decision_points)):
        update = presenter.present_move(comp, update["present"], Look(), move=1)
        captions.append(update["caption"])
    assert captions[:-1] == run_captions(comp) and captions[-1].startswith("Result · ")
    assert update["present_next"].interactive is False and update["present_prev"].interactive is True
    assert presenter.on_present_tick(comp, update["present"], Look())["present"] == 0  # timed: from the start again
    assert presenter.on_present(comp, 2, Look())["present"] == 0  # the button starts at the first round


def test_the_page_names_its_scenario_and_types_no_measured_number(app):
    import re

    assert scenarios.on_settings_scenario("likelihood", "logprob", 128)["scenario"] == "fluency"
    assert scenarios.on_settings_scenario("likelihood", "logprob", 64)["scenario"] is None
    assert scenarios.on_settings_scenario("ifeval", "reward", 128)["scenario"] == "instructions"
    assert re.search(r"\d", page_text.REWARD_NOTE) is None  # numbers come from result files, never typed
    assert page_text.REWARD_NOTE.count("\n") <= 2 and "usage.md" in page_text.REWARD_NOTE
    names = set(views.VIEWS["correlations"](views.Shown(app.show_recorded("curves")["comparison"], "x")).columns)
    assert not names & {"tau", "pearson", "oracle_cut"}



INSTRUCTED_PROMPT = "Describe the sea in one sentence."  # not a shipped IFEval prompt: only a run's instructions judge it
GIVEN = {"capitals": {"id": "change_case:english_capital"},
         "no-zebra": {"id": "keywords:forbidden_words", "forbidden_words": ["zebra"]}}


@pytest.fixture(scope="module")
def instructed_runs(app, gen):
    """Two visitors, the same prompt text, different instructions, their runs interleaved step by step as the
    Space's threads interleave them, through the app's own run path: {key: comparison}."""
    from sbon.models import load_reward

    shared = load_reward("ifeval", generator=gen)  # one reward object for both, as the model cache serves it
    base = dict(prompt=INSTRUCTED_PROMPT, reward="ifeval", prune_by="reward", method="sbon-tau", tau=4, alpha=0.5,
                n=4, max_new_tokens=12)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app.MODELS, "get", lambda generator, reward: (gen, shared))
        streams = {key: iter(app.comparison_on_gpu(app.RunSettings(**base, instructions=json.dumps([ins]))))
                   for key, ins in GIVEN.items()}
        done = {}
        while streams:
            for key in list(streams):
                event = next(streams[key], None)
                if event is None:
                    del streams[key]
                elif isinstance(event, ComparisonDone):
                    done[key] = event.comparison
    return done


def test_two_runs_of_one_prompt_text_with_different_instructions_are_judged_each_by_its_own(instructed_runs):
    """Every candidate of each run is scored by its own instructions (all in capitals: every candidate fails;
    no "zebra": every candidate passes), never the other's, and each run records its own."""
    from sbon.ifeval.checkers import build
    from sbon.ifeval.reward import tie_break

    for key, ins in GIVEN.items():
        check = build(ins["id"], {k: v for k, v in ins.items() if k != "id"})
        for run in (instructed_runs[key].bon, instructed_runs[key].speculative):
            scored = [c for c in run.candidates if c.final_reward is not None]
            assert [c.final_reward for c in scored] == pytest.approx(
                [float(check.check(c.text)) + tie_break(c.text) for c in scored])
            assert run.instructions == [ins]
    assert max(instructed_runs["capitals"].bon.final_rewards) < 0.5 < min(instructed_runs["no-zebra"].bon.final_rewards)


def test_a_saved_shared_or_exported_run_keeps_its_instructions_and_verdicts(app, instructed_runs, tmp_path,
                                                                           monkeypatch):
    """Download and reopen, share and open the link, download as a page: the same instructions, the same
    verdicts, though the reward in memory was never given them; a file saved before runs recorded them loads."""
    from components import replays
    from components.gallery import facts
    from components.saved_runs import load_upload, save_for_download
    from components.share import ShareStore
    from components.views import detail
    from sbon.ifeval.reward import IFEvalReward

    monkeypatch.setattr(app.MODELS, "loaded_reward", lambda reward, generator: IFEvalReward())
    monkeypatch.setattr(replays, "SHARES", ShareStore(folder=tmp_path))
    comp = instructed_runs["capitals"]
    reopened = load_upload(save_for_download(comp))
    assert reopened.speculative.instructions == [GIVEN["capitals"]]
    details = [detail(comp, c.id) for c in comp.speculative.candidates]
    assert all("The reward model explains its score" in d and "explain failed" not in d for d in details)
    assert [detail(reopened, c.id) for c in comp.speculative.candidates] == details
    assert facts(reopened) == facts(comp) and facts(comp).violation_pruned  # the gallery's story checks

    run_id = replays.SHARES.put(comp.to_json())
    shared = replays.open_link(f"run={run_id}", "curves")
    assert shared["detail"] == detail(comp, tables.first_pruned(comp))
    assert "instructions: english capital" in shared["source"]

    def verdicts(page: str) -> list[str]:
        return [part.split("</ul>")[0] for part in page.split('<ul class="sbon-explain">')[1:]]
    exported = Path(replays.on_page_export(reopened, "a saved run")["page_file"]).read_text(encoding="utf-8")
    judged = IFEvalReward().with_instructions(comp.speculative.prompt, [GIVEN["capitals"]])  # as the run was judged
    assert verdicts(exported) and verdicts(exported) == verdicts(replays.page_export.page_html(comp, reward=judged))

    before = json.loads(comp.to_json())
    for run in ("bon", "sbon"):
        del before[run]["instructions"]
    assert Comparison.from_dict(before).speculative.instructions == []  # a file saved before: loads, explains by the shipped prompts
    before["sbon"]["instructions"] = [{"id": "punctuation:no_semicolon"}]
    with pytest.raises(app.SBoNError, match=r"not a saved comparison: sbon.instructions\[0\]: unknown IFEval instruction"):
        Comparison.from_dict(before)
