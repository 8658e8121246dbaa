"""The app's handlers as plain functions (no browser): what each returns, by page element name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sbon.comparison import Comparison

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def app():
    """The app module; importing it sets torch's thread count for a server, so put it back."""
    import torch

    threads = torch.get_num_threads()
    import app as module
    torch.set_num_threads(threads)
    return module


def test_showing_the_recorded_run_fills_every_view(app):
    shown = app.show_recorded("heatmap")
    assert set(shown) == set(app.SHOWN)
    comp = shown["comparison"]
    assert isinstance(comp, Comparison) and comp.sbon.decision_points
    assert "recorded run" in shown["source"] and shown["status"] == ""
    assert shown["decision_point"].value == comp.sbon.decision_points[0].round
    assert shown["tradeoff_plot"].data[0].type == "heatmap"  # the kind the page asked for


def test_a_bad_setting_stops_the_run_in_one_line_before_any_model_loads(app, monkeypatch):
    monkeypatch.setattr(app.MODELS, "load_async", lambda *a: pytest.fail("no model may load for bad settings"))
    values = dict(zip(app.SETTING_NAMES, [app.DEFAULTS.to_dict()[name] for name in app.SETTING_NAMES]))
    values.update(prompt="What is Atlantis?", alpha=1.0)
    updates = list(app.on_run(*values.values(), "curves"))
    assert len(updates) == 1
    assert updates[0]["status"].startswith("⚠ alpha") and "\n" not in updates[0]["status"]
    assert updates[0]["running"] is None and updates[0]["stop_btn"].visible is False


def test_each_method_shows_its_own_knobs(app):
    rounds, tau = app.on_method("sbon"), app.on_method("sbon-tau")
    assert rounds["kv_budget"].visible and rounds["first_decision"].visible and not rounds["tau"].visible
    assert tau["tau"].visible and not tau["kv_budget"].visible and not tau["first_decision"].visible


def test_every_control_sets_a_run_setting_and_defaults_pass_the_checks(app):
    fields = app.DEFAULTS.to_dict()
    assert set(app.SETTING_NAMES) <= set(fields)
    settings = app.settings_from([fields[name] or ("Hi" if name == "prompt" else 0) for name in app.SETTING_NAMES])
    assert settings.config() == app.DEFAULTS.config()


def test_a_tuning_result_loads_and_puts_its_setting_in_the_controls(app, tmp_path):
    tune = tmp_path / "tune.json"
    tune.write_text(json.dumps({
        "experiment": "tune", "generator": "smollm2-135m", "reward": "minilm-pref", "prompts": 10, "floor": 98.0,
        "run_config": {"method": "sbon-tau", "n": 32, "tau": 16, "alpha": 0.8, "first_decision": 16,
                       "prune_by": "reward", "max_new_tokens": 128},
        "per_signal": {"reward": {"t": 16, "alpha": 0.8, "normalized_score": 98.4, "token_speedup": 3.39,
                                  "winner_kept": 0.6, "kendall": 0.25}, "deepconf": None}}))
    shown = app.on_tune_upload(str(tune))
    assert "α = 0.8" in shown["tune_summary"] and shown["use_tuned"].visible
    table = shown["tune_table"].set_index("signal")
    assert table.loc["reward", "token speedup"] == 3.39 and table.loc["deepconf", "winner kept"] == "never reached the floor"
    settings = app.on_use_tuned(shown["tuning"])
    assert settings == {"method": "sbon-tau", "alpha": 0.8, "tau": 16, "prune_by": "reward", "n": 32,
                        "max_new_tokens": 128, "first_decision": 16}
    app.settings_from([{**app.DEFAULTS.to_dict(), "prompt": "Hi", **settings}[name] or 0
                       for name in app.SETTING_NAMES])  # the tuned setting passes the page's checks

    recorded = app.on_tune_upload(str(ROOT / "assets" / "recorded_run.json"))
    assert recorded["tune_summary"].startswith("⚠ could not read that file: not a tuning result")
    assert recorded["use_tuned"].visible is False
