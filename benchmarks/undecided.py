"""`python -m benchmarks undecided`: what a decision point should do with the candidates its pruning signal
cannot tell apart from the cut (the ``undecided`` setting, ``sbon.cut.UNDECIDED``), measured where it can fail.

Per prompt, one Best-of-N run; then, per rule, the Speculative Rejection run (memory-budget rounds, its default
budget, the same seed) replayed on Best-of-N's candidates (``sbon.analysis.replay.replay_rounds``: with coupled
sampling the run samples exactly these candidates, and the replay goes through the run's own cut, scores and
budget; ``--check`` runs the first prompts for real too and records whether each rule's run agrees). Per rule:

- the answer's quality: with the ``ifeval`` reward, whether it follows every instruction (prompt-level strict);
  with another reward, its normalized score (Best-of-N's winner = 100, its worst candidate = 0);
- the same for random pruning at the same decision points and counts (``sbon.metrics.random_pruning_reward``,
  on the indicator of following every instruction for ``ifeval``: the chance that random pruning keeps a response
  that does), and for Best-of-N;
- the token rate (Speculative Rejection's tokens / Best-of-N's), decision points, how many candidates were
  undecided, and whether Best-of-N's winner was pruned while undecided (or pruned at all).

Prompts: ``--set ifeval``, the shipped IFEval file's evaluation split (even key; the calibration uses odd keys);
``--set helpful``, the page's helpful scenario's held-out AlpacaEval prompts (``benchmarks.default_scenario``), with
``minilm-pref``. ``--minutes`` bounds the run: no new prompt starts after it; the file is rewritten after every
prompt. Result file: benchmarks/results/cpu-2core-epyc/undecided/<set>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Sequence

import torch

from sbon.algorithms import events, plan_budget, run
from sbon.analysis.replay import replay_rounds
from sbon.config import RunConfig
from sbon.cut import UNDECIDED
from sbon.errors import SBoNError
from sbon.metrics import normalized_score, random_pruning_reward
from sbon.models import load_generator, load_reward
from sbon.results import RunResult
from sbon.rewards import bind_instructions
from sbon.signals import RewardSignal

from . import common

OUT_DIR = common.DEFAULT_OUT_DIR / "cpu-2core-epyc" / "undecided"
SETS = {"ifeval": "ifeval", "helpful": "minilm-pref"}  # prompt set -> its reward


def prompts_of(name: str, k: int, offset: int) -> list[dict[str, Any]]:
    from .ifeval import evaluation_prompts
    from .default_scenario import scenario_prompts

    if name == "ifeval":
        rows, _ = evaluation_prompts(k, offset)
        return [{"id": p.key, "prompt": p.prompt,
                 "instructions": [{"id": i, **{a: v for a, v in kw.items() if v is not None}}
                                  for i, kw in zip(p.instruction_ids, p.kwargs)]} for p in rows]
    return scenario_prompts("helpful", k + offset, 30)[offset:]


def followed(reward, prompt: str, text: str) -> float:
    return float(all(v.followed for v in reward.explain(prompt, text, final=True)))


def quality(reward, bon: RunResult, k: int) -> float:
    """Candidate k as the answer: followed every instruction (ifeval), else its normalized score on Best-of-N's."""
    if hasattr(reward, "explain"):
        return followed(reward, bon.prompt, bon.candidates[k].text)
    return normalized_score(bon.final_rewards, bon.candidates[k].final_reward)


def random_quality(reward, bon: RunResult, sr: Any) -> float:
    """Random pruning at sr's decision points and counts, on Best-of-N's candidates."""
    if hasattr(reward, "explain"):
        indicator = copy.deepcopy(bon)
        for c in indicator.candidates:
            c.final_reward = followed(reward, bon.prompt, c.text)
        return random_pruning_reward(indicator, sr)
    return normalized_score(bon.final_rewards, random_pruning_reward(bon, sr))


def prompt_row(gen, reward, item: dict, rules: Sequence[str], n: int, max_new_tokens: int, alpha: float,
               seed: int, check: bool, bon: RunResult | None = None, generated: float | None = None) -> dict[str, Any]:
    """Best-of-N once (or the one given, saved by an earlier run), then each rule's memory-budget run replayed on
    its candidates (``replay_rounds``: the run's own cut, scores and budget; ``check`` also runs each rule for real
    and records whether they agree). The row keeps Best-of-N's run, so ``--from`` replays the rules again."""
    reward = bind_instructions(reward, item["prompt"], item.get("instructions"))
    config = RunConfig(n=n, max_new_tokens=max_new_tokens, alpha=alpha, seed=seed)
    if bon is None:
        start = time.perf_counter()
        bon = run(events(gen, reward, item["prompt"], config.replace(method="bon")))
        generated = time.perf_counter() - start
    replayed = time.perf_counter()
    signal = RewardSignal(reward)
    prompt_tokens = len(gen.encode_prompt(item["prompt"]))
    _, budget = plan_budget(gen, prompt_tokens, n, None, max_new_tokens)
    seen: dict[tuple[int, int], tuple[float, float | None]] = {}

    def score_at(t: int, ids: list[int]):
        # A candidate's score after t tokens depends on its own text alone: scored once for every rule.
        fresh = [k for k in ids if (t, k) not in seen]
        if fresh:
            texts = [gen.decode(bon.candidates[k].token_ids[:t]) for k in fresh]
            margins = signal.uncertainty(item["prompt"], fresh, texts) if signal.knows_uncertainty else None
            seen.update({(t, k): (score, None if margins is None else margins[j])
                         for j, (k, score) in enumerate(zip(fresh, signal.score(item["prompt"], fresh, texts)))})
        margins = [seen[(t, k)][1] for k in ids]
        return [seen[(t, k)][0] for k in ids], None if any(m is None for m in margins) else margins

    row: dict[str, Any] = {"id": item["id"], "item": item, "bon_run": bon.to_dict(), "prompt_tokens": prompt_tokens,
                           "kv_budget": budget,
                           "bon": {"quality": quality(reward, bon, bon.best_id), "winner": bon.best_id,
                                   "tokens": bon.total_tokens}}
    for rule in rules:
        replay = replay_rounds(bon, prompt_tokens, budget, alpha, score_at, rule, seed, signal.tie)
        points, winner = replay.points, bon.best_id
        row[rule] = {"quality": quality(reward, bon, replay.best_id),
                     "random": random_quality(reward, bon, SimpleNamespace(decision_points=points)),
                     "token_rate": replay.tokens / bon.total_tokens, "winner": replay.best_id,
                     "decision_points": len(points), "decision_tokens": [p.tokens for p in points],
                     "undecided": [len([k for k in p.undecided if k not in p.final]) for p in points],
                     "applied": [p.undecided_rule for p in points], "tied": [p.tied for p in points],
                     "bon_winner_pruned": float(any(winner in p.pruned for p in points)),
                     "bon_winner_pruned_undecided": float(any(winner in p.pruned and winner in p.undecided
                                                              for p in points)),
                     "bon_winner_pruned_how": pruned_how(points, winner, rule),
                     "waits": waits(points) if rule == "defer" else []}
        if check:
            real = run(events(gen, reward, item["prompt"], config.replace(undecided=rule)))
            row[rule]["real_run_agrees"] = (real.best_id == replay.best_id and real.total_tokens == replay.tokens and
                                            [(p.tokens, p.survivors) for p in real.decision_points] ==
                                            [(p.tokens, p.survivors) for p in points])
    row["seconds"] = {"best_of_n": generated, "replays": time.perf_counter() - replayed}
    return row


PRUNED_HOW = {  # how a decision point pruned Best-of-N's winner while it was undecided
    "rank": "ranked below the cut by score and candidate number (the paper's rule)",
    "draw": "not drawn for a survivor's place (random; defer: after its wait)",
    "budget": "halted so the survivors fit the memory budget",
}


def pruned_how(points: Sequence, winner: int, rule: str) -> dict[str, Any] | None:
    """Where and how the rule pruned Best-of-N's winner while it was undecided (a key of ``PRUNED_HOW``), and whether
    it had waited at the decision point before (``defer``); None when it was not pruned so."""
    for i, p in enumerate(points):
        if winner in p.pruned and winner in p.undecided:
            how = "budget" if winner in p.forced else "rank" if rule == "paper" else "draw"
            before = points[i - 1] if i else None
            return {"decision_point": i + 1, "tokens": p.tokens, "how": how,
                    "waited": bool(before and winner in before.undecided and winner in before.survivors)}
    return None


def waits(points: Sequence) -> list[dict[str, Any]]:
    """``defer``: each wait, from a decision point that kept undecided candidates to the next one: how many tokens it
    lasted, how many candidates waited, how many of them were still undecided after it and how many survived it."""
    out = []
    for before, after in zip(points, points[1:]):
        waited = [k for k in before.undecided if k in before.survivors and k not in before.final]
        if waited:
            out.append({"tokens": after.tokens - before.tokens, "waited": len(waited),
                        "still_undecided": len([k for k in waited if k in after.undecided]),
                        "kept": len([k for k in waited if k in after.survivors])})
    return out


def summarize(rows: Sequence[dict], rules: Sequence[str]) -> dict[str, Any]:
    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else None

    out = {"prompts": len(rows), "bon": mean(r["bon"]["quality"] for r in rows)}
    for rule in rules:
        out[rule] = {name: mean(r[rule][name] for r in rows) for name in
                     ("quality", "random", "token_rate", "decision_points", "bon_winner_pruned",
                      "bon_winner_pruned_undecided")}
        out[rule]["undecided_per_point"] = mean(u for r in rows for u in r[rule]["undecided"])
        out[rule]["points_with_undecided"] = mean(float(u > 0) for r in rows for u in r[rule]["undecided"])
        out[rule]["points_tied"] = mean(float(x) for r in rows for x in r[rule]["tied"])
        hows = [r[rule].get("bon_winner_pruned_how") for r in rows]
        out[rule]["bon_winner_pruned_undecided_by"] = {h: sum(1 for x in hows if x and x["how"] == h)
                                                       for h in PRUNED_HOW}
        out[rule]["bon_winner_pruned_undecided_after_wait"] = sum(1 for x in hows if x and x["waited"])
        spans = [w for r in rows for w in r[rule].get("waits", [])]
        out[rule]["waits"] = {"count": len(spans), "tokens_mean": mean(w["tokens"] for w in spans),
                              "waited": sum(w["waited"] for w in spans),
                              "still_undecided": sum(w["still_undecided"] for w in spans),
                              "kept": sum(w["kept"] for w in spans)}
        checked = [r[rule]["real_run_agrees"] for r in rows if "real_run_agrees" in r[rule]]
        out[rule]["real_runs_checked"], out[rule]["real_runs_agree"] = len(checked), sum(checked)
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("undecided", help="what a decision point does with candidates its signal cannot tell apart "
                                         "from the cut: each rule against Best-of-N and random pruning")
    p.add_argument("--set", choices=list(SETS), default="ifeval", help="the prompt set (and its reward)")
    p.add_argument("--rules", nargs="+", choices=list(UNDECIDED), default=list(UNDECIDED))
    p.add_argument("--k", type=int, default=1000, help="at most this many prompts")
    p.add_argument("--offset", type=int, default=0, help="skip the set's first prompts")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", type=int, default=2, help="on the first this many prompts, also run each rule for "
                                                      "real and record whether it agrees with the replay (with --from "
                                                      "or --resume: on the file's first rows; a row not checked again "
                                                      "keeps its earlier check while its replay is unchanged)")
    p.add_argument("--minutes", type=float, default=30.0, help="start no new prompt after this long")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", default=None, help="result file (default: results/cpu-2core-epyc/undecided/<set>.json)")
    p.add_argument("--from", dest="from_file", default=None,
                   help="replay the rules again on the Best-of-N runs saved in this result file (no generation) and "
                        "rewrite it")
    p.add_argument("--resume", action="store_true",
                   help="keep the prompts the result file already holds (their Best-of-N runs, replayed again under "
                        "the current cut rule) and generate only the others: a long run can be stopped and continued")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(main=main)


class Models:
    """The generator and the reward that scores with it, per weight format, each loaded once: a saved row is
    replayed with the weights its Best-of-N run used (a file may hold rows of several formats)."""

    def __init__(self, reward: str, gen=None, scorer=None):
        self.reward, self.loaded = reward, {}
        if gen is not None:
            self.loaded[getattr(gen, "weights", None)] = gen, scorer

    def __call__(self, row: dict) -> tuple:
        weights = row["bon_run"].get("weights")
        if weights not in self.loaded:
            gen = load_generator(weights=weights)
            self.loaded[weights] = gen, load_reward(self.reward, generator=gen)
        return self.loaded[weights]


def replay_again(path: Path, rules: Sequence[str], check: int = 0, command: str = "") -> int:
    """Every row of a result file replayed again from its saved Best-of-N run, under the current cut rule; the first
    ``check`` rows also run each rule for real (with the weights their Best-of-N run used)."""
    d = json.loads(path.read_text())
    s = d["settings"]
    models = Models(s["reward"])
    rows = [replayed(r, *models(r), rules, s, i < check) for i, r in enumerate(d["rows"])]
    d.update(rules=list(rules), rows=rows, summary=summarize(rows, rules),
             replayed_again={"command": command, "commit": common.git_commit(),
                             "load_average": os.getloadavg(), "environment": common.environment(),
                             "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    d["settings"]["rules"] = list(rules)
    common.write_json(d, path)
    print(summarize(rows, rules))
    return 0


def kept_rows(path: Path, settings: dict, models: Models, rules: Sequence[str],
              check: int) -> tuple[list[dict], list[dict]]:
    """``--resume``: the rows a result file already holds, replayed again from their saved Best-of-N runs (no
    generation; the first ``check`` also run each rule for real, since the cut rule may have changed since they
    were checked), if the file was made with the same candidates' settings; refused in one line otherwise. Also
    which commands generated them (``generated_by``: rows, command, weights)."""
    d = json.loads(path.read_text())
    same = ("set", "n", "max_new_tokens", "alpha", "seed")
    if any(d["settings"].get(k) != settings[k] for k in same):
        raise SBoNError(f"--resume: {path} was made with other settings ({', '.join(same)} must match); "
                        f"give another --out")
    rows = [replayed(r, *models(r), rules, settings, i < check) for i, r in enumerate(d["rows"])]
    generated_by = d.get("generated_by") or ([{"rows": f"1-{len(rows)}", "command": d.get("command"),
                                               "weights": ", ".join(sorted({str(r["bon_run"].get("weights")) for r in rows}))}]
                                             if rows else [])
    return rows, generated_by


SAME_REPLAY = ("winner", "token_rate", "decision_tokens", "undecided", "applied")  # a replay's outcome, as saved


def replayed(row: dict, gen, reward, rules: Sequence[str], settings: dict, check: bool = False) -> dict[str, Any]:
    """A saved row again, from its Best-of-N run (no generation), under the current cut rule. A rule not checked
    again keeps the row's earlier real-run check only if its replay is the one that was checked (``SAME_REPLAY``)."""
    new = prompt_row(gen, reward, row["item"], rules, settings["n"], settings["max_new_tokens"], settings["alpha"],
                     settings["seed"], check, RunResult.from_dict(row["bon_run"]), row["seconds"]["best_of_n"])
    for rule in rules:
        old = row.get(rule) or {}
        if ("real_run_agrees" not in new[rule] and "real_run_agrees" in old
                and all(old.get(k) == new[rule][k] for k in SAME_REPLAY)):
            new[rule]["real_run_agrees"] = old["real_run_agrees"]
    return new


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as tf_logging
    tf_logging.set_verbosity_error()
    command = common.command_line(args)
    if args.from_file:
        return replay_again(Path(args.from_file), args.rules, args.check, command)
    out = Path(args.out) if args.out else OUT_DIR / f"{args.set}.json"
    work = prompts_of(args.set, args.k, args.offset)
    gen = load_generator()
    reward = load_reward(SETS[args.set], generator=gen)
    record = {"experiment": "undecided", "command": command,
              "settings": {"set": args.set, "reward": SETS[args.set], "rules": list(args.rules), "n": args.n,
                           "max_new_tokens": args.max_new_tokens, "alpha": args.alpha, "seed": args.seed,
                           "method": "sbon (memory-budget rounds, default budget), replayed on Best-of-N's candidates",
                           "check": args.check, "offset": args.offset, "minutes": args.minutes,
                           "prompts_available": len(work),
                           "prompts": "ifeval: the shipped IFEval file's evaluation split (even key), in file order; "
                                      "helpful: benchmarks.default_scenario's held-out AlpacaEval prompts (prompt seed 30)"},
              "load_average_at_start": os.getloadavg(), "environment_at_start": common.environment(gen)}
    deadline = time.perf_counter() + 60 * args.minutes
    rows, generated_by = (kept_rows(out, record["settings"], Models(SETS[args.set], gen, reward), args.rules,
                                    args.check) if args.resume and out.exists() else ([], []))
    kept, done = len(rows), {r["id"] for r in rows}

    def save(generated_here: list[dict]) -> None:
        common.write_json({**record, "generated_by": generated_by + generated_here, "load_average": os.getloadavg(),
                           "environment": common.environment(gen), "summary": summarize(rows, args.rules),
                           "rows": rows}, out)

    bar = common.progress(len(work), f"undecided {args.set}", disable=args.quiet)
    bar.update(len([item for item in work if item["id"] in done]))
    for item in work:
        if item["id"] in done:
            continue
        if time.perf_counter() > deadline:
            break
        rows.append(prompt_row(gen, reward, item, args.rules, args.n, args.max_new_tokens, args.alpha, args.seed,
                               len(rows) < args.check))
        bar.update(1)
        save([{"rows": f"{kept + 1}-{len(rows)}", "command": command, "weights": str(gen.weights)}])
    bar.close()
    if len(rows) == kept:  # nothing new: the kept rows, replayed again, are written all the same
        save([])
    print(summarize(rows, args.rules))
    print(f"wrote {out}")
    return 0
