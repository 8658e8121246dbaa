"""The comparison's watched pruning signals and the "Pruning signals" view, on the real small model
(the shared comparison fixture: N=6, 24 tokens, two decision points, likelihood reward)."""

import json
from pathlib import Path

import pytest

from components import signals_view as sv
from sbon.algorithms import survivors_count
from sbon.analysis.comparison import Comparison
from sbon.config import RunConfig
from sbon.errors import SBoNError
from sbon.results import PHASES
from sbon.analysis.signal_matrix import SignalWatch, signal_scores
from sbon.signals import REWARD_FREE, signal_title


ROOT = Path(__file__).resolve().parent.parent
OLD_FILES = [ROOT / "tests" / "data" / "recorded_run_v1.json"]  # saved before comparisons watched signals


def _without_signal_scores(tmp_path) -> Path:
    """The shipped recording as a file saved before signal scores existed: the same JSON without the field."""
    d = json.loads((ROOT / "assets" / "recorded_run.json").read_text())
    d.pop("signal_scores")
    path = tmp_path / "recorded_without_signals.json"
    path.write_text(json.dumps(d))
    return path


def taus_of(comp):
    return [p.tokens for p in comp.speculative.decision_points]


def test_scores_stored_at_every_decision_point(comparison):
    taus = taus_of(comparison)
    assert len(taus) >= 2
    # The embedded generator is the one the shipped value head was trained on: it is watched too.
    assert set(comparison.signal_scores) == set(REWARD_FREE) | {"value-head"}
    for name, by_t in comparison.signal_scores.items():
        assert sorted(by_t) == taus
        for t, row in by_t.items():
            # A score for exactly the candidates still generating after t tokens, as the partial rewards.
            assert [s is not None for s in row] == [c.tokens_generated > t for c in comparison.bon.candidates]


def test_scores_equal_the_signal_matrix_on_the_same_seed(gen, likelihood, comparison):
    config = RunConfig(method="bon", n=comparison.n, max_new_tokens=24, seed=1)
    bon, scores = signal_scores(gen, likelihood, comparison.bon.prompt, config, list(comparison.signal_scores),
                                taus_of(comparison))
    assert [c.token_ids for c in bon.candidates] == [c.token_ids for c in comparison.bon.candidates]
    for name, by_t in scores.items():
        for t, row in by_t.items():
            stored = comparison.signal_scores[name][t]
            assert [s is None for s in stored] == [s is None for s in row]
            assert [s for s in stored if s is not None] == pytest.approx([s for s in row if s is not None], abs=1e-5)


def test_watching_keeps_best_of_n_candidates_and_takes_its_time_out(gen, likelihood, comparison):
    from sbon.algorithms import Done, events

    config = RunConfig(method="bon", n=comparison.n, max_new_tokens=24, seed=1)
    plain = next(e.result for e in events(gen, likelihood, comparison.bon.prompt, config) if isinstance(e, Done))
    assert [c.token_ids for c in plain.candidates] == [c.token_ids for c in comparison.bon.candidates]
    timings = comparison.bon.timings
    assert timings["watched_signals"] > 0
    assert timings["total"] == pytest.approx(sum(timings[p] for p in PHASES))


def test_batched_best_of_n_drops_the_signals_that_need_one_batch(gen):
    watch = SignalWatch(gen, None, "Hi.", ["logprob", "consistency", "value-head"], [4], n=4,
                        max_new_tokens=8, one_batch=False)
    assert list(watch.signals) == ["logprob"]


def test_signal_scores_survive_json(comparison):
    back = Comparison.from_json(comparison.to_json())
    assert back.signal_scores == comparison.signal_scores
    bad = json.loads(comparison.to_json())
    bad["signal_scores"]["logprob"][str(taus_of(comparison)[0])] = [0.0]  # wrong length
    with pytest.raises(SBoNError, match="logprob scores"):
        Comparison.from_dict(bad)
    bad["signal_scores"] = {"logprob": [1, 2]}
    with pytest.raises(SBoNError, match="signal_scores"):
        Comparison.from_dict(bad)


@pytest.mark.parametrize("path", [*OLD_FILES, "without-signals"], ids=lambda p: getattr(p, "name", p))
def test_old_files_load_and_the_view_explains(path, tmp_path):
    comp = Comparison.load(_without_signal_scores(tmp_path) if path == "without-signals" else path)
    assert comp.signal_scores == {}
    assert not sv.has_signal_scores(comp)
    assert list(sv.summary_table(comp).columns) == ["note"]
    assert list(sv.candidate_table(comp).columns) == ["note"]
    fig = sv.cuts_figure(comp)
    assert not fig.data and "recorded before" in fig.layout.annotations[0].text


def test_the_shipped_recording_shows_every_watched_signal():
    comp = Comparison.load(ROOT / "assets" / "recorded_run.json")
    assert {"logprob", "deepconf", "self-certainty"} <= set(comp.signal_scores)
    table = sv.summary_table(comp)
    rounds = len(comp.speculative.decision_points)
    assert len(table) == rounds * len(sv.signal_names(comp))
    assert set(table["signal"]) >= {signal_title("reward"), signal_title("logprob")}  # human names on the page
    assert sv.cuts_figure(comp).data


def test_summary_table_rows(comparison):
    table = sv.summary_table(comparison)
    names = sv.signal_names(comparison)
    dps = comparison.speculative.decision_points
    assert names[0] == "reward" and set(names[1:]) == set(comparison.signal_scores)
    # The run's own signal has the run's rows at every decision point; every watched signal a what-if at each.
    assert len(table) == len(names) * len(dps)
    alpha = comparison.speculative.settings["alpha"]
    winner = comparison.bon.best_id
    for c, (_, row) in zip(sv.cuts(comparison), table.iterrows()):
        assert row["signal"] == signal_title(c.signal) and row["decision point"] == f"round {c.round} · {c.t} tokens"
        assert row["cuts"] == ("this run" if c.own else "what-if") and c.own == (c.signal == "reward")
        assert row["winner kept"].startswith("✓") == (winner in c.kept or winner in c.finished)
        if c.own:
            continue
        live = [k for k, s in enumerate(c.scores) if s is not None]
        assert row["contenders"] == comparison.n  # the what-if judges all of Best-of-N's candidates
        assert row["pruned"] == len(live) - survivors_count(len(live), alpha)
        # The cut keeps the best-scored live candidates.
        assert min(c.scores[k] for k in c.kept) >= max((c.scores[k] for k in c.cut), default=float("-inf"))


@pytest.mark.parametrize("file", ["recorded_run.json", "gallery/reward-free.json"])
def test_the_run_own_signal_shows_the_run_own_cuts_and_the_what_if_says_so_first(file):
    comp = Comparison.load(ROOT / "assets" / file)
    dps = comp.speculative.decision_points
    own = [c for c in sv.cuts(comp) if c.own]
    assert [c.signal for c in own] == [p.signal for p in dps] and own[0].signal == sv.own_signal(comp)
    for c, p in zip(own, dps):  # the run's contenders, pruned and survivors, as the round captions count them
        assert (c.round, c.t, c.contenders, sorted(c.cut), c.finished) == (p.round, p.tokens, len(p.contenders),
                                                                              p.pruned, p.final)
        assert set(c.kept) == set(p.survivors) - set(p.final)
    table = sv.summary_table(comp)
    mine = table[table["cuts"] == "this run"]
    assert list(mine["contenders"]) == [len(p.contenders) for p in dps]
    assert list(mine["pruned"]) == [len(p.pruned) for p in dps]
    first, *rest = sv.signals_note(comp).split("\n\n")
    counts = lambda values: " / ".join(map(str, values))  # noqa: E731
    assert first.startswith("**What-if rows: what each signal would have cut if it had judged all")
    assert f"this run had {counts(len(p.contenders) for p in dps)} and {counts(len(p.pruned) for p in dps)}" in first
    whatif = table[table["signal"] == table[table["cuts"] == "what-if"]["signal"].iloc[0]]
    assert f"count {counts(whatif['contenders'])} contenders and {counts(whatif['pruned'])} pruned" in first
    marks = sv.candidate_table(comp)[sv.column_title(comp, own[0].signal)]
    for k, row in enumerate(marks):  # a candidate pruned at round r reads ✗ there and – after it
        r = comp.speculative.candidates[k].pruned_round
        if r is not None:
            assert row.split()[r - 1:] == ["✗"] + ["–"] * (len(dps) - r)


def test_candidate_table_and_click(comparison):
    table = sv.candidate_table(comparison)
    assert list(table["candidate"]) == list(range(comparison.n))
    assert list(table["Best-of-N winner"]).index("★") == comparison.bon.best_id
    dps = len(comparison.speculative.decision_points)
    for name in sv.signal_names(comparison):
        assert all(len(marks.split()) == dps and set(marks.split()) <= {"✓", "✗", "·", "–"}
                   for marks in table[sv.column_title(comparison, name)])
    assert sv.candidate_for_select(table.iloc[3].tolist()) == 3
    assert sv.candidate_for_select(None) is None


def test_cuts_figure(comparison):
    fig = sv.cuts_figure(comparison)
    names = sv.signal_names(comparison)
    marked = sum(len(trace.x) for trace in fig.data)
    dps = comparison.speculative.decision_points
    # every candidate in every what-if (signal, decision point) row; the run's own rows: its contenders there
    assert marked == (len(names) - 1) * len(dps) * comparison.n + sum(len(p.contenders) for p in dps)
    assert {trace.name for trace in fig.data} <= {"kept", "pruned", "finished"}
    assert fig.layout.title.text.startswith("What-if rows judge all")
    assert all(row[0] in range(comparison.n) for trace in fig.data for row in trace.customdata)
    assert len(fig.layout.shapes) == len(comparison.speculative.decision_points)  # the winner's column in each panel


def test_the_cuts_figure_stacks_its_panels_round_by_round_and_sets_them_side_by_side_for_the_presenter_view():
    """On the page (a phone's width among its screens) the decision points' panels stand one under another, the
    first round at the top, each as wide as the figure, the signals' row labels wrapped; the presenter view (wide,
    no taller than a projector) sets them side by side in round order. Both keep the candidates' axis title."""
    comp = Comparison.load(ROOT / "assets" / "recorded_run.json")
    rounds = [p.round for p in comp.speculative.decision_points]
    assert len(rounds) >= 3
    for side_by_side in (False, True):
        fig = sv.cuts_figure(comp, side_by_side=side_by_side)
        titled = sorted(fig.layout.annotations, key=lambda a: (-a.y, a.x))  # top to bottom, left to right
        assert [a.text.split(" · ")[0] for a in titled] == [f"round {r}" for r in rounds]
        layout = fig.layout.to_plotly_json()
        x = [a["domain"] for name, a in layout.items() if name.startswith("xaxis")]
        y = [tuple(a["domain"]) for name, a in layout.items() if name.startswith("yaxis")]
        assert len(x) == len(y) == len(rounds)
        if side_by_side:
            assert len(set(y)) == 1  # one row of panels
        else:
            assert all(d == [0, 1] for d in x) and len(set(y)) == len(rounds)  # each panel the figure's width
        assert fig.layout.xaxis.title.text == "candidate"
        labels = {y for trace in fig.data for y in trace.y}
        assert labels and all(len(line) <= sv.SIGNAL_LABEL_CHARS for y in labels for line in y.split("<br>"))
