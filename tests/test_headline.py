"""A headline no load can flip (decode steps, tokens, the random-pruning null model; wall time second, with a
note when the machine was busy), and explanations that are true as written."""

from __future__ import annotations

import itertools
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from components import tables
from components.reasons import point_reasons
from sbon.algorithms import Done, TokensGenerated
from sbon.analysis.comparison import Comparison, MethodEvent, comparison_events, headline_text
from sbon.machine_load import BUSY_OTHERS_CORES, busy
from sbon.metrics import normalized_score, random_pruning_reward
from sbon.results import Candidate, DecisionPoint, RunResult
from sbon.signals import SIGNALS, signal_description, signal_title

from conftest import COMPARISON_PROMPT

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "assets" / "recorded_run.json"
REWARD_FREE = ROOT / "assets" / "gallery" / "reward-free.json"  # self-certainty: two finished candidates in round 3, unranked
BUSY_SECONDS = 300  # the busy loops' bound, should the test die before it stops them


# -- the headline under load ------------------------------------------------------------------------------

def busy_loops(count: int) -> list[subprocess.Popen]:
    """CPU-bound processes, one per core, each ending by itself after BUSY_SECONDS."""
    code = f"import time\nend = time.time() + {BUSY_SECONDS}\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def test_the_same_comparison_beside_a_busy_process_has_the_same_headline_and_says_the_machine_was_busy(
        gen, likelihood, comparison):
    prompt_tokens = len(gen.encode_prompt(COMPARISON_PROMPT))
    loops = busy_loops(1)  # a whole core taken by another process is busy; a second loop only slows the suite
    try:
        loaded = list(comparison_events(gen, likelihood, COMPARISON_PROMPT, 6, alpha=0.2,
                                        kv_budget=6 * (prompt_tokens + 8), max_new_tokens=24, seed=1,
                                        taus=[4, 8, 16]))[-1].comparison
    finally:
        for p in loops:
            p.kill()
            p.wait()
    quiet_headline, quiet_time = tables.headline_parts(comparison)
    busy_headline, busy_time = tables.headline_parts(loaded)
    assert busy_headline == quiet_headline  # steps, tokens, scores, the null model: nothing the load can change
    assert loaded.speculative.load["others_cores"] > BUSY_OTHERS_CORES and loaded.metrics["machine_busy"] == 1.0
    assert "⚠ The machine was busy" in busy_time and "upper bounds" in busy_time
    # the null model in the headline, the saved run and /compare's JSON (app.compare_endpoint returns Comparison.to_json)
    m = loaded.metrics
    assert f"would have scored {m['random_pruning_normalized_score']:.1f} on average" in busy_headline
    saved = json.loads(loaded.to_json())
    assert saved["metrics"]["random_pruning_reward"] == m["random_pruning_reward"]
    assert saved["headline"] == headline_text(loaded) and saved["wall_time"].endswith("do not depend on the load.")
    assert saved["sbon"]["load"]["others_cores"] == loaded.speculative.load["others_cores"]
    assert Comparison.from_json(loaded.to_json()).metrics["machine_busy"] == 1.0  # kept on load


def test_what_a_run_builds_before_its_timers_start_is_not_counted_as_another_process_s_load(gen, likelihood,
                                                                                             monkeypatch):
    """A run's first use of a path may build it in a child process (a kernel's compiler) before its timers start:
    the load a run records covers its timers' window, so its own build is neither another's load nor its time."""
    from sbon.decoders import EagerDecoder

    build_s = 1.5
    ready = EagerDecoder.ready

    def ready_after_a_build(self, *args):
        subprocess.run([sys.executable, "-c", f"import time\nend = time.time() + {build_s}\nwhile time.time() < end: pass"],
                       check=True)
        ready(self, *args)

    monkeypatch.setattr(EagerDecoder, "ready", ready_after_a_build)
    comp = list(comparison_events(gen, likelihood, COMPARISON_PROMPT, 4, alpha=0.5, max_new_tokens=8, seed=1,
                                  decode="eager", taus=[4]))[-1].comparison
    for run in (comp.speculative, comp.bon):
        # the window opens after the build (whose child has ended by then): it holds the timers, not the build
        assert run.timings["total"] <= run.load["seconds"] < run.timings["total"] + build_s / 2, (run.timings, run.load)


def test_decode_steps_are_the_steps_the_run_took(comparison_events):
    """Counted from the events (one TokensGenerated per step of a batch), not from the result's lengths."""
    steps = {}
    for e in comparison_events:
        if isinstance(e, MethodEvent) and isinstance(e.event, TokensGenerated):
            steps[e.method] = steps.get(e.method, 0) + 1
    done = {e.method: e.event.result for e in comparison_events if isinstance(e, MethodEvent) and isinstance(e.event, Done)}
    assert {method: run.decode_steps for method, run in done.items()} == steps


def test_a_run_that_pruned_nothing_credits_its_fewer_decode_steps_to_best_of_n_s_batches(gen, likelihood):
    """With α = 0 a run may prune nothing, yet take fewer decode steps than Best-of-N run in batches under the same
    memory: the headline's key phrase, which the projector shows alone, must not pass that off as pruning's. Short
    answers to a one-word question under a tight budget; the first seed that prunes nothing is taken (the texts
    depend on the CPU), and a run that did prune must not get the phrase. Against Best-of-N in one batch, the same
    seed costs as much as Best-of-N, and the headline says that instead of "only the tokens differ"."""
    from components.rounds import result_lines
    from sbon.analysis.comparison import ComparisonReady, comparison_events as events

    prompt = "Answer in one word: what colour is the sky on a clear day?"
    budget = 6 * (len(gen.encode_prompt(prompt)) + 8)
    seen = {}
    for seed in range(1, 7):
        comp = next(e.comparison for e in events(gen, likelihood, prompt, 6, alpha=0.0, kv_budget=budget,
                                                 max_new_tokens=24, seed=seed, bon_same_memory=True, signals=())
                    if isinstance(e, ComparisonReady))
        pruned = any(c.pruned_round is not None for c in comp.speculative.candidates)
        text, batches = headline_text(comp), comp.bon.batches
        assert len(batches) > 1  # the budget fits fewer than 6 whole answers: Best-of-N runs in batches
        if pruned:
            assert "pruned" not in text
        else:
            # the whole saving is the batches: one batch of these same answers takes as many steps as the run did
            assert comp.metrics["sbon_steps"] == max(c.tokens_generated for c in comp.bon.candidates)
            assert comp.metrics["sbon_steps"] < comp.metrics["bon_steps"]
            assert f"in {len(batches)} batches, with no candidate pruned" in result_lines(comp)
            assert (f"Every step saved comes from Best-of-N's batches: it held at most {len(batches[0])} of its 6 "
                    "candidates at once, where Speculative Rejection held all 6.") in text
            if False not in seen:  # once, for the first seed that pruned nothing
                # the same seed against Best-of-N in one batch: the same steps and tokens, and the headline says so
                alone = next(e.comparison for e in events(gen, likelihood, prompt, 6, alpha=0.0, kv_budget=budget,
                                                          max_new_tokens=24, seed=seed, signals=())
                             if isinstance(e, ComparisonReady))
                m = alone.metrics
                assert (m["sbon_steps"], m["sbon_tokens"]) == (m["bon_steps"], m["bon_tokens"])
                assert "no candidate was pruned, so the two runs cost the same" in headline_text(alone)
                assert "only the tokens differ" not in headline_text(alone)
        seen[pruned] = seed
        if len(seen) == 2:
            break
    if False not in seen:
        pytest.skip("no seed pruned nothing on this CPU")
    assert True in seen, "no seed pruned anything: the other side of the phrase went unchecked"


def test_files_saved_before_the_load_was_recorded_load_without_a_busy_note():
    comp = Comparison.load(ROOT / "tests" / "data" / "recorded_run_v1.json")
    assert comp.speculative.load == {} and comp.metrics["machine_busy"] == 0.0
    assert "busy" not in tables.headline(comp) and comp.metrics["bon_steps"] > comp.metrics["sbon_steps"]


def test_busy_is_other_processes_cores_or_else_the_load_average():
    assert busy({"cores": 2, "others_cores": 0.6}) and not busy({"cores": 2, "others_cores": 0.4})
    assert busy({"cores": 2, "others_cores": None, "load_average_start": 2.5})  # no /proc/stat: the load average
    assert not busy({"cores": 2, "others_cores": None, "load_average_start": 1.5}) and not busy({})


# -- the null model ------------------------------------------------------------------------------------------

def runs(lengths: list[int], finals: list[float], points: list[tuple[int, list[int], list[int]]]):
    """A Best-of-N run and a Speculative Rejection run of these candidates; points: (tokens, survivors, finished)."""
    bon = RunResult("bon", "p", "g", "r", {"seed": 0}, 1,
                    [Candidate(k, [1] * n, final_reward=f, stop_reason="eos") for k, (n, f) in enumerate(zip(lengths, finals))],
                    timings={"total": 1.0}, best_id=max(range(len(finals)), key=finals.__getitem__))
    decisions = [DecisionPoint(r + 1, t, [], survivors, [], 0.0, final=finished) for r, (t, survivors, finished) in enumerate(points)]
    sbon = RunResult("sbon", "p", "g", "r", {"seed": 0}, 1, [Candidate(k) for k in range(len(lengths))], decisions)
    return bon, sbon


def simulate(lengths, finals, points, draws: int, seed: int = 1) -> float:
    """Random pruning played round by round: at each decision point keep as many of the live candidates as the run
    kept, uniformly at random; the best final reward among those never pruned."""
    rng, total = random.Random(seed), 0.0
    for _ in range(draws):
        pruned = set()
        for t, survivors, finished in points:
            live = [k for k, n in enumerate(lengths) if n > t and k not in pruned]
            keep = max(1, len([k for k in survivors if k not in finished]))
            if len(live) > keep:
                pruned |= set(live) - set(rng.sample(live, keep))
        total += max(f for k, f in enumerate(finals) if k not in pruned)
    return total / draws


def test_random_pruning_at_one_decision_point_is_the_exact_mean_over_every_survivor_set():
    lengths, finals = [3, 9, 9, 9, 9, 9, 2], [0.1, 0.9, 0.3, 0.5, 0.7, 0.2, 0.4]
    bon, sbon = runs(lengths, finals, [(4, [1, 2, 6], [0, 6])])  # two live survivors; 0 and 6 had finished
    subsets = list(itertools.combinations([1, 2, 3, 4, 5], 2))
    exact = sum(max(finals[0], finals[6], *(finals[k] for k in s)) for s in subsets) / len(subsets)
    assert random_pruning_reward(bon, sbon) == pytest.approx(exact, abs=1e-12)


def test_random_pruning_over_rounds_matches_pruning_at_random_round_by_round():
    comp = Comparison.load(RECORDED)
    lengths = [c.tokens_generated for c in comp.bon.candidates]
    finals = [c.final_reward for c in comp.bon.candidates]
    points = [(p.tokens, p.survivors, p.final) for p in comp.speculative.decision_points]
    assert len(points) >= 3  # several rounds of random pruning
    spread = max(finals) - min(finals)
    assert random_pruning_reward(comp.bon, comp.speculative) == pytest.approx(simulate(lengths, finals, points, 20_000),
                                                                       abs=0.01 * spread)
    assert comp.metrics["random_pruning_normalized_score"] == normalized_score(finals, comp.metrics["random_pruning_reward"])


def test_a_candidate_that_finished_before_any_cut_is_always_returned_by_random_pruning():
    bon, sbon = runs([2, 9, 9, 9], [5.0, 1.0, 2.0, 3.0], [(4, [0, 1], [0]), (6, [1], [])])
    assert random_pruning_reward(bon, sbon) == 5.0


# -- explanations true as written ------------------------------------------------------------------------

def inequality_holds(text: str) -> bool:
    a, sign, b = re.search(r"(-?[\d.]+) ([<≥=]) cut (-?[\d.]+)", text).groups()
    return {"<": float(a) < float(b), "≥": float(a) >= float(b), "=": float(a) == float(b)}[sign]


@pytest.mark.parametrize("source", ["recorded", "fixture"])
def test_every_reason_reads_true(source, request):
    comp = Comparison.load(RECORDED) if source == "recorded" else request.getfixturevalue("comparison")
    ranked = [(point, k, reason) for point in comp.speculative.decision_points for k, reason in point_reasons(point).items()
              if reason.rank is not None]
    assert ranked  # the run has ranked reasons to read
    for point, k, reason in ranked:
        text = reason.text()
        if undecided := re.search(r"could not be told apart from the cut \((-?[\d.]+) against (-?[\d.]+)\)", text):
            assert k in point.undecided, text  # said only of a candidate the run recorded as undecided
            score, cut = map(float, undecided.groups())  # the numbers it gives are its score and the cut
            assert reason.score == pytest.approx(score, abs=0.51 * 10 ** -len(undecided[1].partition(".")[2])), text
            assert reason.cut == pytest.approx(cut, abs=0.51 * 10 ** -len(undecided[2].partition(".")[2])), text
        else:
            assert k not in point.undecided or reason.finished or reason.tie_note, text
            assert inequality_holds(text), text


def test_a_finished_candidate_the_signal_cannot_rank_says_so():
    comp = Comparison.load(REWARD_FREE)
    point = next(p for p in comp.speculative.decision_points if p.final)  # the story has candidates that finished early
    assert point.signal == "self-certainty" and not point.ranks_finished
    for k in point.final:
        text = point_reasons(point)[k].text()
        assert text.startswith("not ranked: it had finished") and "model certainty signal cannot rank" in text
        assert "cut" not in text and not re.search(r"rank \d", text)
    assert all(r.of == len(point.contenders) - len(point.final) for r in point_reasons(point).values())  # ranked among live


def test_numbers_that_print_alike_show_the_digits_or_the_tie_break_that_separates_them():
    point = DecisionPoint(1, 8, [0, 1, 2, 3], [0, 1], [2, 3], 0.0012, scores=[0.9, 0.0012, 0.0011, 0.0012],
                          signal="logprob", ranks_finished=False)
    reasons = point_reasons(point)
    assert reasons[2].text() == "rank 4 of 4, 0.0011 < cut 0.0012"  # 2 decimals would read "0.00 < cut 0.00"
    assert reasons[3].text().startswith("rank 3 of 4, 0.00 = cut 0.00 (a tie at the cut: ties go to the lower "
                                        "candidate number)")
    assert reasons[1].text() == "rank 2 of 4, 0.00 = cut 0.00"  # candidate 1 won the tie: it is the cut
    budget = DecisionPoint(1, 8, [0, 1, 2], [0], [1, 2], 0.5, scores=[0.9, 0.5, 0.5], forced=[1])
    assert point_reasons(budget)[1].text() == ("rank 2 of 3, 0.50 = cut 0.50, halted all the same: the survivors had "
                                               "to fit the KV budget")  # the cut itself, halted: no tie to explain
    assert point_reasons(budget)[2].text().endswith("(a tie at the cut: ties go to the lower candidate number)")


def test_every_column_metric_and_signal_has_a_human_name_and_a_line_of_help(comparison):
    names = [*tables.candidates_table(comparison).columns, *tables.savings_table(comparison).iloc[:, 0],
             *tables.correlation_table(comparison).columns]
    assert all(tables.column_help(name) for name in names), [n for n in names if not tables.column_help(n)]
    assert not {"tau", "pearson", "kendall", "oracle_cut"} & set(tables.correlation_table(comparison).columns)
    fates = {comparison.speculative.fate(c.id) for c in comparison.speculative.candidates}
    assert all(tables.column_help(fate) for fate in fates), fates
    for name, cls in SIGNALS.items():
        assert signal_title(name) == cls.title and cls.description and signal_description(name).startswith(cls.description)
    assert "cannot rank a finished answer" in signal_description("logprob")
    assert "ranked with the live ones" in signal_description("reward")


def test_the_kendall_list_does_not_run_into_the_sentence_after_it(comparison):
    html = MarkdownIt().render(tables.prediction_report(comparison))
    items = re.findall(r"<li>(.*?)</li>", html, re.S)
    assert len(items) == len(comparison.speculative.decision_points) and all(item.endswith(".") for item in items)
    assert re.search(r"</ul>\s*<p>(At the first|The scores ranked)", html)  # the verdict is a paragraph of its own


# -- every clause of every round caption, checked against the run's data ------------------------------------

CAPTION_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")  # a wide sans: the browser's fallback
CAPTION_PX, CAPTION_LINES = 800, 2  # the presenter view's caption: 20 px bold, 853 CSS px wide less the page's margins
RECORDED_RUNS = [RECORDED, *sorted((ROOT / "assets" / "gallery").glob("*.json"))]
RECORDED_RUNS.remove(ROOT / "assets" / "gallery" / "index.json")


def caption_lines(text: str) -> int:
    """Lines the caption wraps to at CAPTION_PX in the presenter view's type (greedy, at the spaces, as a browser)."""
    from PIL import ImageFont

    font, lines, line = ImageFont.truetype(str(CAPTION_FONT), 20), 1, ""
    for word in text.split(" "):
        longer = f"{line} {word}".strip()
        if line and font.getlength(longer) > CAPTION_PX:
            lines, line = lines + 1, word
        else:
            line = longer
    return lines


def caption_errors(caption: str, point: DecisionPoint, reward: str, rounds: int | None = None,
                   bon_best: int | None = None, pruned_before: dict[int, int] | None = None) -> list[str]:
    """Every clause of a round caption ('·'-separated) read against the decision point: a clause no check knows, or
    one whose count or reason the data does not bear out, is an error."""
    from components.reasons import INSTRUCTION_REWARD, UNDECIDED_DONE
    from sbon.ifeval.reward import TIE_BREAK
    from sbon.score_noise import noise_of

    score, errors = point.score_of(), []
    live = [k for k in point.contenders if k not in point.final]
    undecided, forced = set(point.undecided), set(point.forced)
    drawn = [k for k in point.pruned if k in undecided and k not in forced and point.undecided_rule in ("random", "defer")]
    kept_live = [score[k] for k in live if k in point.survivors]
    noise = noise_of(reward)

    def check(ok: bool, clause: str) -> None:
        if not ok:
            errors.append(clause)

    for clause in caption.split(" · "):
        if m := re.fullmatch(r"Round (\d+)(?: of (\d+))?", clause):
            check(int(m[1]) == point.round and (int(m[2]) if m[2] else None) == rounds, clause)
        elif m := re.fullmatch(r"after (\d+) tokens", clause):
            check(int(m[1]) == point.tokens, clause)
        elif m := re.fullmatch(r"now (\d+) tokens|[\d.]+ s", clause):  # the live caption's progress and clock
            check(m[1] is None or int(m[1]) >= point.tokens, clause)
        elif m := re.fullmatch(r"(\d+) of (\d+) kept", clause):
            check((int(m[1]), int(m[2])) == (len(point.survivors), len(point.contenders)), clause)
        elif m := re.fullmatch(r"(\d+) pruned below the cut", clause):
            below = [k for k in point.pruned if k not in forced and k not in drawn]
            check(int(m[1]) == len(below) > 0 and all(score[k] <= point.cut for k in below), clause)
        elif m := re.fullmatch(r"(\d+) halted by the KV budget", clause):
            check(int(m[1]) == len(forced) > 0 and forced <= set(point.pruned), clause)
        elif m := re.fullmatch(r"(\d+) pruned by a random draw", clause):
            check(int(m[1]) == len(drawn) > 0, clause)
        elif m := re.fullmatch(r"(\d+) finished below the cut, still eligible", clause):
            check(int(m[1]) == len(point.retired) > 0 and all(score[k] <= point.cut and k in point.final
                                                              for k in point.retired), clause)
        elif m := re.fullmatch(r"scores within the noise: (.+)", clause):
            done = "a coin toss" if point.undecided_rule == "paper" else UNDECIDED_DONE[point.undecided_rule]
            check(len(live) > 1 and set(live) <= undecided and not point.tied and m[1] == done, clause)
            if noise is not None:  # and the scores bear it out: each within two noises of a side of the cut
                high = max(score[k] for k in point.contenders if k not in point.survivors and k not in forced)
                check(all(min(abs(score[k] - point.cut), abs(score[k] - high)) <= 2 * noise + 1e-9 for k in live), clause)
        elif m := re.fullmatch(r"(\d+) within the noise: (.+)", clause):
            marked = [k for k in live if k in undecided]
            check(int(m[1]) == len(marked) and 0 < len(marked) < len(live) and not point.tied
                  and m[2] == UNDECIDED_DONE[point.undecided_rule], clause)
        elif m := re.fullmatch(r"(none can still pass|all as likely to pass|all scored the same): (.+)", clause):
            scores = [score[k] for k in live]
            said = {"none can still pass": reward == INSTRUCTION_REWARD and max(scores) <= TIE_BREAK,
                    "all as likely to pass": reward == INSTRUCTION_REWARD and max(scores) > TIE_BREAK,
                    "all scored the same": reward != INSTRUCTION_REWARD and len(set(scores)) == 1}[m[1]]
            below = [score[k] for k in point.pruned if k not in forced]
            kept = [k for k in live if k in point.survivors]
            fell = {"shortest kept": reward == INSTRUCTION_REWARD and bool(below) and min(kept_live) > max(below),
                    "lowest numbers kept": bool(below) and min(kept_live) == max(below)
                    and max(k for k in kept if score[k] == min(kept_live)) < min(k for k in point.pruned if score[k] == max(below)),
                    "none pruned for its score": point.undecided_rule == "prune",
                    "none pruned for its score yet": point.undecided_rule == "defer",
                    "kept by a random draw": point.undecided_rule == "random"}.get(m[2], False)
            check(point.tied and said and fell, clause)
        elif m := re.fullmatch(r"Best-of-N's pick (still in|pruned here|pruned in round (\d+)|"
                               r"finished below the cut, still eligible|had finished before)", clause):
            fate = {"still in": bon_best in point.survivors, "pruned here": bon_best in point.pruned,
                    "finished below the cut, still eligible": bon_best in point.retired,
                    "had finished before": bon_best not in point.contenders and not (pruned_before or {}).get(bon_best)}
            check(fate[m[1]] if not m[2] else (pruned_before or {}).get(bon_best) == int(m[2]), clause)
        else:
            errors.append(f"unchecked clause: {clause}")
    if CAPTION_FONT.exists():  # the presenter view's width, where this machine has the font to measure it
        check(caption_lines(caption) <= CAPTION_LINES, f"more than {CAPTION_LINES} lines at {CAPTION_PX} px: {caption}")
    return errors


def final_caption_errors(comp: Comparison) -> list[str]:
    from components.rounds import run_captions

    before, winner, errors = {}, (comp.bon.best_id if comp.twin(comp.bon.best_id) else None), []
    for point, caption in zip(comp.speculative.decision_points, run_captions(comp), strict=True):
        errors += [f"round {point.round}: {e}" for e in caption_errors(
            caption, point, comp.speculative.reward, len(comp.speculative.decision_points), winner, before)]
        before.update({k: point.round for k in point.pruned})
    return errors


@pytest.mark.parametrize("path", RECORDED_RUNS, ids=lambda p: p.name)
def test_every_clause_of_every_round_caption_reads_true_on_the_recorded_runs(path):
    comp = Comparison.load(path)
    assert comp.speculative.decision_points
    assert final_caption_errors(comp) == []


def title_errors(comp: Comparison) -> tuple[list[str], list[DecisionPoint]]:
    """Every clause of each round figure's title read as a round caption's (``caption_errors``), and the decision
    points it was read at: all but those whose scores were alike, whose second line says so instead."""
    from components.reasons import coin_toss
    from components.rounds import round_figure
    from components.style import unwrap

    run, errors, read = comp.speculative, [], []
    for point in run.decision_points:
        if point.tied or coin_toss(point):  # tie_text or coin_toss_text, the caption's longer words
            continue
        title = unwrap(round_figure(point, comp.n, reward=run.reward).layout.title.text)  # wrapped for a phone
        errors += [f"round {point.round}: {e}" for e in caption_errors(title, point, run.reward)]
        read.append(point)
    return errors, read


def test_each_round_figure_s_title_counts_its_contenders_as_the_round_caption_does():
    """The rounds figure's title gives the round caption's counts, each with its own reason."""
    read = []
    for path in RECORDED_RUNS:
        errors, points = title_errors(Comparison.load(path))
        assert errors == [], path.name
        read += points
    assert len(read) >= 5


def test_a_round_figure_counts_a_candidate_that_finished_below_the_cut_as_still_eligible(gen):
    """A short answer that finishes before a decision point and ranks below the cut is retired, not pruned: the
    figure's title says so, where a bare "kept 4 of 5" would leave the reader taking it for pruned. Under a reward
    that scores an answer by its length, an answer that finished before a decision point has stopped growing, so it
    is among the shortest at the next one: a short poem has such answers whatever the CPU's texts (the first seed
    with one is taken)."""
    from components.controls import RunSettings
    from sbon.analysis.comparison import ComparisonReady, comparison_events as events
    from sbon.rewards import CallableReward

    reward = CallableReward(lambda prompt, responses: [len(r) for r in responses], name="length")
    for seed in range(1, 7):
        settings = RunSettings(prompt="Write a haiku about a lighthouse in winter.", n=6, seed=seed, max_new_tokens=40,
                               bon_same_memory=False)
        comp = next(e.comparison for e in events(gen, reward, settings.prompt, settings.config(), signals=())
                    if isinstance(e, ComparisonReady))
        errors, read = title_errors(comp)
        assert errors == []
        if any(point.retired for point in read):
            break
    else:
        pytest.skip("no answer of these seeds finished before a decision point and below the cut, on this CPU")


# Each scenario of the page, short, plus the own-instructions run whose captions once changed their reason:
# (scenario, prompt, instructions) -> the run's live captions at each decision point and its comparison.
OWN_INSTRUCTIONS = json.dumps([{"id": "change_case:english_lowercase"}, {"id": "punctuation:no_comma"}])
FRESH_RUNS = {"instructions": None, "helpful": None, "fluency": None,
              "own-instructions": ("instructions", "Write a short poem about autumn", OWN_INSTRUCTIONS)}


@pytest.fixture(scope="module", params=list(FRESH_RUNS))
def fresh_run(request, gen):
    """A short run of a scenario as the page starts it (its reward, pruning signal and first example prompt), every
    live caption taken as the page shows it at each decision point, stopped once both answers are in."""
    from components.controls import RunSettings
    from components.live import LiveTracker
    from components.scenarios import SCENARIOS
    from sbon.analysis.comparison import ComparisonReady, comparison_events as events
    from sbon.models import load_reward

    key, prompt, instructions = FRESH_RUNS[request.param] or (request.param, None, "")
    scenario = SCENARIOS[key]
    settings = RunSettings(**{**scenario.settings(), "prompt": prompt or scenario.prompts[0], "max_new_tokens": 24},
                           n=6, seed=1, instructions=instructions, bon_same_memory=False)
    settings.check()
    reward = settings.reward_for_run(load_reward(settings.reward, generator=gen))
    tracker, live = LiveTracker(settings.max_new_tokens, reward=settings.reward), []
    for event in events(gen, reward, settings.prompt, settings.config(), signals=()):
        if tracker.update(event):
            live.append(tracker.caption())
        if isinstance(event, ComparisonReady):
            return live, event.comparison
    raise AssertionError("the run stopped without both answers")


def test_every_clause_of_every_round_caption_reads_true_live_and_at_the_end_of_a_fresh_run(fresh_run):
    live, comp = fresh_run
    points = comp.speculative.decision_points
    assert points and len(live) == len(points)
    assert final_caption_errors(comp) == []
    errors = [e for point, caption in zip(points, live) for e in caption_errors(caption, point, comp.speculative.reward)]
    assert errors == []
    # the rounds figure's title counts as the captions do: a candidate that finished below the cut is not "not kept"
    assert title_errors(comp)[0] == []
    # one cut, one reason: the live caption says what the final one says of the round, less what only the end knows
    from components.rounds import run_captions

    for caption, final, point in zip(live, run_captions(comp), points):
        told = [c for c in final.split(" · ") if not c.startswith("Best-of-N's pick")]
        told[0] = f"Round {point.round}"
        assert caption.split(" · ")[:len(told)] == told
