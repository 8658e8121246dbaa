"""The explorer's figure, table and live-view builders, on data from a real small run."""

import json
import html
import math
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest

from components import figures, tables
from components.controls import RunSettings, load_examples
from components.fates import FINISHED_EARLY, SURVIVED, fate_color
from components.live import LiveTracker
from components.model_cache import ModelCache
from components.rounds import COST_NAME, RETIRED_NAME, round_figure, round_views, rounds_animation
from sbon.analysis.comparison import Comparison
from sbon.config import RunConfig
from sbon.analysis.counterfactual import partial_final_stats, tradeoff_grid
from sbon.errors import SBoNError
from sbon.metrics import correlations

RECORDED = "assets/recorded_run.json"


def _points(fig: go.Figure) -> int:
    """Marks of candidates: traces named by a fate (not the cost ring or the shape keys)."""
    return sum(len(t.x) for t in fig.data if t.mode == "markers" and (t.name.startswith(("pruned in", SURVIVED,
                                                                                         FINISHED_EARLY))))


# -- Figure 2 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("round", [1, 2])
def test_scatter_has_one_point_per_contender_and_the_correlations(comparison, round):
    point = comparison.speculative.decision_points[round - 1]
    fig = figures.partial_final_scatter(comparison, round)
    assert _points(fig) == len(point.contenders)
    fates = {comparison.speculative.fate(c.id) for c in comparison.speculative.candidates}
    for trace in fig.data:
        if trace.name in fates:
            assert trace.marker.color == fate_color(trace.name)
        else:  # the cost ring and the shape keys: legend entries only where marks of theirs are drawn
            assert trace.name in (COST_NAME, "partial reward", "finished: final reward")
    # y is the final reward, from Best-of-N for the pruned
    ys = sorted(y for t in fig.data if t.name in fates for y in t.y)
    assert ys == pytest.approx(sorted(comparison.final_reward(k) for k in point.contenders))
    live = [k for k in point.contenders if comparison.speculative.candidates[k].partial_reward_at(round) is not None]
    corr = correlations([comparison.speculative.candidates[k].partial_reward_at(round) for k in live],
                        [comparison.final_reward(k) for k in live])
    title = fig.layout.title.text
    assert f"Pearson {corr['pearson']:.2f}" in title and f"Kendall {corr['kendall']:.2f}" in title
    assert fig.layout.shapes[0].x0 == pytest.approx(point.cut)  # the cut


def test_scatter_without_decision_points_says_why(comparison):
    fig = figures.partial_final_scatter(comparison, 99)
    assert "No decision point" in fig.layout.annotations[0].text
    assert figures.decision_point_choices(comparison) == [
        (f"round {p.round} · after {p.tokens} tokens", p.round) for p in comparison.speculative.decision_points]


def test_hover_text_is_escaped(comparison):
    assert figures.snippet("<b>bold</b>\nnext") == "&lt;b&gt;bold&lt;/b&gt; ⏎ next"
    assert figures.snippet("x" * 200).endswith("…") and len(figures.snippet("x" * 200)) == 90


# -- rounds -----------------------------------------------------------------------------------------

def test_round_views_are_the_decision_points_as_recorded(comparison):
    """Each decision point carries the score every contender was ranked by; the views draw exactly that."""
    views = round_views(comparison.speculative)
    assert [v.round for v in views] == [1, 2]
    for p in views:
        scores = p.score_of()
        assert set(scores) == set(p.contenders) and p.signal == "reward"
        assert min(scores[k] for k in p.survivors) == pytest.approx(p.cut)
        assert all(scores[k] < p.cut or scores[k] == pytest.approx(p.cut) for k in p.pruned + p.retired)
        for k in p.contenders:  # live contenders by their partial reward, finished ones by their final reward
            c = comparison.speculative.candidates[k]
            assert scores[k] == (c.final_reward if k in p.final else c.partial_reward_at(p.round))


def test_live_tracker_builds_the_same_frames_as_the_replay(comparison_events, comparison):
    tracker = LiveTracker(24, reward="likelihood")
    new_rounds = [tracker.update(e) for e in comparison_events]
    assert sum(new_rounds) == 2 and tracker.first_round_at is not None
    replay = Comparison.from_json(comparison.to_json())  # a saved run replays the same frames
    assert tracker.views == round_views(replay.speculative) == round_views(comparison.speculative)
    assert tracker.status().startswith("Done in")


def test_runs_saved_before_decision_points_carried_scores_still_load():
    """The recorded run shipped before decision points carried their scores: scores are derived on load."""
    old = Comparison.load(Path(__file__).parent / "data" / "recorded_run_v1.json")
    for p in old.speculative.decision_points:
        assert len(p.scores) == len(p.contenders)
        for k, score in p.score_of().items():
            c = old.speculative.candidates[k]
            assert score == (c.final_reward if k in p.final else c.partial_reward_at(p.round))
    survived, pruned, cut = round_figure(old.speculative.decision_points[0], old.n).data[:3]
    assert max(pruned.x) < cut.x[0] <= min(survived.x)  # drawn from the derived scores, each on its side


def test_a_round_figure_s_legend_keys_each_fate_with_a_partial_reward_s_circle_where_it_has_one():
    """Plotly's legend draws a trace's first marker, and the shape keys say a circle is a partial reward: a fate
    whose first candidate had finished would be keyed with a diamond, the final reward's shape. Each recorded
    decision point is drawn as it is and with the finished candidates first in each of its lists (the run's order
    of them is its own)."""
    from dataclasses import replace

    from components.style import PARTIAL_SYMBOL

    mixed = 0
    for path in [Path(RECORDED), *sorted(Path("assets/gallery").glob("*.json"))]:
        if path.name == "index.json":
            continue
        comp = Comparison.load(path)
        for point in comp.speculative.decision_points:
            first = {name: sorted(getattr(point, name), key=lambda k: k not in point.final)
                     for name in ("survivors", "pruned", "retired")}
            for drawn in (point, replace(point, **first)):
                for trace in round_figure(drawn, comp.n, reward=comp.speculative.reward).data[:4]:
                    symbols = trace.marker.symbol if trace.mode == "markers" else None
                    if isinstance(symbols, (list, tuple)) and PARTIAL_SYMBOL in symbols:
                        assert symbols[0] == PARTIAL_SYMBOL, (path.name, point.round, trace.name)
                        mixed += len(set(symbols)) > 1
    assert mixed >= 4  # fates that hold both shapes were drawn, both ways round


def test_live_status_names_the_phase(comparison_events):
    tracker, seen = LiveTracker(24, reward="likelihood"), set()
    for e in comparison_events:
        tracker.update(e)
        seen.add(tracker.status().split("**")[1] if "**" in tracker.status() else tracker.status().split()[0])
    assert {"Speculative Rejection (memory-budget rounds)", "Best-of-N", "Preparing the what-if views", "Done"} <= seen


def test_round_figure_and_animation(comparison):
    views = round_views(comparison.speculative)
    fig = round_figure(views[0], comparison.n)
    assert [t.name for t in fig.data][:3] == ["survived", "pruned", "cut"] and fig.data[3].name == RETIRED_NAME
    assert list(fig.data[2].x) == [views[0].cut] * 2
    assert "Waiting" in round_figure(None, 6).layout.title.text
    anim = rounds_animation(comparison.speculative)
    per = len(anim.data) // 2
    assert per == 9 and not any(t.visible for t in anim.data[per:])
    steps = anim.layout.sliders[0].steps
    assert [s.label for s in steps] == ["1", "2"]
    assert not any(steps[1].args[0]["visible"][:per]) and "Round 2" in steps[1].args[1]["title.text"]
    # every legend entry shown in a round has marks drawn in that round
    for i, step in enumerate(steps):
        for t, shown in zip(anim.data, step.args[0]["showlegend"]):
            assert not shown or (t.x is not None and len(t.x) > 0)
    second = rounds_animation(comparison.speculative, active=1)
    assert second.layout.sliders[0].active == 1 and "Round 2" in second.layout.title.text
    assert rounds_animation(comparison.speculative, active=9).layout.sliders[0].active == 1  # clamped


# -- candidates ----------------------------------------------------------------------------------------

def test_candidates_table(comparison):
    df = tables.candidates_table(comparison)
    assert list(df.candidate) == list(range(comparison.n))
    assert {"fate", "round pruned", "tokens", "tokens in Best-of-N", "final reward", "text"} <= set(df.columns)
    assert [c for c in df.columns if c.startswith("score in round")] == [
        tables.partial_column(p) for p in comparison.speculative.decision_points]
    for (_, row), c in zip(df.iterrows(), comparison.speculative.candidates):
        assert row["tokens"] == c.tokens_generated and row["text"] == c.text
        assert row["final from"] == ("Best-of-N" if c.pruned_round else "this run")
    assert not df["final reward"].isna().any()


def test_candidate_detail_highlights_generated_and_never_generated(comparison):
    k = tables.first_pruned(comparison)
    assert comparison.speculative.candidates[k].pruned_round is not None
    page = tables.candidate_detail_html(comparison, k)
    assert 'class="sbon-generated"' in page and 'class="sbon-never"' in page
    assert f"pruned in round {comparison.speculative.candidates[k].pruned_round}" in page
    survivor = comparison.speculative.best_id
    assert 'class="sbon-never"' not in tables.candidate_detail_html(comparison, survivor)
    assert "Pick a candidate" in tables.candidate_detail_html(comparison, -1)


def test_model_text_is_escaped(comparison):
    d = comparison.to_dict()
    k = tables.first_pruned(comparison)
    evil = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    d["sbon"]["candidates"][k]["text"] = evil
    d["bon"]["candidates"][k]["text"] = evil + "</div><b>more</b>"
    comp = Comparison.from_dict(d)
    page = tables.candidate_detail_html(comp, k)
    assert "<img" not in page and "<script" not in page and "<b>more" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert tables.candidates_table(comp).text[k] == evil  # plain string: the table shows it as text


def test_run_description_escapes_what_came_from_a_file(comparison):
    assert tables.md_escape("*bold* <img src=x> [a](b) it's") == "\\*bold\\* &lt;img src=x&gt; \\[a\\](b) it's"
    d = comparison.to_dict()
    for run in ("bon", "sbon"):
        d[run]["prompt"] = "<script>x</script> **loud**"
    line = tables.run_description(Comparison.from_dict(d), "uploaded file a_b.json")
    assert "<script>" not in line and "&lt;script&gt;" in line and "\\*\\*loud\\*\\*" in line
    assert "a\\_b\\.json" in line and "N=6" in line
    assert tables.md_escape("see https://x.org or a@b.c") == "see https\\://x\\.org or a\\@b\\.c"  # no autolinks


# -- savings and trade-off --------------------------------------------------------------------------

def test_savings(comparison):
    m = comparison.metrics
    df = tables.savings_table(comparison)
    rows = dict(zip(df.iloc[:, 0], df.iloc[:, 2]))
    assert rows["tokens generated"] == str(m["sbon_tokens"]) and rows[tables.SPEEDUP] == f"{m['speedup']:.2f}×"
    assert rows["sequential decode steps"] == str(comparison.speculative.decode_steps)
    bars = figures.tokens_per_candidate(comparison)
    assert sum(bars.data[0].y) == m["bon_tokens"] and sum(sum(t.y) for t in bars.data[1:]) == m["sbon_tokens"]
    # one legend entry per colour: each Speculative Rejection trace is one fate, in that fate's colour
    for t in bars.data[1:]:
        fate = t.name
        assert t.marker.color == fate_color(fate) and all(comparison.speculative.fate(k) == fate for k in t.x)
    times = figures.phase_times(comparison)
    assert sum(sum(t.x) for t in times.data) == pytest.approx(comparison.bon.wall_time + comparison.speculative.wall_time)
    assert "Speculative Rejection returned" in tables.headline(comparison)
    bon_label, bon_text, sbon_label, sbon_text = tables.returned_texts(comparison)
    assert bon_text == comparison.bon.best.text and f"candidate {comparison.speculative.best_id}" in sbon_label


def test_tradeoff(comparison):
    grid = figures.tradeoff_table(comparison)
    expected = tradeoff_grid(comparison.bon, comparison.partials, figures.ALPHAS)
    assert grid.equals(expected)
    curves = figures.tradeoff_figure(comparison, "curves")
    assert [t.name for t in curves.data] == ["τ=4", "τ=8", "τ=16", "this run"]
    heat = figures.tradeoff_figure(comparison, "heatmap")
    assert len(heat.data[0].z) == 3 and len(heat.data[0].z[0]) == len(figures.ALPHAS)
    stats = tables.correlation_table(comparison)
    assert list(stats["decision token τ"]) == list(partial_final_stats(comparison.bon, comparison.partials).tau)
    empty = Comparison(comparison.bon, comparison.speculative, {})
    assert "No prefix of Best-of-N's candidates was scored" in figures.tradeoff_figure(empty).layout.annotations[0].text
    assert tables.correlation_table(empty).empty


# -- fates, settings, examples, model cache ------------------------------------------------------------------

def test_fates(comparison):
    names = {comparison.speculative.fate(c.id) for c in comparison.speculative.candidates}
    assert SURVIVED in names and "pruned in round 1" in names
    assert fate_color(SURVIVED) != fate_color(FINISHED_EARLY) != fate_color("pruned in round 1")
    assert fate_color("pruned in round 1") != fate_color("pruned in round 2")


def test_settings_coerce_and_check():
    s = RunSettings.from_inputs(prompt="hi", n=8.0, alpha=0.25, max_new_tokens=32.0, seed=3, kv_budget=0.0,
                                first_decision=0, prune_by="logprob")
    assert (s.n, s.max_new_tokens, s.seed) == (8, 32, 3)
    s.check()
    config = s.config()
    assert type(config) is RunConfig and config.kv_budget is None and config.first_decision is None  # 0: automatic
    assert (config.n, config.alpha, config.prune_by) == (8, 0.25, "logprob")
    for values, message in [
        (dict(prompt="  "), "prompt is empty"),
        (dict(prompt="hi", n=0), "N must be at least 1"),
        (dict(prompt="hi", n=2.5), "whole number"),
        (dict(prompt="hi", n=None), "^N is empty"),
        (dict(prompt="hi", alpha=1.0), "alpha"),
        (dict(prompt="hi", method="sbon-tau", tau=64, max_new_tokens=64), "τ=64 .* must be below"),
        (dict(prompt="hi", method="bon"), "unknown method"),
        (dict(prompt="hi", generator="no-such-model"), "unknown generator"),
        (dict(prompt="hi", top_p=0), "top-p"),
        (dict(prompt="hi", n=10_000), "more than this app runs"),
        (dict(prompt="hi", temperature="warm"), "must be a number"),
        (dict(prompt="hi", kv_budget=-5), "the KV budget must be a positive number"),
        (dict(prompt="hi", prune_by="vibes"), "vibes"),
        (dict(prompt="hi", seed=-5), "the seed must be a whole number of at least 0"),
        (dict(prompt="hi", seed=99999999999999999999), "the seed must be at most 2,147,483,647"),
        (dict(prompt="hi", max_new_tokens=1), "max new tokens=1 leaves no room for a decision point"),
        (dict(prompt="hi", max_new_tokens=None), "^max new tokens is empty"),
        (dict(prompt="hi", first_decision=200, max_new_tokens=64), r"the first decision point \(200 tokens\) must come before"),
    ]:
        with pytest.raises(SBoNError, match=message):
            RunSettings.from_inputs(**values).check()


def test_examples_carry_a_content_note_on_harmful_prompts():
    examples = load_examples()
    assert len(examples) >= 6
    assert {e.source for e in examples} == {"alpaca_eval", "hh-rlhf"}
    noted = [e for e in examples if e.content_note]
    assert noted and all(e.source == "hh-rlhf" and e.label.startswith("⚠") for e in noted)
    # a harmless prompt from the red-teaming data set is not called harmful
    assert all("harmful" not in e.label and "⚠" not in e.label for e in examples if not e.content_note)
    assert any(e.source == "hh-rlhf" and not e.content_note for e in examples)


def test_model_cache_loads_once_per_name_and_device(monkeypatch):
    import components.model_cache as mc

    monkeypatch.setattr(mc, "_warm_up", lambda gen: None)
    loads = []
    cache = ModelCache(size=2, load_gen=lambda name, device: loads.append(("gen", name)) or f"G:{name}",
                       load_rew=lambda name, generator, device: loads.append(("rew", name)) or f"R:{name}:{generator}")
    assert cache.get("a", "likelihood") == ("G:a", "R:likelihood:G:a")
    assert cache.get("a", "likelihood") == ("G:a", "R:likelihood:G:a") and len(loads) == 2
    assert cache.is_loaded("a", "likelihood") and not cache.is_loaded("b", "likelihood")
    cache.get("b", "likelihood")  # the likelihood reward is one per generator
    assert loads[-2:] == [("gen", "b"), ("rew", "likelihood")]
    cache.get("c", "rm")
    assert not cache.is_loaded("a", "likelihood")  # least recently used went first


def test_recorded_run_ships_and_replays():
    comp = Comparison.load(RECORDED)
    assert 16 <= comp.n <= 32 and comp.speculative.decision_points and comp.partials
    for build in (lambda: figures.partial_final_scatter(comp, 1), lambda: rounds_animation(comp.speculative),
                  lambda: figures.tradeoff_figure(comp), lambda: tables.candidates_table(comp)):
        build()
    assert json.loads(comp.to_json())["format"] == "sbon-comparison/1"
    assert not math.isnan(comp.metrics["normalized_score"])


def test_candidate_detail_of_a_diverged_twin(comparison):
    d = comparison.to_dict()
    k = tables.first_pruned(comparison)
    d["bon"]["candidates"][k]["token_ids"][0] += 1
    page = tables.candidate_detail_html(Comparison.from_dict(d), k)
    assert "twin diverged" in page and 'class="sbon-never"' not in page


# -- a reason for every cut, legible views -----------------------------------------------------------

def test_every_contender_gets_its_rank_score_and_the_cut(comparison):
    from components.reasons import point_reasons

    for point in comparison.speculative.decision_points:
        reasons = point_reasons(point)
        ranked = [r.rank for r in reasons.values() if r.rank is not None]  # finished ones only on the reward's scale
        assert sorted(ranked) == list(range(1, len(ranked) + 1))
        for k in point.pruned:
            r = reasons[k]
            assert r.outcome == "pruned" and r.rank > len(point.survivors) - 1
            assert re.match(rf"rank {r.rank} of {len(ranked)}, -?[\d.]+ [<=] cut -?[\d.]+", r.text())
        for k in point.survivors:
            assert re.search(" [≥=] cut ", reasons[k].text()) and reasons[k].outcome == "kept"
    # the live frame, the replay and the scatter carry the same reason in their hover data
    point = comparison.speculative.decision_points[0]
    k = point.pruned[0]
    text = point_reasons(point)[k].text()
    frame = round_figure(point, comparison.n)
    assert [text] in [list(c) for t in frame.data if t.name == "pruned" for c in t.customdata]
    scatter = figures.partial_final_scatter(comparison, point.round)
    assert any(text in row for t in scatter.data if t.customdata is not None for row in map(list, t.customdata))
    detail = tables.candidate_detail_html(comparison, k)
    assert f"round {point.round} (after {point.tokens} tokens): <b>pruned</b>, {html.escape(text)}" in detail


def test_decimals_follow_the_spread_of_the_values():
    from components.reasons import decimals

    assert decimals([4.0, 6.2, 5.1, 4.4]) == 2  # minilm-pref-like
    assert decimals([-0.045, 0.083, 0.01, 0.02] * 4) == 3  # minilm-pref-nolength-like: two decimals would merge them
    assert decimals([0.5]) == 2 and decimals([]) == 2 and decimals([1e-7, 2e-7]) == 6


def test_a_pruned_candidate_whose_twin_won_is_marked_as_the_cost_of_pruning(comparison):
    from components.reasons import pruning_cost

    k = comparison.speculative.decision_points[0].pruned[0]
    assert pruning_cost(comparison, k) == "" or comparison.bon.candidates[k].final_reward > comparison.speculative.best.final_reward
    d = comparison.to_dict()
    d["bon"]["best_id"] = k  # as if Best-of-N's winner had been pruned
    d["bon"]["candidates"][k]["final_reward"] = max(c["final_reward"] for c in d["bon"]["candidates"]) + 1.0
    comp = Comparison.from_dict(d)
    assert pruning_cost(comp, k) == "its Best-of-N twin is Best-of-N's winner"
    assert pruning_cost(comp, comp.speculative.best_id) == ""  # not pruned: no cost
    ring = [t for t in figures.partial_final_scatter(comp, 1).data if t.name == COST_NAME][0]
    assert len(ring.x) == 1 and ring.showlegend
    assert [t for t in round_figure(comp.speculative.decision_points[0], comp.n, comp=comp).data if t.name == COST_NAME][0].y == (k,)
    assert "The cost of pruning: its Best-of-N twin is Best-of-N" in tables.candidate_detail_html(comp, k)
    assert tables.candidates_table(comp)["cost of pruning"][k].startswith("its Best-of-N twin")


def test_a_reward_that_explains_itself_is_listed_in_the_detail(comparison):
    from types import SimpleNamespace

    class Explaining:
        def explain(self, prompt, response, final):
            return [SimpleNamespace(status="✓", reason=f"answers <{prompt[:5]}>"), SimpleNamespace(status="✗", reason="too short")]

    class Broken:
        def explain(self, prompt, response, final):
            raise RuntimeError("boom")

    k = tables.first_pruned(comparison)
    page = tables.candidate_detail_html(comparison, k, Explaining())
    assert "<b>✓</b> answers &lt;Give &gt;" in page and "<b>✗</b> too short" in page
    assert "explain failed: RuntimeError: boom" in tables.candidate_detail_html(comparison, k, Broken())
    assert "explains its score" not in tables.candidate_detail_html(comparison, k, object())  # no explain: nothing


def test_replay_keeps_pruned_candidates_greyed_on_one_axis(comparison):
    anim = rounds_animation(comparison.speculative, active=1)
    per = len(anim.data) // 2
    second = anim.data[per:]
    earlier = [t for t in second if t.name == "pruned earlier"][0]
    assert set(earlier.y) == set(comparison.speculative.decision_points[0].pruned) and earlier.visible
    drawn = sorted(y for t in second if t.name in ("survived", "pruned", "pruned earlier") or t.name.startswith("retired")
                   for y in t.y)
    assert drawn == sorted(set(comparison.speculative.decision_points[0].contenders))  # all N still drawn in round 2
    lo, hi = anim.layout.xaxis.range
    scores = [s for p in comparison.speculative.decision_points for s in p.scores]
    assert lo < min(scores) and hi > max(scores)
    assert all("xaxis.range" not in s.args[1] for s in anim.layout.sliders[0].steps)  # the axis never rescales


def test_tradeoff_fits_its_data_and_labels_alpha(comparison):
    fig = figures.tradeoff_figure(comparison, "curves")
    scores = [y for t in fig.data for y in t.y]
    lo, hi = fig.layout.yaxis.range
    assert lo <= min(scores) and hi >= max(scores) and (hi - lo) < 1.5 * (max(scores) - min(scores)) + 10
    curves = [t for t in fig.data if t.name.startswith("τ=")]
    drawn = [(x, y) for t in curves for x, y, text, a in zip(t.x, t.y, t.text, t.customdata)
             if text and (text == f"α {a:.1f}" or pytest.fail(f"label {text!r} on the point of α {a}"))]
    assert drawn and all("text" in t.mode for t in curves)
    (x_lo, x_hi), (y_lo, y_hi) = fig.layout.xaxis.range, fig.layout.yaxis.range
    for i, (x, y) in enumerate(drawn):  # no two drawn labels share a cell (the smear along the 100 line)
        assert x_lo + figures.LABEL_CELL[0] / 2 * (x_hi - x_lo) <= x <= x_hi - figures.LABEL_CELL[0] / 2 * (x_hi - x_lo)
        for x2, y2 in drawn[:i]:
            assert (abs(x - x2) / (x_hi - x_lo) >= figures.LABEL_CELL[0]
                    or abs(y - y2) / (y_hi - y_lo) >= figures.LABEL_CELL[1])
    # whether the cell holds a label on a phone is the browser test's (test_no_plot_title_axis_or_legend_is_clipped)


def test_rewards_state_their_scale_and_hub_presets_what_they_need(comparison):
    from components.controls import reward_choices, generator_choices
    from components.reasons import needs_note, reward_scale
    from sbon.models import Preset

    labels = dict((name, label) for label, name in reward_choices())
    assert "mean log-probability per token" in labels["likelihood"] and "≤ 0" in labels["likelihood"]
    assert "needs network + GPU, ~16 GB" in labels["armorm-llama3-8b"] and "needs" not in labels["minilm-pref"]
    assert "needs network + GPU, ~14 GB" in dict((n, l) for l, n in generator_choices())["mistral-7b"]
    assert needs_note(Preset("org/tiny-model-70M", "tiny")) == "needs network"
    assert needs_note(Preset("org/Big-13B", "big")) == "needs network + GPU, ~26 GB"
    assert needs_note(Preset("", "code", offline=True)) == "" and needs_note(Preset("a/b-7B", "x", package="p")) == ""
    scatter = figures.partial_final_scatter(comparison, 1)
    assert reward_scale(comparison.speculative.reward).unit in scatter.layout.xaxis.title.text.replace("<br>", " ")
    assert reward_scale(comparison.speculative.reward).short() in tables.candidate_detail_html(comparison, 0)


def test_every_legend_entry_has_marks_of_its_own(comparison):
    views = round_views(comparison.speculative)
    figs = [figures.partial_final_scatter(comparison, 1), figures.tokens_per_candidate(comparison),
            round_figure(views[-1], comparison.n, earlier=views[:-1], comp=comparison)]
    entries = [t for fig in figs for t in fig.data if t.showlegend is not False and t.visible is not False]
    assert len(entries) >= len(figs)  # every figure has a legend to check
    for t in entries:
        assert t.x is not None and len(t.x) > 0 and any(x is not None for x in t.x), t.name


def test_live_race_has_a_clock_per_method(comparison_events):
    ticks = iter(range(10_000))
    tracker = LiveTracker(24, started=0, clock=lambda: next(ticks), reward="likelihood")
    boards = []
    for e in comparison_events:
        tracker.update(e)
        boards.append(tracker.race(("sbon", "bon")))
    first = boards[0]
    assert "Speculative Rejection" in first and "| Best-of-N | waiting |" in first
    sbon, bon = tracker.clocks["sbon"], tracker.clocks["bon"]
    assert sbon.ended is not None and bon.ended is not None and sbon.ended <= bon.started  # they ran one after the other
    assert sbon.generated == comparison_events[-1].comparison.speculative.total_tokens
    last = boards[-1]
    assert last.count("done ✓") == 2 and f"**{sbon.seconds(0):.1f} s**" in last


def test_normalized_score_never_passes_100_through_float_noise(comparison):
    from sbon.metrics import normalized_score

    assert normalized_score([1.0, 5.0], 5.0 + 1.2e-6) == 100.0  # the same text rescored in another batch
    assert normalized_score([1.0, 5.0], 4.0) == pytest.approx(75.0)
    d = comparison.to_dict()
    best = comparison.bon.best_id
    d["sbon"]["best_id"] = best
    d["sbon"]["candidates"][best]["final_reward"] = comparison.bon.best.final_reward + 3e-7
    d["sbon"]["candidates"][best]["pruned_round"] = None
    d["sbon"]["candidates"][best]["stop_reason"] = "length"
    assert Comparison.from_dict(d).metrics["normalized_score"] == 100.0


def test_a_reward_that_explains_itself_counts_what_each_answer_passes(comparison):
    from types import SimpleNamespace

    class Checks:  # two checks: the answer passes the first, and the second when it is long
        def explain(self, prompt, response, final):
            return [SimpleNamespace(status="pass", reason="a"),
                    SimpleNamespace(status="pass" if len(response) > 40 else "fail", reason="b")]

    text = tables.answers_checked(comparison, Checks())
    assert text.startswith("Best-of-N's answer passes **") and "Speculative Rejection's answer passes **" in text
    assert "of 2**" in text
    assert tables.answers_checked(comparison, object()) == ""  # a reward that does not explain itself


def test_a_run_s_events_are_computed_on_one_thread_and_closing_closes_the_run():
    """Gradio advances a generator from any thread of its pool; torch's CPU thread team belongs to the thread
    that calls torch, so every run's events are computed on the one torch thread (components.torch_thread)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from components.torch_thread import on_one_thread

    seen, closed = [], []

    def run():
        try:
            for i in range(6):
                seen.append(threading.current_thread().name)
                yield i
        finally:
            closed.append(threading.current_thread().name)

    events = on_one_thread(run())
    with ThreadPoolExecutor(4) as pool:  # as Gradio does: each item asked for from some pool thread
        got = [pool.submit(next, events).result() for _ in range(4)]
    events.close()
    assert got == [0, 1, 2, 3] and len(set(seen)) == 1 and seen[0].startswith("sbon-torch")
    assert closed == seen[:1]  # the run was closed, on its own thread
    assert list(on_one_thread(iter([1, 2]))) == [1, 2]

    from components.torch_thread import TORCH_THREAD
    again = on_one_thread(run())
    next(again)
    TORCH_THREAD.submit(again.close).result(timeout=10)  # closed on the torch thread itself: no deadlock
    assert len(closed) == 2


def test_tied_scores_are_drawn_apart_kept_right_of_pruned_and_the_cut_between():
    """Scores equal to many digits (a signal that ties, separated only by the cut's tie-break) would put kept
    and pruned candidates on one spot: they are spread, the pruned left of the cut line, the kept right of it,
    and every hover keeps the true score."""
    from sbon.results import DecisionPoint

    point = DecisionPoint(round=1, tokens=8, contenders=[0, 1, 2, 3, 4, 5], survivors=[5, 4, 3], pruned=[0, 1, 2],
                          cut=0.0, scores=[0.0, 0.0, 0.0, 0.0, 1.0, 2.0])
    fig = round_figure(point, 6)
    survived, pruned, cut = fig.data[0], fig.data[1], fig.data[2]
    kept_x = dict(zip(survived.y, survived.x))
    assert max(pruned.x) < cut.x[0] < kept_x[3] and len(set(pruned.x)) == 3  # apart, and on the right sides
    assert kept_x[4] == 1.0 and kept_x[5] == 2.0  # untied scores stay where they are
    assert all("0.00" in why[0] for why in pruned.customdata)  # the hover says the true score
    assert round_figure(point, 6).data[1].x == pruned.x  # deterministic


def test_a_tie_on_one_side_of_the_cut_is_spread_without_crossing_it():
    """Kept candidates whose scores tie just above the cut (and pruned ones just below it) are drawn apart on
    their own side of the line: a survivor drawn left of the cut would contradict the rule on the screen."""
    from sbon.results import DecisionPoint

    point = DecisionPoint(round=1, tokens=8, contenders=list(range(6)), survivors=[0, 1, 3], pruned=[2, 4, 5],
                          cut=4.979, scores=[4.9791, 4.9800, 4.9500, 4.9800, 4.9490, 3.0])
    survived, pruned, cut = round_figure(point, 6).data[:3]
    assert cut.x[0] == pytest.approx(4.979)
    assert min(survived.x) >= cut.x[0] > max(pruned.x) and len(set(survived.x)) == 3 and len(set(pruned.x)) == 3


@pytest.mark.parametrize("path", [
    "assets/gallery/coin-toss.json",  # three rounds
    RECORDED,  # four rounds: a "pruned in round r" legend row each, one line apiece
])
def test_the_presenter_view_draws_every_text_for_a_hall_and_fits_the_window(path):
    """Look(presenter=True): every text of every figure at least PRESENTER_FONT_PX (CSS px), the legend beside the
    data, the decision-point charts no taller than the window (a long legend may make a tab's chart taller),
    and the live chart exactly the height the window leaves it."""
    from components.style import PRESENTER_FONT_PX, Look

    def last_round(comp, look=Look()):  # the live chart at the end of a run, as the page draws it
        views = comp.speculative.decision_points
        return look.apply(round_figure(views[-1], comp.n, earlier=views[:-1], comp=comp), live=True)

    comp = Comparison.load(path)
    look = Look(presenter=True, screen_px=480, live_px=300)
    figs = [figures.partial_final_scatter(comp), figures.tokens_per_candidate(comp), figures.phase_times(comp),
            figures.tradeoff_figure(comp), rounds_animation(comp.speculative, comp=comp)]
    for fig in map(look.apply, figs):
        sizes = [fig.layout.font.size, fig.layout.legend.font.size]
        sizes += [fig.layout.title.font.size] if fig.layout.title.text else []
        sizes += [t.textfont.size for t in fig.data if getattr(t, "textfont", None) is not None and t.textfont.size]
        assert min(sizes) >= PRESENTER_FONT_PX, (fig.layout.title.text, sizes)
        assert fig.layout.legend.orientation == "v"
    assert all(look.apply(f).layout.height <= 480 for f in (figures.partial_final_scatter(comp),
                                                             rounds_animation(comp.speculative, comp=comp)))
    live = last_round(comp, look)
    assert live.layout.height == 300 and not live.layout.title.text  # the caption above is its title
    page = last_round(comp)
    assert page.layout.legend.orientation == "h" and page.layout.legend.yanchor == "top"  # under the data


@pytest.mark.parametrize("path", [RECORDED, "assets/gallery/coin-toss.json"])
def test_a_round_s_title_wrapped_again_keeps_its_clauses_apart_and_each_slider_step_s_title_fits(path):
    """A round figure's title is wrapped for a phone, and the presenter view wraps it again for a hall: joined again,
    the round's line and its counts stay two clauses ("after 51 tokens · 10 of 13 kept", not "after 51 tokens 10 of
    13 kept"). The rounds slider sets each round's own title as it moves: the presenter view wraps those too, and the
    top margin holds the longest of them (a round with more clauses than the one shown first ran into the data)."""
    from components.style import LINE_PX, PRESENTER_TITLE_CHARS, Look, scale_of, unwrap

    comp = Comparison.load(path)
    views = round_views(comp.speculative)
    hall = Look(presenter=True, screen_px=480)
    for view in views:
        page = round_figure(view, comp.n, reward=comp.speculative.reward).layout.title.text
        wide = hall.apply(round_figure(view, comp.n, reward=comp.speculative.reward)).layout.title.text
        assert unwrap(wide) == unwrap(page) and f"after {view.tokens} tokens · " in unwrap(wide)
        assert wide.count("<br>") < page.count("<br>")  # a hall's lines are longer
    for look in (Look(), hall):
        fig = look.apply(rounds_animation(comp.speculative, comp=comp))
        titles = [step.args[1]["title.text"] for step in fig.layout.sliders[0].steps]
        assert [unwrap(t) for t in titles] == [unwrap(round_figure(v, comp.n, reward=comp.speculative.reward)
                                                      .layout.title.text) for v in views]
        if look.presenter:
            assert all(len(line) <= PRESENTER_TITLE_CHARS for t in titles for line in t.split("<br>"))
        lines = max(t.count("<br>") + 1 for t in titles)
        assert fig.layout.margin.t >= lines * LINE_PX * scale_of(fig), (look, titles)


def test_the_live_chart_s_title_takes_the_width_the_browser_reported():
    """On the page, the live chart's title is wrapped to the chart's width the browser reported, not a phone's, where
    that saves a line (three lines of a phone's width on a desktop took the data's height); on a phone-wide chart, or
    where no width was reported, the phone's lines. Every line fits that width (TITLE_CHARS fit a phone-wide plot)."""
    from components.style import TITLE_CHARS, Look, unwrap

    comp = Comparison.load(RECORDED)
    views = comp.speculative.decision_points

    def title(look):
        fig = look.apply(round_figure(views[-1], comp.n, earlier=views[:-1], comp=comp, reward=comp.speculative.reward),
                         live=True)
        return fig.layout.title.text, fig.layout.margin.t

    (phone, phone_top), (desktop, desktop_top) = title(Look(width_px=360)), title(Look(width_px=700))
    assert title(Look()) == title(Look(width_px=360)) and phone.count("<br>") == 2
    assert unwrap(desktop) == unwrap(phone) and desktop.count("<br>") < phone.count("<br>")
    assert desktop_top < phone_top  # the line saved goes to the data
    assert all(len(line) <= Look(width_px=700).title_chars() for line in desktop.split("<br>"))
    assert Look(width_px=700).title_chars() > 2 * TITLE_CHARS - 10 and Look(presenter=True, width_px=700).title_chars() == TITLE_CHARS


def test_a_tab_s_figures_take_the_width_the_browser_reported_for_their_titles_too():
    """A tab's figures span the page, at least the live chart's width: on a desktop their titles, and the titles the
    rounds slider sets, take lines of that width where that saves one (a phone's three lines in a desktop figure's
    corner), with the same words, and the line saved goes to the data; on a phone or unreported, a phone's lines."""
    from components.style import Look, unwrap
    from components.views import Shown, show

    comp = Comparison.load(RECORDED)

    def drawn(look):
        views = show(Shown(comp, "a run", look=look))
        return {name: v for name, v in views.items() if isinstance(v, go.Figure) and name != "live_plot"}

    def titles(fig):
        steps = [step.args[1]["title.text"] for slider in fig.layout.sliders or () for step in slider.steps]
        return [t for t in (fig.layout.title.text, *steps) if t]

    phone, desktop, unreported = drawn(Look(width_px=360)), drawn(Look(width_px=700)), drawn(Look())
    assert phone.keys() == desktop.keys() >= {"scatter", "rounds_plot", "tradeoff_plot"}
    saved = []
    for name, fig in desktop.items():
        assert titles(phone[name]) == titles(unreported[name]), name
        assert [unwrap(t) for t in titles(fig)] == [unwrap(t) for t in titles(phone[name])], name
        assert all(len(line) <= Look(width_px=700).title_chars() for t in titles(fig) for line in t.split("<br>")), name
        lines = sum(t.count("<br>") for t in titles(fig))
        assert lines <= sum(t.count("<br>") for t in titles(phone[name])), name
        if lines < sum(t.count("<br>") for t in titles(phone[name])):
            saved.append(name)
            assert fig.layout.margin.t < phone[name].layout.margin.t, name
    assert {"scatter", "rounds_plot"} <= set(saved), saved


def test_text_drawn_as_a_figure_wraps_by_the_font_the_browser_measured():
    """The browser reports the mean character width of the font it draws the figures in (VIEWPORT_JS's char_em): a
    narrow font fits more characters per line of the result step's answers and of the live chart's title than the
    upper bound used where nothing was measured; a value no font has is not taken."""
    from components.rounds import ANSWER_MAX_CHARS, answers_figure
    from components.style import Look

    window = {"screen": 480, "live": 300, "width": 853}
    unmeasured = Look(presenter=True).sized(window)
    narrow, wide = (Look(presenter=True).sized({**window, "char_em": em}) for em in (0.44, 0.6))
    assert wide.chars() < unmeasured.chars() < narrow.chars() <= 853 / (0.44 * 16 * 4 / 3)
    assert Look(presenter=True).sized({**window, "char_em": 7}) == unmeasured
    assert Look(width_px=700, char_em=0.44).title_chars() > Look(width_px=700).title_chars()
    comp = Comparison.load(RECORDED)

    def answer_lines(chars):  # Best-of-N's answer, under its label
        return answers_figure(comp, chars).layout.annotations[0].text.split("<br>")[1:]

    assert max(map(len, answer_lines(narrow.chars()))) > max(map(len, answer_lines(unmeasured.chars())))
    assert all(len(line) <= min(ANSWER_MAX_CHARS, narrow.chars()) + 2 for line in answer_lines(narrow.chars()))  # + " …"


def test_the_presenter_view_s_live_chart_names_its_x_axis_in_one_line_where_its_rows_leave_room():
    """At the end of a run the legend beside the live chart is at its widest: the x-axis title that no longer fits
    in one line beside it loses its aside in brackets (the reward's scale), not its name."""
    from components.style import Look

    comp = Comparison.load(RECORDED)
    views = comp.speculative.decision_points
    page = round_figure(views[-1], comp.n, earlier=views[:-1], comp=comp, reward=comp.speculative.reward)
    assert page.layout.xaxis.title.text.replace("<br>", " ").startswith("score at the decision point (")
    live = Look(presenter=True, screen_px=480, live_px=420).apply(page, live=True)
    assert live.layout.xaxis.title.text == "score at the decision point"


def test_captions_tell_each_round_from_the_run_s_data():
    from components.rounds import run_captions

    comp = Comparison.load(RECORDED)
    captions = run_captions(comp)
    assert len(captions) == len(comp.speculative.decision_points)
    for caption, point in zip(captions, comp.speculative.decision_points):
        assert caption.startswith(f"Round {point.round} of {len(captions)} · after {point.tokens} tokens · "
                                  f"{len(point.survivors)} of {len(point.contenders)} kept · ")
        alive = comp.bon.best_id in point.survivors
        assert ("Best-of-N's pick still in" in caption) == alive


def test_a_long_step_sends_heartbeats_so_the_page_can_show_it_is_working():
    """on_one_thread(heartbeat_s=...): None whenever no event came for that long (a reward's pass over every
    answer), every event still in order; without it, only the events (the screen never stands still)."""
    import threading

    from components.torch_thread import on_one_thread

    beats = threading.Event()

    def events():
        yield "first"
        assert beats.wait(timeout=30), "no heartbeat came while the step ran"  # a long step: until two heartbeats
        yield "second"

    items = []
    for item in on_one_thread(events(), heartbeat_s=0.05):
        items.append(item)
        # (a heartbeat may also come before the first event, where the thread starts slowly on a busy machine)
        if "first" in items and items[items.index("first"):].count(None) == 2:
            beats.set()
    assert [i for i in items if i is not None] == ["first", "second"]
    assert items[items.index("first"):items.index("second")].count(None) >= 2  # the heartbeats of the long step
    assert list(on_one_thread(events())) == ["first", "second"]  # no heartbeat_s: only the events


def test_best_of_n_s_progress_frames_are_the_figure_drawn_from_scratch_at_every_step():
    """ProgressChart changes only Best-of-N's bars and the title between frames (a figure from scratch costs the
    run a core's slice at every frame); each frame must still be exactly what progress_figure draws, in the
    page's look and the presenter view's, including when the title's growing numbers wrap onto another line."""
    from components.live import ProgressChart, progress_figure
    from components.style import Look

    comp = Comparison.load(RECORDED)
    for look in (Look(), Look(width_px=700), Look(presenter=True, live_px=600)):
        tracker, chart = LiveTracker(comp.speculative.settings["max_new_tokens"], reward=comp.speculative.reward), ProgressChart(comp.n, look)
        tracker.results["sbon"] = comp.speculative
        frames = []  # (the figure, its title's lines)
        for tokens in (1, 7, 60, 99, 128):
            tracker.tokens_of["bon"] = {k: tokens for k in range(comp.n) if k % 3 or tokens > 7}
            frame = chart.frame(tracker)
            assert frame.to_json() == look.apply(progress_figure(tracker, comp.n), live=True).to_json(), tokens
            frames.append((frame, (frame.layout.title.text or "").count("<br>")))
        # drawn once, then changed in place, while the title keeps its lines (the margins fit them)
        kept = [b is a for (a, lines), (b, more) in zip(frames, frames[1:]) if lines == more]
        assert kept and all(kept), look


def test_every_figure_lists_the_fates_in_one_order_survived_then_pruned_round_by_round():
    """A legend names the fates in components.fates.fate_order (survived, finished early, then pruned round by round),
    in every figure of a shown run and in Best-of-N's progress frames, where the recording's first candidates were
    pruned in rounds 1, 3 and 2 (their first appearance drew "pruned in round 3" before "pruned in round 2")."""
    from components import views
    from components.fates import fate_order
    from components.live import LiveTracker, progress_figure

    comp = Comparison.load(RECORDED)
    first_seen = list(dict.fromkeys(comp.speculative.fate(k) for k in range(comp.n)))
    assert first_seen != fate_order(set(first_seen))  # the order a candidate loop meets them is not the legend's
    tracker = LiveTracker(int(comp.speculative.settings["max_new_tokens"]), reward=comp.speculative.reward)
    tracker.results["sbon"] = comp.speculative
    figs = [f for f in views.show(views.Shown(comp, "recorded")).values() if isinstance(f, go.Figure)]
    checked = 0
    for fig in [*figs, progress_figure(tracker, comp.n)]:
        named = [m.group(1) for t in fig.data if t.showlegend is not False and t.name
                 and (m := re.search(r"(survived|finished early|pruned in round \d+)$", t.name))]
        if len(set(named)) > 2:
            assert list(dict.fromkeys(named)) == fate_order(set(named)), (fig.layout.title.text, named)
            checked += 1
    assert checked >= 2  # the progress frames and at least one view of the run


def test_outline_marks_are_drawn_in_a_colour_plotly_strokes():
    """Plotly strokes an open symbol ("square-open", "circle-open") in ``marker.color`` and does not use
    ``marker.line.color`` for it: a transparent marker colour drew no undecided squares and no pruning-cost rings."""
    import plotly.graph_objects as go

    from components import views
    from components.live import LiveTracker, progress_figure

    from components.reasons import marked_undecided

    comp = Comparison.load(Path(RECORDED).parent / "gallery" / "early-violation.json")
    assert any(marked_undecided(p) for p in comp.speculative.decision_points)  # the recording has undecided marks to draw
    shown = views.show(views.Shown(comp, "recorded"))
    tracker = LiveTracker(int(comp.speculative.settings["max_new_tokens"]), reward=comp.speculative.reward)
    tracker.results["sbon"] = comp.speculative
    figs = [f for f in shown.values() if isinstance(f, go.Figure)] + [progress_figure(tracker, comp.n)]
    traces = [t for f in figs for t in (*f.data, *(t for fr in f.frames or () for t in fr.data))]
    outlined = [t for t in traces if isinstance(getattr(getattr(t, "marker", None), "symbol", None), str)
                and t.marker.symbol.endswith("-open") and t.y is not None and len(t.y)]
    assert outlined  # the outline marks this run draws
    for t in outlined:
        color = t.marker.color
        assert isinstance(color, str) and color != "rgba(0,0,0,0)" and color != "transparent", (t.name, color)


def test_tick_labels_read_as_plain_numbers_in_chromium_even_for_scores_of_ten_thousandths(browser):
    """Plotly writes small numbers with SI prefixes by default ("550µ" for 0.00055: the instruction reward's
    tie-break when no candidate can still follow its instructions). The page's figures, drawn in Chromium by plotly's
    own script, label their ticks as plain decimals: a run's every figure, and a chart of scores that small."""
    from components.style import styled
    from components.views import Shown, show

    tiny = styled(go.Figure(go.Scatter(x=[0.00055, 0.0006, 0.0008], y=[3, 1, 2], mode="markers")), "scores")
    shown = show(Shown(Comparison.load(RECORDED), "a run"))
    drawn = [v for v in shown.values() if isinstance(v, go.Figure)] + [tiny]
    # one page, plotly's script once: each figure in its own div
    html = "".join(fig.to_html(include_plotlyjs=i == 0, full_html=False, div_id=f"fig{i}") for i, fig in enumerate(drawn))
    page = browser.new_page()
    try:
        page.set_content(f"<html><body>{html}</body></html>")
        page.wait_for_function(f"document.querySelectorAll('.main-svg').length >= {len(drawn)}")
        labels = [page.locator(f"#fig{i} .xtick text, #fig{i} .ytick text").all_text_contents()
                  for i in range(len(drawn))]
    finally:
        page.close()
    assert len(drawn) >= 7 and all(labels), labels
    assert {"0.0006", "0.0008"} <= set(labels[-1]), labels[-1]
    si = [t for ticks in labels for t in ticks if re.fullmatch(r"[−-]?[\d.]+[µmkMG]", t)]
    assert not si, si


def test_every_figure_of_a_shown_run_is_drawn_on_the_page_s_template(comparison):
    """The page's figures, in its own look and the presenter view's, are drawn on its template (white, where plotly's
    own default is a blue-grey plot area); the template reaches them as plotly's default (components.style.TEMPLATE)."""
    import plotly.io as pio

    from components.style import TEMPLATE, Look
    from components.views import Shown, show

    page = pio.templates[TEMPLATE].layout.plot_bgcolor
    assert page != pio.templates["plotly"].layout.plot_bgcolor
    for look in (Look(), Look(presenter=True, screen_px=480)):
        drawn = [v for v in show(Shown(comparison, "a run", look=look)).values() if isinstance(v, go.Figure)]
        assert len(drawn) >= 7
        assert [f.layout.template.layout.plot_bgcolor for f in drawn] == [page] * len(drawn)
