"""Undecided cuts (sbon/cut.py): candidates the pruning signal cannot tell apart from the cut, by its own
uncertainty, and what each rule of the ``undecided`` setting does with them.

- pure cases on constructed ties, one per rule; the one-line refusal and the one-line fallback;
- on the real model: a memory-budget run replayed on Best-of-N's candidates (``replay_rounds``) equals the real
  run under every rule; and the page's views of a run with an instruction that stays open (the ``ifeval``
  reward, "end your response with ...") mark the undecided candidates and say what was done with them.
"""

from __future__ import annotations

import pytest

from sbon.algorithms import UndecidedFallback, events, plan_budget, run
from sbon.analysis.replay import replay_rounds, replay_tau
from sbon.config import RunConfig
from sbon.cut import UNDECIDED, cut
from sbon.errors import SBoNError
from sbon.results import Candidate, DecisionPoint, RunResult
from sbon.rewards import CallableReward
from sbon.signals import MeanLogProb, RewardSignal, without_uncertainty

# Five live candidates; alpha 0.5 keeps 3. Candidates 1, 2, 3 sit within 0.0004 of each other around the cut,
# with half-widths of 0.001: the cut between 2 and 3 is undecided, and so are 1, 2 and 3. 0 and 4 are decided.
SCORES = {0: 0.9, 1: 0.5005, 2: 0.5003, 3: 0.5001, 4: 0.1}
HALF = dict.fromkeys(SCORES, 0.001)


def test_the_papers_rule_ranks_undecided_candidates_anyway_and_records_them():
    c = cut(SCORES, set(), 0.5, uncertainty=HALF, undecided="paper")
    assert c.kept == [0, 1, 2] and c.pruned == [3, 4] and c.undecided == [1, 2, 3] and c.owed == 0
    assert c == cut(SCORES, set(), 0.5, uncertainty=HALF)  # the paper's rule is the default


def test_prune_halts_only_the_decided_ones():
    c = cut(SCORES, set(), 0.5, uncertainty=HALF, undecided="prune")
    assert c.kept == [0, 1, 2, 3] and c.pruned == [4] and c.undecided == [1, 2, 3] and c.owed == 0


def test_defer_keeps_them_and_the_next_decision_point_catches_up():
    c = cut(SCORES, set(), 0.5, uncertainty=HALF, undecided="defer")
    assert c.kept == [0, 1, 2, 3] and c.pruned == [4] and c.owed == 1
    # next decision point, now decided: 4 contenders, 1 owed -> keeps round(0.5 * 3) = 2, as the paper would
    later = cut({0: 0.9, 1: 0.7, 2: 0.4, 3: 0.2}, set(), 0.5, uncertainty=dict.fromkeys(range(4), 0.001),
                undecided="defer", owed=c.owed)
    assert later.kept == [0, 1] and later.pruned == [2, 3] and later.owed == 0 and later.undecided == []


def test_defer_waits_once_then_draws_among_those_still_undecided():
    first = cut(SCORES, set(), 0.5, uncertainty=HALF, undecided="defer")
    assert first.deferred == [1, 2, 3]
    # still undecided at the next decision point: the paper's count is kept, the waited ones drawn at random
    again = [cut(SCORES, set(), 0.5, uncertainty=HALF, undecided="defer", deferred=first.deferred, seed=(s, 2))
             for s in range(30)]
    assert all(len(c.kept) == 3 and 0 in c.kept and c.deferred == [] and c.owed == 0 for c in again)
    assert {next(k for k in (1, 2, 3) if k in c.pruned) for c in again} == {1, 2, 3}


@pytest.mark.parametrize("rule", ["prune", "defer", "random"])
def test_under_a_full_budget_the_undecided_are_halted_first_at_random_never_by_score_order(rule):
    """The progress rule holds: a kept undecided candidate holds memory, so the budget may halt it; which one is
    a seeded draw, not the tie-break's order."""
    cuts = [cut(SCORES, set(), 0.5, fits=lambda live: live <= 2, uncertainty=HALF, undecided=rule, seed=(s, 1))
            for s in range(30)]
    assert all(len(c.kept) == 2 and 0 in c.kept and 4 in c.pruned and set(c.forced) <= {1, 2, 3} for c in cuts)
    assert {k for c in cuts for k in c.kept if k != 0} == {1, 2, 3}


def test_random_draws_among_the_undecided_only_reproducibly_and_not_by_score_order():
    draws = [cut(SCORES, set(), 0.5, uncertainty=HALF, undecided="random", seed=(s, 1)) for s in range(30)]
    for c in draws:
        assert 0 in c.kept and 4 in c.pruned and len(c.kept) == 3 and c.undecided == [1, 2, 3]
    assert draws[7] == cut(SCORES, set(), 0.5, uncertainty=HALF, undecided="random", seed=(7, 1))
    halted = {next(k for k in (1, 2, 3) if k in c.pruned) for c in draws}
    assert halted == {1, 2, 3}  # each undecided one is halted by some seed: no systematic key decides


@pytest.mark.parametrize("rule", list(UNDECIDED))
def test_a_decided_cut_is_the_papers_under_every_rule(rule):
    narrow = dict.fromkeys(SCORES, 1e-6)
    assert cut(SCORES, set(), 0.5, uncertainty=narrow, undecided=rule) == cut(SCORES, set(), 0.5)
    assert cut(SCORES, set(), 0.5, uncertainty=None, undecided=rule) == cut(SCORES, set(), 0.5)


def test_scores_equal_up_to_the_tie_term_are_a_tie():
    alike = {0: 0.00092, 1: 0.00088, 2: 0.00085, 3: 0.00082}
    assert cut(alike, set(), 0.5, uncertainty=dict.fromkeys(alike, 0.0005), tie=0.001).tied
    assert not cut(SCORES, set(), 0.5, uncertainty=HALF, tie=0.001).tied


def test_an_unknown_rule_is_refused_in_one_line_naming_the_choices():
    for bad in (lambda: RunConfig(undecided="maybe").validate(), lambda: cut(SCORES, set(), 0.5, undecided="maybe")):
        with pytest.raises(SBoNError) as e:
            bad()
        assert "\n" not in str(e.value) and all(rule in str(e.value) for rule in UNDECIDED)


def test_a_signal_without_an_uncertainty_says_so_in_one_line_and_keeps_the_papers_rule(gen):
    line = without_uncertainty(MeanLogProb(), "defer")
    assert line and "\n" not in line and "paper" in line
    assert without_uncertainty(MeanLogProb(), "paper") is None
    no_noise = RewardSignal(CallableReward(lambda p, rs: [float(len(r)) for r in rs], name="length"))
    assert not no_noise.knows_uncertainty and without_uncertainty(no_noise, "random")
    with pytest.warns(UndecidedFallback, match="no uncertainty"):
        result = run(events(gen, no_noise.reward, "Say hi.", RunConfig(n=4, max_new_tokens=8, undecided="defer")))
    assert result.decision_points and all(p.undecided_rule == "paper" and not p.undecided for p in result.decision_points)


def test_replay_tau_applies_the_rule():
    cands = []
    for k, final in enumerate([1.0, 0.9, 0.8, 0.7, 0.1]):
        c = Candidate(k)
        c.token_ids, c.final_reward, c.stop_reason = [0] * 20, final, "length"
        cands.append(c)
    bon = RunResult("bon", "p", "g", "r", {"n": 5}, 1, cands, best_id=0)
    partial, half = [SCORES[k] for k in range(5)], [HALF[k] for k in range(5)]
    assert replay_tau(bon, partial, 8, 0.5, uncertainty=half, undecided="prune").cut.kept == [0, 1, 2, 3]
    assert replay_tau(bon, partial, 8, 0.5).cut.kept == [0, 1, 2]


# -- on the real model -----------------------------------------------------------------------------------

PROMPT = "Write a short note to a friend about a day at the sea."
OPEN = [{"id": "startend:end_checker", "end_phrase": "Is there anything else I can help with?"}]


@pytest.fixture(scope="module")
def ifeval(gen):
    from sbon.models import load_reward
    from sbon.rewards import bind_instructions

    return bind_instructions(load_reward("ifeval", generator=gen), PROMPT, OPEN)


@pytest.mark.parametrize("rule", list(UNDECIDED))
def test_replay_rounds_equals_the_real_run_under_every_rule(gen, ifeval, rule):
    config = RunConfig(n=6, max_new_tokens=24, seed=1)
    bon = run(events(gen, ifeval, PROMPT, config.replace(method="bon")))
    real = run(events(gen, ifeval, PROMPT, config.replace(undecided=rule)))
    signal, tokens = RewardSignal(ifeval), len(gen.encode_prompt(PROMPT))

    def score_at(t, ids):
        texts = [gen.decode(bon.candidates[k].token_ids[:t]) for k in ids]
        return signal.score(PROMPT, ids, texts), signal.uncertainty(PROMPT, ids, texts)

    replay = replay_rounds(bon, tokens, plan_budget(gen, tokens, 6, None, 24)[1], config.alpha, score_at, rule,
                           config.seed, signal.tie)
    assert real.decision_points  # the comparison below ran on at least one decision point
    assert [(p.tokens, p.survivors, p.pruned, p.undecided, p.tied) for p in real.decision_points] == \
           [(p.tokens, p.survivors, p.pruned, p.undecided, p.tied) for p in replay.points]
    assert (real.best_id, real.total_tokens) == (replay.best_id, replay.tokens)


@pytest.fixture(scope="module")
def open_instruction_run(gen, ifeval):
    from sbon.analysis.comparison import run_comparison

    return run_comparison(gen, ifeval, PROMPT, RunConfig(n=6, max_new_tokens=24, seed=1, undecided="defer"),
                          taus=[12], signals=())


def test_the_page_marks_undecided_candidates_and_says_what_was_done(open_instruction_run):
    from components import views
    from components.reasons import coin_toss, marked_undecided
    from components.rounds import UNDECIDED_NAME, present_step, run_captions

    comp = open_instruction_run
    points = [p for p in comp.sbon.decision_points if p.undecided]
    assert points, "the open instruction left no candidate undecided"
    shown = views.show(views.Shown(comp, "your run"))
    live = shown["live_plot"]
    marks = [t for t in live.data if t.name == UNDECIDED_NAME]
    last = comp.sbon.decision_points[-1]
    assert len(marks) == 1 and marks[0].showlegend is bool(marked_undecided(last))
    animation = shown["rounds_plot"]
    drawn = [t for t in animation.data if t.name == UNDECIDED_NAME and t.y is not None and len(t.y)]
    assert bool(drawn) == any(marked_undecided(p) for p in points)
    assert all("could not be told apart from the cut" in d[0] or "no candidate" in d[0] for t in drawn for d in t.customdata)
    captions = run_captions(comp)
    for point, caption in zip(comp.sbon.decision_points, captions):
        if point.tied:
            assert "none can still pass" in caption or "as likely" in caption
        elif coin_toss(point):
            assert "scores within the noise: a coin toss" in caption
        elif point.undecided:
            assert "within the noise: kept to wait a round, or drawn" in caption
    assert present_step(comp, 0)[1] == captions[0]
    from components.live import LiveTracker, progress_figure

    tracker = LiveTracker(24, reward=comp.sbon.reward)
    tracker.results["sbon"] = comp.sbon  # Best-of-N's phase of the live chart: Speculative Rejection has answered
    bars = [t for t in progress_figure(tracker, comp.n).data if t.name == UNDECIDED_NAME]
    marked = {k for p in points for k in marked_undecided(p)}  # only where the mark sets some apart from others
    assert len(bars) == 1 and bars[0].showlegend is bool(marked) and set(bars[0].y) == marked
    table = shown["table"]
    assert table["last decision"].str.contains("could not be told apart from the cut|no candidate can still").any()


def test_a_cut_among_scores_all_alike_says_so_and_the_chart_shows_it():
    from components.reasons import point_reasons
    from components.rounds import round_caption, round_figure

    point = DecisionPoint(1, 16, [0, 1, 2, 3], [0, 1], [2, 3], 0.00088, scores=[0.00092, 0.00088, 0.00085, 0.00082],
                          undecided=[0, 1, 2, 3], tied=True)
    reason = point_reasons(point, "ifeval")[3].text()
    assert reason.startswith("no candidate can still follow the instructions: shortest kept")
    assert "<" not in reason  # no comparison with the cut, as if the score meant something
    assert "none can still pass: shortest kept" in round_caption(point, reward="ifeval")
    title = round_figure(point, 4, reward="ifeval").layout.title.text.replace("<br>", " ")
    assert "No candidate can still follow the instructions: shortest kept" in title
    # scores equal where the cut fell: the candidate number decided it, whatever the reward
    equal = DecisionPoint(1, 16, [0, 1, 2, 3], [0, 1], [2, 3], 0.0, scores=[0.0] * 4, tied=True)
    assert round_caption(equal, reward="ifeval").endswith("none can still pass: lowest numbers kept")
    assert round_caption(equal, reward="minilm-pref").endswith("all scored the same: lowest numbers kept")
