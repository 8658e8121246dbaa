"""Tables and text of a finished comparison: every candidate, one candidate in full, the savings.

Model text is never trusted as markup: tables carry it as plain strings and the candidate view
escapes it before wrapping it in HTML.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from sbon.analysis.comparison import Comparison, headline_text, wall_time_text
from sbon.analysis.counterfactual import partial_final_stats
from sbon.machine import how_decoded, machine_device
from sbon.machine_load import busy
from sbon.config import METHOD_SPECS
from sbon.metrics import decision_quality
from sbon.models import generator_title, reward_title
from sbon.results import DecisionPoint, RunResult
from sbon.signals import signal_description, signal_title

from .fates import fate_color, fate_help
from .instructions import instruction_title
from .page_text import machine_words
from .reasons import candidate_reasons, decimals, explanations, explanations_html, fmt, pruning_cost, reward_scale

OUTCOME_WORDS = {"kept": "kept", "pruned": "pruned", "retired": "finished below the cut, still eligible"}
GENERATED_STYLE = "background:#d8f3dc;border-radius:3px"
NEVER_STYLE = "color:#6c757d;background:#f1f3f5;text-decoration:line-through;text-decoration-color:#adb5bd"


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), digits)


def partial_column(point: DecisionPoint) -> str:
    """The candidates table's column of one decision point's scores: 'score in round 1 (32 tokens)'."""
    return f"score in round {point.round} ({point.tokens} tokens)"


def candidates_table(comp: Comparison) -> pd.DataFrame:
    """One row per candidate: fate, tokens, partial reward at each decision point, final reward, text."""
    points = comp.speculative.decision_points
    digits = {p.round: decimals(p.scores) for p in points}
    final_digits = decimals(comp.final_reward(c.id) for c in comp.speculative.candidates)
    rows = []
    for c in comp.speculative.candidates:
        row = {"candidate": c.id, "fate": comp.speculative.fate(c.id),
               "round pruned": "" if c.pruned_round is None else str(c.pruned_round),
               "tokens": c.tokens_generated, "tokens in Best-of-N": comp.bon.candidates[c.id].tokens_generated}
        for p in points:
            partial = c.partial_reward_at(p.round)
            row[partial_column(p)] = "" if partial is None else f"{partial:.{digits[p.round]}f}"
        row["final reward"] = _round(comp.final_reward(c.id), final_digits)
        reasons = candidate_reasons(comp.speculative, c.id)
        row["last decision"] = f"round {reasons[-1].round}: {reasons[-1].text()}" if reasons else ""
        row["cost of pruning"] = pruning_cost(comp, c.id)
        row["final from"] = final_source(comp, c.id)
        row["returned"] = " ".join(label for label, run in (("Speculative Rejection", comp.speculative), ("Best-of-N", comp.bon))
                                   if run.best_id == c.id and run.best.text.startswith(c.text))
        row["text"] = c.text
        rows.append(row)
    return pd.DataFrame(rows)


def final_source(comp: Comparison, k: int) -> str:
    """Which run completed the response candidate k's final reward scores (or why it has none)."""
    if comp.speculative.candidates[k].final_reward is not None:
        return "this run" + (" (Best-of-N's version is another text)" if comp.diverged(k) else "")
    return "none: Best-of-N's version is another text" if comp.diverged(k) else "Best-of-N"


def candidate_choices(comp: Comparison) -> list[tuple[str, int]]:
    """(label, id) for the candidate picker: the fate beside the id, so pruned ones are easy to find."""
    return [(f"{c.id} · {comp.speculative.fate(c.id)}", c.id) for c in comp.speculative.candidates]


def candidate_detail_html(comp: Comparison, k: int, reward: object = None) -> str:
    """Candidate k in full: why it was kept or cut at each decision point, what pruning it cost,
    what it generated (highlighted) and, if it was pruned, the continuation it never got, taken from
    Best-of-N. ``reward``, if it has ``explain(prompt, response, final)``, adds its per-instruction
    reasons. All model text is HTML-escaped."""
    if not 0 <= k < comp.n:
        return "<p>Pick a candidate.</p>"
    c = comp.speculative.candidates[k]
    name = comp.speculative.fate(k)
    scale = reward_scale(comp.speculative.reward)
    final = comp.final_reward(k)
    digits = decimals(comp.final_reward(j) for j in range(comp.n))
    source = ("" if c.final_reward is not None else " (from Best-of-N: this run never finished it)" if final is not None
              else " (this run never finished it, and Best-of-N's candidate of this number is another text)")
    badges = "".join(f' <span style="border:1px solid #999;border-radius:4px;padding:0 4px">{label} returned this</span>'
                     for label, run in (("Speculative Rejection", comp.speculative), ("Best-of-N", comp.bon))
                     if run.best_id == k and run.best.text.startswith(c.text))
    reasons = "".join(f"<li>round {r.round} (after {r.tokens} tokens): <b>{OUTCOME_WORDS[r.outcome]}</b>, {html.escape(r.text())}</li>"
                      for r in candidate_reasons(comp.speculative, k)) or "<li>never ranked: it finished before the first decision point</li>"
    cost = pruning_cost(comp, k)
    cost_html = f'<p style="font-weight:600">✂ The cost of pruning: {html.escape(cost)}.</p>' if cost else ""
    explained = explanations(reward, comp.speculative.prompt, c.text, c.finished)
    continuation = comp.continuation(k)
    text = f'<span class="sbon-generated" style="{GENERATED_STYLE}">{html.escape(c.text)}</span>'
    if continuation:
        text += f'<span class="sbon-never" style="{NEVER_STYLE}">{html.escape(continuation)}</span>'
    legend = (f'<span style="{GENERATED_STYLE};padding:0 4px">generated</span>'
              + (f' <span style="{NEVER_STYLE};padding:0 4px">never generated: the Best-of-N continuation, '
                 f'{comp.bon.candidates[k].tokens_generated - c.tokens_generated} more tokens</span>' if continuation else ""))
    twin = ""
    if comp.diverged(k):  # bfloat16 rounding flipped a token: show the Best-of-N text on its own
        twin = (f'<p>Its Best-of-N twin diverged from this text (rounding in reduced precision), so there is no '
                f'continuation to show; the Best-of-N text was:</p><div style="white-space:pre-wrap;{NEVER_STYLE};'
                f'text-decoration:none;padding:10px;border-radius:6px">{html.escape(comp.bon.candidates[k].text)}</div>')
    return (f'<div class="sbon-candidate">'
            f'<p><b>Candidate {k}</b> · <span style="color:{fate_color(name)};font-weight:600">{name}</span> · '
            f'{c.tokens_generated} tokens generated{badges}</p>'
            f'<p>final reward {fmt(final, digits)}{source} · judged by {html.escape(reward_title(comp.speculative.reward))}: '
            f'{html.escape(scale.short())}</p>'
            f'<p>At each decision point (ranked by {html.escape(_signals(comp))}):</p><ul class="sbon-reasons">{reasons}</ul>'
            f'{cost_html}{explanations_html(explained)}'
            f'<div style="white-space:pre-wrap;font-family:ui-monospace,monospace;line-height:1.5;border:1px solid #dee2e6;'
            f'border-radius:6px;padding:10px">{text}</div>'
            f'<p style="font-size:0.9em">{legend}</p>{twin}</div>')


def _signals(comp: Comparison) -> str:
    """The pruning signals of the run's decision points (live candidates; finished ones by final reward)."""
    return ", ".join(sorted({signal_title(p.signal) for p in comp.speculative.decision_points})) or "the reward"


def first_pruned(comp: Comparison) -> int:
    """The candidate the detail view opens on: the first pruned one (the interesting case), else 0."""
    return next((c.id for c in comp.speculative.candidates if c.pruned_round is not None), 0)


# -- savings ------------------------------------------------------------------------------------------

def savings_table(comp: Comparison) -> pd.DataFrame:
    """Both methods side by side: first what the runs themselves determine (steps, tokens, scores, the null
    model), then what this machine measured (wall time). Each row's meaning: ``column_help(row name)``."""
    m, bon, sbon = comp.metrics, comp.bon, comp.speculative
    rows = [
        ("candidates", comp.n, comp.n),
        ("sequential decode steps", bon.decode_steps, sbon.decode_steps),
        ("decode-step speedup", "", f"{m['step_speedup']:.2f}×"),
        ("tokens generated", bon.total_tokens, sbon.total_tokens),
        (TOKEN_SHARE, "100%", f"{m['token_rate']:.0%}"),
        ("decision points", "–", len(sbon.decision_points)),
        ("batches", _batches(bon), 1),
        ("returned candidate", bon.best_id, sbon.best_id),
        ("its final reward", f"{bon.best.final_reward:.3f}", f"{sbon.best.final_reward:.3f}"),
        ("normalized score", "100", f"{m['normalized_score']:.1f}"),
        ("random pruning, same survivor counts: normalized score", "", f"{m['random_pruning_normalized_score']:.1f}"),
        ("wall time (s)" + (f" on {machine_words(sbon.machine)}" if sbon.machine else ", machine not recorded"),
         f"{bon.wall_time:.2f}", f"{sbon.wall_time:.2f}"),
        (SPEEDUP, "", f"{m['speedup']:.2f}×"),
        ("tokens per second", f"{bon.total_tokens / bon.wall_time:.1f}", f"{sbon.total_tokens / sbon.wall_time:.1f}"),
        ("machine busy (other processes' cores)", _busy(bon), _busy(sbon)),
        (f"Best-of-M at the same time (M={m['best_of_m']}): normalized score", "",
         f"{m['best_of_m_normalized_score']:.1f}"),
    ]
    return pd.DataFrame([(a, str(b), str(c)) for a, b, c in rows],
                        columns=["", "Best-of-N", METHOD_SPECS[sbon.method].label])


def _busy(run: RunResult) -> str:
    others = run.load.get("others_cores") if run.load else None
    if not run.load:
        return "not measured"
    return ("yes" if busy(run.load) else "no") + (f" ({others:.1f} of {run.load['cores']})" if others is not None else "")


TOKEN_SHARE = "share of Best-of-N's tokens generated"
ORACLE_CUT = "prunable, keeping the best (c*)"  # views.CORRELATION_NAMES names it the same
SPEEDUP = "times faster (Best-of-N's wall time ÷ Speculative Rejection's)"

# Every column, row and metric the views show, by its name there -> one line saying what it means (for a tooltip
# or a legend). Pruning signals explain themselves in their registry (sbon.signals: title, description).
HELP: dict[str, str] = {
    # the candidates table
    "candidate": "the candidate's number: with the same seed, candidate k is the same response in both runs",
    "fate": "what Speculative Rejection did with it: survived, finished early, or pruned in round r",
    "round pruned": "the decision point at which it was pruned (empty: never pruned)",
    "tokens": "tokens it generated in Speculative Rejection's run",
    "tokens in Best-of-N": "tokens its twin generated in Best-of-N's run (the whole response)",
    "score in round": "its partial score at that decision point (after that many tokens) by the run's pruning signal",
    "final reward": "the reward model's score of the complete response (from Best-of-N when it was pruned)",
    "last decision": "where it stood at its last decision point: rank, score and the cut it had to reach",
    "cost of pruning": "what pruning it cost: its Best-of-N twin was the winner, or beat the returned response",
    "final from": "which run completed the response its final reward scores",
    "returned": "the method(s) that returned this candidate",
    "text": "what it generated in Speculative Rejection's run",
    # the savings table and the headline
    "candidates": "N: responses each method started",
    "sequential decode steps": "decode steps run one after another (one token for every live candidate of a batch); "
                               "set by the seed and settings, the same under any load",
    "decode-step speedup": "Best-of-N's sequential decode steps / Speculative Rejection's: the speedup where a step "
                           "costs the same for few or many candidates (memory-bound decoding)",
    "tokens generated": "tokens generated over all candidates: the compute a compute-bound machine pays",
    TOKEN_SHARE: "the share of Best-of-N's tokens Speculative Rejection generated (the token rate)",
    "decision points": "how many times Speculative Rejection ranked its candidates and pruned",
    "batches": "how Best-of-N ran: all candidates at once, or batches that fit Speculative Rejection's memory",
    "returned candidate": "the candidate with the best final reward among the completed ones",
    "its final reward": "the returned candidate's final reward",
    "normalized score": "100 = Best-of-N's best response, 0 = its worst (the paper's metric)",
    "random pruning, same survivor counts: normalized score": "the null model: what pruning at random (same decision "
                                                              "points, same survivor counts) scores on average, from "
                                                              "Best-of-N's candidates",
    "wall time (s)": "seconds this machine took: it depends on the machine and on what else ran on it",
    SPEEDUP: "Best-of-N's wall time / Speculative Rejection's (the paper's speedup, T_BoN / T_SBoN)",
    "tokens per second": "tokens generated / wall time",
    "machine busy (other processes' cores)": "whether other processes used more than half a core on average while "
                                             "the run ran: then its wall time is an upper bound",
    "Best-of-M at the same time": "Best-of-M with M = N / wall-time speedup: what the same time buys without pruning",
    # the correlation table
    "decision token τ": "the decision point's token count in the replay on Best-of-N's candidates",
    "live candidates": "Best-of-N's candidates still generating at τ: those the correlations are over",
    "Pearson": "linear correlation of partial and final rewards (1 = perfectly linear)",
    "Kendall": "rank correlation of partial and final rewards (1 = same order, 0 = no relation)",
    ORACLE_CUT: "the largest fraction that could be pruned there and still keep Best-of-N's winner (the oracle cut c*)",
}


def column_help(name: str) -> str:
    """The one-line explanation of a column, row or metric of these tables ('' for none): by its exact name, or
    by the name it starts with ('score in round 2 (51 tokens)', 'Best-of-M at the same time (M=6)…'), or a pruning signal's."""
    if name in HELP:
        return HELP[name]
    start = next((key for key in HELP if name.startswith(key)), None)
    return HELP[start] if start else fate_help(name) or signal_description(name)


def _batches(bon: RunResult) -> str:
    batches = bon.batches
    return f"{len(batches)} of ≤{len(batches[0])} (the memory Speculative Rejection needed)" if len(batches) > 1 else "1"


def md_escape(text: str) -> str:
    """Text from a run or a file, safe inside Markdown: no markup, no HTML."""
    text = html.escape(text.replace("\n", " "), quote=False)
    # Inline text: the characters that start inline markup need a backslash, and so do ':', '.' and
    # '@', or the renderer turns a bare URL, www.host or e-mail address in model text into a link.
    return "".join("\\" + ch if ch in "\\`*_[]|~:.@" else ch for ch in text)


def run_description(comp: Comparison, origin: str) -> str:
    """One line of Markdown saying which run the views show and with which settings."""
    s, bon = comp.speculative.settings, comp.bon
    batches = f" · Best-of-N in batches of {len(bon.batches[0])} (same memory)" if len(bon.batches) > 1 else ""
    prompt = comp.speculative.prompt if len(comp.speculative.prompt) <= 120 else comp.speculative.prompt[:119] + "…"
    judged_by = comp.speculative.instructions
    instructions = (f" · instructions: {'; '.join(md_escape(instruction_title(i)) for i in judged_by)}"
                    if judged_by else "")
    return (f"**Showing:** {md_escape(origin)} · {md_escape(generator_title(comp.speculative.generator))} judged by "
            f"{md_escape(reward_title(comp.speculative.reward))} · {METHOD_SPECS[comp.speculative.method].label}, N={comp.n}, "
            f"α={s.get('alpha')}, "
            f"max {s.get('max_new_tokens')} tokens, seed {s.get('seed')}{batches} · prompt: “{md_escape(prompt)}”"
            f"{instructions}")


# Where the app is still measuring this machine's decode paths: its choice may take a faster weight format or step,
# which rounds differently.
MEASURING = ("the app is still measuring faster ways of decoding here, and a Run on one of them may give other "
             "candidates")


def reproduction_note(comp: Comparison, machine: str, weights: str | None, decode: str | None,
                      settled: bool = True) -> str:
    """One line for a run recorded elsewhere or earlier: "Press ▶ Run to reproduce it" only where a Run here (this
    ``machine`` class, ``weights`` format and ``decode`` path; None: not known yet) gives the same candidates, else
    what differs and what that means. ``settled``: later runs decode as one starting now; False while the app is
    still measuring or building this machine's decode paths, whose choice may change both."""
    run = comp.speculative
    if run.machine is None:
        return ("It was saved without the machine it ran on: a Run here with its settings may give other candidates.")
    differ = []
    if run.machine != machine:
        there, here = machine_words(run.machine), machine_words(machine)
        differ.append(f"it ran on {there}, this machine is {here}" if there != here else
                      f"it ran on {there} with other processor features in use than here")
    # Where a Run here decodes otherwise: what is known of both paths (the step here once the models are loaded).
    if (run.weights and weights and run.weights != weights) or (run.decode and decode and run.decode != decode):
        there = how_decoded(run.weights if weights else None, run.decode if decode else None,
                            machine_device(run.machine))
        here = how_decoded(weights if run.weights else None, decode if run.decode else None, machine_device(machine))
        differ.append(f"it decoded {there}; a Run here decodes {here}")
    if differ:
        return (f"A Run here with its settings may give other candidates than this recording: {'; '.join(differ)}, "
                "and they round differently.")
    if decode is None and run.decode:
        how = how_decoded(run.weights, run.decode, machine_device(machine))
        note = (f"It ran on this kind of machine and decoded {how}: a Run here reproduces it once the models are "
                "loaded to decode the same way")
        return f"{note}." if settled else f"{note}; {MEASURING}."
    if not settled:
        return f"Press ▶ Run to reproduce it now, while runs here decode the same way: {MEASURING}."
    return "Press ▶ Run to reproduce it: this machine, decoding the same way, gives the same candidates."


def headline_parts(comp: Comparison) -> tuple[str, str]:
    """(headline, wall time) in Markdown: the headline holds only what the runs themselves determine (decode
    steps, tokens, scores, the random-pruning null model), identical for the same seed and settings under any
    load; the second line is the wall time this machine measured, with a warning when it was busy."""
    return headline_text(comp, strong=lambda text: f"**{text}**"), wall_time_text(comp, name=machine_words)


def headline(comp: Comparison) -> str:
    """The headline, then the wall-time line (see :func:`headline_parts`), as two paragraphs of Markdown."""
    return "\n\n".join(headline_parts(comp))


def answers_checked(comp: Comparison, reward: object = None) -> str:
    """Markdown: for a reward that explains itself (``explain``), how many of its checks each method's answer
    passes -- e.g. how many of the prompt's instructions Best-of-N's and Speculative Rejection's answers follow."""
    lines = []
    for label, run in (("Best-of-N", comp.bon), ("Speculative Rejection", comp.speculative)):
        if run.best is None:
            continue
        verdicts = explanations(reward, comp.speculative.prompt, run.best.text, True)
        if not verdicts or any(status == "⚠" for status, _ in verdicts):
            return ""
        passed = sum(status == "pass" for status, _ in verdicts)
        lines.append(f"{label}'s answer passes **{passed} of {len(verdicts)}** of the reward's checks")
    return ("; ".join(lines) + ".") if lines else ""


def prediction_report(comp: Comparison) -> str:
    """Markdown: how well this run's partial rewards predicted the final ones at each decision point,
    and what that meant for Best-of-N's winner -- the assumption the method stands on, checked."""
    quality = decision_quality(comp.bon, comp.speculative)
    if not quality:
        why = comp.speculative.why_no_decision_point() or "no decision point"
        return (f"{why[0].upper()}{why[1:]}: nothing was pruned, so Speculative Rejection was Best-of-N here and "
                "there is no prediction to check (a longer answer limit, a smaller first decision or a smaller budget "
                "brings decision points).")
    winner = (f"Best-of-N's winner is candidate {comp.bon.best_id}" if comp.twin(comp.bon.best_id) else
              f"Best-of-N's winner, candidate {comp.bon.best_id}, came out differently in this run, so it was never "
              "among these candidates")
    intro = (f"**Did the partial rewards predict the final ones?** Reward: {md_escape(reward_title(comp.speculative.reward))}. "
             "Kendall correlation of the live candidates' scores at each decision point against their final rewards "
             f"(1 = same order, 0 = no relation); {winner}.")
    items = []
    for q in quality:
        kendall = "n/a" if math.isnan(q["kendall"]) else f"{q['kendall']:.2f}"
        fate = "" if q["winner"] == "diverged" else f"; Best-of-N's winner {WINNER_WORDS[q['winner']]}"
        items.append(f"- round {q['round']}, after {q['tokens']} tokens, by {md_escape(signal_title(q['signal']))}: Kendall "
                     f"{kendall} over {q['live']} live candidate{'' if q['live'] == 1 else 's'}{fate}.")
    first = quality[0]["kendall"]
    if math.isnan(first) or first < 0.3:
        verdict = ("At the first decision point the scores barely ranked the candidates as their final rewards "
                   "do: pruning there is close to a random cut, and any match with Best-of-N is partly luck.")
    elif first < 0.5:
        verdict = ("The scores ranked the candidates partly as their final rewards do: early pruning risks "
                   "losing the eventual best.")
    else:
        verdict = "The scores ranked the candidates much as their final rewards do: the paper's assumption held here."
    # blank lines around the list: without them Markdown runs the last item and the verdict into one sentence
    return "\n\n".join((intro, "\n".join(items), verdict))


WINNER_WORDS = {"kept": "survived", "pruned": "was **pruned** here", "retired": "had finished and fell below the cut (still eligible)",
                "out": "was no longer in contention"}


def returned_text(run: RunResult, name: str) -> tuple[str, str]:
    """(label, text) of the response one method returned, as soon as that run is done."""
    return f"{name} returned candidate {run.best.id} (final reward {run.best.final_reward:.3f})", run.best.text


def early_answer(run: RunResult, excerpt: int = 400) -> str:
    """Markdown: what Speculative Rejection returned, shown under the race while Best-of-N still runs."""
    best = run.best
    text = best.text if len(best.text) <= excerpt else best.text[:excerpt].rsplit(" ", 1)[0] + " …"
    tokens, points = sum(c.tokens_generated for c in run.candidates), len(run.decision_points)
    return (f"**Speculative Rejection answered after {run.wall_time:.1f} s** with candidate {best.id} "
            f"(final reward {best.final_reward:.3f}), {tokens} tokens generated over {points} decision "
            f"point{'' if points == 1 else 's'}; Best-of-N's answer and the comparison follow.\n\n"
            + "\n".join(f"> {line}" if line.strip() else ">" for line in html.escape(text).splitlines()))


def returned_texts(comp: Comparison) -> tuple[str, str, str, str]:
    """(label, text) of the response each method returned, Best-of-N first; shown in plain textboxes."""
    return (*returned_text(comp.bon, "Best-of-N"), *returned_text(comp.speculative, "Speculative Rejection"))


CORRELATION_COLUMNS = {"tau": "decision token τ", "candidates": "live candidates", "pearson": "Pearson",
                       "kendall": "Kendall", "oracle_cut": ORACLE_CUT}  # the analysis' names -> the page's


def correlation_table(comp: Comparison) -> pd.DataFrame:
    """Per decision token of the counterfactual replay: Pearson, Kendall and the oracle cut c*."""
    if not comp.partials:
        return pd.DataFrame(columns=list(CORRELATION_COLUMNS.values()))
    return partial_final_stats(comp.bon, comp.partials).round(3).rename(columns=CORRELATION_COLUMNS)
