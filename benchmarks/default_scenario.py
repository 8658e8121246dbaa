"""Which scenario should the page and the command line start from? Each of the page's scenarios
(components/scenarios.py: a reward, its pruning signal and its answer length) on held-out prompts, at the
page's own settings (components.controls.RunSettings with the scenario's choices), Speculative Rejection
against Best-of-N (coupled: candidate k is the same text in both; Best-of-N under the same memory, as the
page runs it):

    OMP_NUM_THREADS=1 python -m benchmarks scenarios --threads 1
    OMP_NUM_THREADS=1 python -m benchmarks scenarios --threads 1 --scenario instructions   # re-run one; the
                                                                  # other scenarios' rows stay in the file

Per prompt (``sbon.metrics.compare``): the normalized score of Speculative Rejection's answer (Best-of-N's = 100,
Best-of-N's worst candidate = 0) and of the random-pruning null model (the expected normalized score of pruning
at random with the same counts), the step speedup, the token rate, the Kendall correlation of the pruning
signal's scores with the final rewards at the first decision point and its share of tied pairs (live candidates
the signal cannot tell apart), whether Best-of-N's winner was pruned; and both winners' texts with simple
checks of how they read: the share of repeated word trigrams, whether the answer ended by itself (not cut at
the token limit), whether it reads as English (langdetect), and, for the instructions scenario, whether it
follows every instruction. The texts are in the file, for a reader to judge.

Prompts are held out from every choice this project made: the IFEval evaluation split (even key; the
calibration uses odd keys) without the page's examples; AlpacaEval's held-out fold (``held_out_prompts``)
without the app's examples and without every prompt the former page default was chosen on
(benchmarks/results/cpu-2core-epyc/defaults), shuffled with ``--prompt-seed``. The helpful and fluency scenarios share their
prompts, so the two rewards are compared on the same candidates.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
from pathlib import Path
from typing import Any, Sequence

import torch

from sbon.analysis.comparison import run_comparison
from sbon.ifeval.data import SHIPPED_FILE, is_calibration, load_prompts
from sbon.ifeval.reward import TIE_BREAK
from sbon.models import load_generator, load_reward
from sbon.rewards import bind_instructions

from . import common

OUT_DIR = common.DEFAULT_OUT_DIR / "cpu-2core-epyc" / "scenarios"
DEFAULTS_RESULTS = common.DEFAULT_OUT_DIR / "cpu-2core-epyc" / "defaults"  # the prompts the former default was chosen on
# Partial rewards closer than this cannot order candidates: the ifeval reward's length tie-break is below
# TIE_BREAK, so two candidates closer than it differ by length alone; other rewards' ties are exact.
TIED = {"ifeval": TIE_BREAK}


def held_out_prompts(seed: int) -> list[dict]:
    """AlpacaEval instructions held out from every model trained in this project (sha1(instruction) % 100 < 20:
    minilm-pref's validation fold, never trained on, and the value head's held-out set), minus the first 20 (the
    benchmarks' prompts) and the app's example prompts, shuffled with ``seed``."""
    rows = [json.loads(line) for line in (common.REPO / "benchmarks" / "data" / "alpaca_eval_prompts.jsonl")
            .read_text().splitlines() if line.strip()]
    examples = {e["prompt"] for e in json.loads((common.REPO / "assets" / "examples.json").read_text())["examples"]}
    rows = [r for r in rows if r["id"] >= 20 and r["instruction"] not in examples
            and int(hashlib.sha1(r["instruction"].encode()).hexdigest(), 16) % 100 < 20]
    random.Random(seed).shuffle(rows)
    return rows


def scenario_prompts(key: str, k: int, seed: int) -> list[dict[str, Any]]:
    """The held-out prompts of one scenario: {"id", "prompt", "instructions" (ifeval only)}."""
    from components.scenarios import IFEVAL_EXAMPLE_KEYS, SCENARIOS

    if SCENARIOS[key].reward == "ifeval":
        rows = [p for p in load_prompts(SHIPPED_FILE) if not is_calibration(p.key) and p.key not in IFEVAL_EXAMPLE_KEYS]
        return [{"id": p.key, "prompt": p.prompt,
                 "instructions": [{"id": i, **{a: v for a, v in kw.items() if v is not None}}
                                  for i, kw in zip(p.instruction_ids, p.kwargs)]} for p in rows[:k]]
    used = {i for f in DEFAULTS_RESULTS.glob("*.json")
            for i in json.loads(f.read_text()).get("settings", {}).get("prompt_ids") or []}
    rows = [r for r in held_out_prompts(seed) if r["id"] not in used]
    return [{"id": r["id"], "prompt": r["instruction"]} for r in rows[:k]]


def repeated_trigrams(text: str) -> float:
    """Share of the word trigrams that repeat an earlier one (0 = no loop; a looping answer nears 1)."""
    words = text.lower().split()
    grams = list(zip(words, words[1:], words[2:]))
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def english(text: str) -> bool:
    from langdetect import DetectorFactory, LangDetectException, detect

    DetectorFactory.seed = 0  # langdetect samples: the same verdict every time
    try:
        return detect(text) == "en"
    except LangDetectException:  # no letters at all
        return False


def reads(run, reward) -> dict[str, Any]:
    """The winner's text and how it reads."""
    best = run.best
    row = {"id": best.id, "text": best.text, "final_reward": best.final_reward,
           "repeated_trigrams": repeated_trigrams(best.text), "ended": best.stop_reason == "eos",
           "english": english(best.text)}
    if hasattr(reward, "explain"):
        row["all_followed"] = all(v.followed for v in reward.explain(run.prompt, best.text, final=True))
    return row


def tied_share(run, tie: float) -> float | None:
    """Share of pairs of live candidates at the first decision point whose scores differ by less than ``tie``."""
    if not run.decision_points:
        return None
    p = run.decision_points[0]
    live = [s for k, s in zip(p.contenders, p.scores) if k not in p.final]
    pairs = [abs(a - b) < tie for a, b in itertools.combinations(live, 2)]
    return sum(pairs) / len(pairs) if pairs else None


def prompt_row(gen, reward, key: str, item: dict, settings) -> dict[str, Any]:
    reward = bind_instructions(reward, item["prompt"], item.get("instructions"))
    comp = run_comparison(gen, reward, item["prompt"], settings.config(), bon_same_memory=settings.bon_same_memory,
                          taus=[], signals=())  # the counterfactual and watched signals change no number here
    m = comp.metrics
    return {"scenario": key, "prompt_id": item["id"], "prompt": item["prompt"],
            **{name: m[name] for name in ("normalized_score", "random_pruning_normalized_score", "step_speedup",
                                          "token_rate", "kendall_first_decision", "decision_points",
                                          "bon_winner_pruned")},
            "tied_pairs_first": tied_share(comp.speculative, TIED.get(settings.reward, 1e-9)),
            "sbon_winner": reads(comp.speculative, reward), "bon_winner": reads(comp.bon, reward),
            "same_answer": comp.speculative.best_id == comp.bon.best_id, "load": {"sbon": comp.speculative.load, "bon": comp.bon.load}}


def summarize(rows: Sequence[dict]) -> dict[str, dict[str, Any]]:
    """Per scenario: means over its prompts (Kendall over the prompts with a decision point)."""
    out = {}
    for key in dict.fromkeys(r["scenario"] for r in rows):
        group = [r for r in rows if r["scenario"] == key]

        def mean(values):
            values = [v for v in values if v is not None and v == v]
            return sum(values) / len(values) if values else None

        def readable(w):  # ended by itself or not, no loop, English, and (ifeval) every instruction followed
            return w["repeated_trigrams"] < 0.2 and w["english"] and w.get("all_followed", True)

        out[key] = {"prompts": len(group),
                    **{name: mean(r[name] for r in group) for name in (
                        "normalized_score", "random_pruning_normalized_score", "step_speedup", "token_rate",
                        "kendall_first_decision", "tied_pairs_first", "decision_points", "bon_winner_pruned")},
                    "same_answer": mean(float(r["same_answer"]) for r in group),
                    **{f"{who}_readable": mean(float(readable(r[f"{who}_winner"])) for r in group)
                       for who in ("sbon", "bon")},
                    **{f"{who}_{check}": mean(float(r[f"{who}_winner"][check]) for r in group
                                              if check in r[f"{who}_winner"])
                       for who in ("sbon", "bon") for check in ("ended", "english", "all_followed")},
                    "sbon_repeated_trigrams": mean(r["sbon_winner"]["repeated_trigrams"] for r in group)}
    return out


def add_parser(sub) -> None:
    from components.scenarios import SCENARIOS

    p = sub.add_parser("scenarios", help="each page scenario on held-out prompts at the page's settings: Speculative "
                                         "Rejection vs Best-of-N vs random pruning, Kendall at the first decision "
                                         "point, how the winners read")
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS),
                   help="the scenarios to run; the file keeps the others' rows from an earlier run")
    p.add_argument("--k", type=int, default=6, help="held-out prompts per scenario")
    p.add_argument("--prompt-seed", type=int, default=30, help="shuffle of AlpacaEval's held-out fold")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", default=str(OUT_DIR / "scenarios.json"), help="the result file, rewritten after every prompt")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    from components.controls import RunSettings
    from components.scenarios import SCENARIOS

    torch.set_num_threads(args.threads)
    from transformers.utils import logging as tf_logging
    tf_logging.set_verbosity_error()
    out = Path(args.out)
    earlier = json.loads(out.read_text()) if out.exists() else {"rows": []}
    # Rows kept from an earlier run name the command that made them: the file may hold more than one run.
    kept = [{"command": earlier.get("command"), **r} for r in earlier["rows"] if r["scenario"] not in args.scenario]
    work = [(key, item) for key in args.scenario for item in scenario_prompts(key, args.k, args.prompt_seed)]
    gen = load_generator()  # the page's generator, in the page's weight format
    rewards = {key: load_reward(SCENARIOS[key].reward, generator=gen) for key in args.scenario}
    settings = {key: RunSettings(**{k: v for k, v in SCENARIOS[key].settings().items() if k != "prompt"})
                for key in args.scenario}
    record = {"experiment": "scenarios", "command": common.command_line(args),
              "settings": {"page": RunSettings().to_dict() | {"prompt": None},
                           "scenarios": {key: {**SCENARIOS[key].settings(), "prompt": None} for key in SCENARIOS},
                           "k": args.k, "prompt_seed": args.prompt_seed,
                           "prompts": "instructions: the shipped IFEval file's evaluation split (even key) without the "
                                      "page's examples, first k; helpful, fluency: AlpacaEval's held-out fold, id >= 20, "
                                      "not an app example nor a prompt of benchmarks/results/cpu-2core-epyc/defaults, "
                                      "shuffled with prompt_seed, first k",
                           "tied": {"ifeval": TIE_BREAK, "others": 1e-9}},
              "environment_at_start": common.environment(gen)}
    rows = []
    bar = common.progress(len(work), "scenarios", disable=args.quiet)
    for key, item in work:
        s = settings[key]
        s.prompt = item["prompt"]
        rows.append({"command": record["command"], **prompt_row(gen, rewards[key], key, item, s)})
        bar.update(1)
        every = kept + rows
        common.write_json({**record, "environment": common.environment(gen), "summary": summarize(every),
                           "rows": every}, out)  # after every prompt: a run cut short keeps what it finished
    bar.close()
    for key, s in summarize(kept + rows).items():
        print(f"{key}: " + ", ".join(f"{name} {value:.3g}" if isinstance(value, float) else f"{name} {value}"
                                     for name, value in s.items()))
    print(f"wrote {out}")
    return 0
