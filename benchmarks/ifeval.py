"""`python -m benchmarks ifeval`: Best-of-N and Speculative Rejection with a reward a person can check.

On IFEval prompts (the shipped file's evaluation split, even key, odd keys having calibrated the reward's
partial values; or every row of any IFEval-format file given with ``--prompts-file``), with
the `ifeval` reward (the fraction of a prompt's verifiable instructions a response follows), per prompt and
per (N, max new tokens):

- **one sample** (candidate 0), **Best-of-N** (all N at once), **Speculative Rejection** with memory-budget
  rounds (`sbon`, its default budget) and with one decision token (`sbon-tau`), each a real timed run with
  the same seed (coupled sampling: candidate k is the same text in every method), and **Best-of-M at equal
  time** (M = round(N / wall-time speedup of the rounds run); Best-of-N's first M candidates);
- prompt-level and instruction-level strict accuracy of each method's answer, tokens, wall time, decision
  points, whether Best-of-N's winner was kept;
- at the rounds run's first decision point: Kendall between partial and final rewards (pooled over prompts,
  and the mean of each prompt's), the share of tied pairs among live candidates (partial rewards closer
  than the length tie-break), and per instruction type the partial verdict's value (1 satisfied, 0
  violated, P(followed | prefix) while open) against the final verdict of the same candidate's complete
  response (Best-of-N's twin), pooled over prompts (Kendall), and how often a candidate pruned while an
  instruction was still *open* would have followed it.

Means first, then medians. Result file: benchmarks/results/<machine>/ifeval/ifeval[_TAG].json.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from sbon.algorithms import events
from sbon.config import RunConfig
from sbon.engine import Generator, SamplingConfig
from sbon.errors import SBoNError
from sbon.ifeval import IFEvalReward, load_prompts
from sbon.ifeval.data import SHIPPED_FILE, is_calibration
from sbon.ifeval.reward import TIE_BREAK
from sbon.metrics import best_of_m_size, correlations, decision_quality
from sbon.results import RunResult
from sbon.rewards import CallableReward

from . import common, runners

METHODS = ("one sample", "Best-of-N", "SR rounds", "SR tau", "Best-of-M (equal time)")


def evaluation_prompts(k: int, offset: int = 0, path=None) -> tuple[list, str]:
    """(the first k prompts after ``offset``, the split they come from): of the shipped file's evaluation
    split (even key), or of every row of another IFEval-format file (it calibrated nothing)."""
    shipped = path is None or Path(path).resolve() == SHIPPED_FILE.resolve()
    rows = load_prompts(SHIPPED_FILE if shipped else path)
    if shipped:
        rows = [p for p in rows if not is_calibration(p.key)]
    return rows[offset:offset + k], "evaluation (even key)" if shipped else "all rows"


def checksum(path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def followed(reward: IFEvalReward, prompt: str, text: str) -> tuple[float, bool]:
    """(instruction-level strict accuracy, prompt-level: every instruction followed) of a complete response."""
    verdicts = reward.explain(prompt, text, final=True)
    hits = [bool(v.followed) for v in verdicts]
    return sum(hits) / len(hits), all(hits)


def first_decision_by_type(gen: Generator, reward: IFEvalReward, prompt: str, bon: RunResult,
                           sbon: RunResult) -> dict[str, list]:
    """Per instruction type, at the first decision point of ``sbon``: (partial value, followed at the end) of
    every live contender, and for each pruned one with that instruction open, whether it would have
    followed it (its Best-of-N twin's complete response)."""
    out: dict[str, list] = defaultdict(list)
    if not sbon.decision_points:
        return out
    point = sbon.decision_points[0]
    for k in point.contenders:
        if k in point.final:
            continue
        partial = reward.explain(prompt, gen.decode(bon.candidates[k].token_ids[:point.tokens]), final=False)
        final = reward.explain(prompt, bon.candidates[k].text, final=True)
        for p, f in zip(partial, final):
            out[p.instruction_id].append({"partial": p.value, "status": p.status, "followed": bool(f.followed),
                                          "pruned": k in point.pruned})
    return out


def prompt_row(gen: Generator, reward: IFEvalReward, p, *, n: int, max_new_tokens: int, alpha: float, tau: int,
               sampling: SamplingConfig, seed: int) -> dict[str, Any]:
    """Every method on one prompt, with the same seed."""
    config = RunConfig.build(sampling, n=n, max_new_tokens=max_new_tokens, alpha=alpha, tau=tau, seed=seed)
    bon = common.timed_run(events(gen, reward, p.prompt, config.replace(method="bon")))
    rounds = common.timed_run(events(gen, reward, p.prompt, config.replace(method="sbon")))
    single = common.timed_run(events(gen, reward, p.prompt, config.replace(method="sbon-tau")))
    m = best_of_m_size(n, bon.wall_time / rounds.wall_time)
    bom_id = max(range(m), key=lambda k: (bon.candidates[k].final_reward, -k))
    picks = {"one sample": (0, bon.candidates[0].tokens_generated, None),
             "Best-of-N": (bon.best_id, bon.total_tokens, bon.wall_time),
             "SR rounds": (rounds.best_id, rounds.total_tokens, rounds.wall_time),
             "SR tau": (single.best_id, single.total_tokens, single.wall_time),
             "Best-of-M (equal time)": (bom_id, sum(c.tokens_generated for c in bon.candidates[:m]), None)}
    row: dict[str, Any] = {"key": p.key, "instructions": list(p.instruction_ids), "n": n,
                           "max_new_tokens": max_new_tokens, "best_of_m": m}
    for method, (k, tokens, seconds) in picks.items():
        instruction_acc, prompt_acc = followed(reward, p.prompt, bon.candidates[k].text)
        row[method] = {"candidate": k, "instruction_accuracy": instruction_acc, "prompt_accuracy": float(prompt_acc),
                       "tokens": tokens, "token_rate": tokens / bon.total_tokens, "seconds": seconds}
    for method, run in (("SR rounds", rounds), ("SR tau", single)):
        quality = decision_quality(bon, run)
        row[method].update(decision_points=len(run.decision_points), decision_tokens=[q["tokens"] for q in quality],
                           kendall_first=quality[0]["kendall"] if quality else None,
                           winner_kept=float(run.best_id == bon.best_id or bon.best.text == run.best.text),
                           no_decision=run.why_no_decision_point(),
                           scores_first=_first_scores(bon, run))
    row["SR rounds"].update(one_cut_token_rate=one_cut_token_rates(bon, rounds),
                            settled_alike_pairs_first=_settled_alike(reward, gen, p.prompt, bon, rounds))
    row["by_type"] = first_decision_by_type(gen, reward, p.prompt, bon, rounds)
    row["reward_seconds"] = {"SR rounds": rounds.timings.get("reward", 0.0), "SR rounds total": rounds.wall_time}
    return row


def one_cut_token_rates(bon: RunResult, run: RunResult) -> dict[str, float] | None:
    """Token rate of one cut at the run's first decision point (no later rounds), each candidate's length taken
    from its Best-of-N twin: with the survivors the reward chose, and with the survivors that would make it
    lowest (the shortest-lived kept) and highest (the longest-lived kept). The spread is all any reward could move
    the token rate there; where it is narrow, the token rate is set by alpha and by where responses end."""
    if not run.decision_points:
        return None
    point = run.decision_points[0]
    lengths = {k: bon.candidates[k].tokens_generated for k in range(len(bon.candidates))}
    live = [k for k in point.contenders if k not in point.final]
    kept = [k for k in point.survivors if k not in point.final]
    base = sum(min(n, point.tokens) for n in lengths.values())
    rest = sorted(lengths[k] - point.tokens for k in live)
    total = bon.total_tokens
    return {"reward": (base + sum(lengths[k] - point.tokens for k in kept)) / total,
            "lowest": (base + sum(rest[:len(kept)])) / total, "highest": (base + sum(rest[len(rest) - len(kept):])) / total}


def _settled_alike(reward: IFEvalReward, gen: Generator, prompt: str, bon: RunResult, run: RunResult) -> list[int]:
    """(pairs of live candidates at the first decision point, of which every instruction of both is settled
    and alike): such a pair is tied by any partial value, the length tie-break alone can order it."""
    if not run.decision_points:
        return [0, 0]
    point = run.decision_points[0]
    verdicts = [tuple(v.status for v in reward.explain(prompt, gen.decode(bon.candidates[k].token_ids[:point.tokens]),
                                                          final=False))
                for k in point.contenders if k not in point.final]
    pairs = list(itertools.combinations(verdicts, 2))
    return [len(pairs), sum(a == b and "open" not in a for a, b in pairs)]


def _first_scores(bon: RunResult, run: RunResult) -> list[tuple[float, float]]:
    """(partial reward, final reward of Best-of-N's twin) of each live contender at the first decision point."""
    if not run.decision_points:
        return []
    point = run.decision_points[0]
    return [(s, bon.candidates[k].final_reward) for k, s in zip(point.contenders, point.scores) if k not in point.final]


def _mean_median(values: Sequence[float]) -> dict[str, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "median": None}
    return {"mean": statistics.fmean(values), "median": statistics.median(values)}


def summarize(rows: list[dict]) -> dict[str, Any]:
    """Per (N, tokens) and method: accuracies, token rate, time; per type: pooled Kendall, open-pruned passes."""
    out: dict[str, Any] = {}
    for n, tokens in sorted({(r["n"], r["max_new_tokens"]) for r in rows}):
        group = [r for r in rows if (r["n"], r["max_new_tokens"]) == (n, tokens)]
        methods = {}
        for method in METHODS:
            methods[method] = {key: _mean_median([r[method][key] for r in group])
                               for key in ("prompt_accuracy", "instruction_accuracy", "token_rate", "seconds")}
        for method in ("SR rounds", "SR tau"):
            methods[method].update(
                decision_points=_mean_median([r[method]["decision_points"] for r in group]),
                no_decision_point=sum(r[method]["decision_points"] == 0 for r in group),
                winner_kept=_mean_median([r[method]["winner_kept"] for r in group]),
                kendall_first_pooled=_pooled_kendall([pair for r in group for pair in r[method]["scores_first"]]),
                kendall_first_per_prompt=_mean_median([r[method]["kendall_first"] for r in group
                                                       if r[method]["kendall_first"] == r[method]["kendall_first"]]),
                tied_pairs_first=_tied_share([r[method]["scores_first"] for r in group]))
        alike = [r["SR rounds"]["settled_alike_pairs_first"] for r in group]
        methods["SR rounds"].update(
            settled_alike_pairs_first=sum(a for _, a in alike) / max(1, sum(n for n, _ in alike)),
            one_cut_token_rate={key: _mean_median([r["SR rounds"]["one_cut_token_rate"][key] for r in group
                                                   if r["SR rounds"]["one_cut_token_rate"]])
                                for key in ("reward", "lowest", "highest")})
        by_type: dict[str, Any] = {}
        pooled: dict[str, list] = defaultdict(list)
        for r in group:
            for kind, items in r["by_type"].items():
                pooled[kind] += items
        for kind, items in sorted(pooled.items()):
            open_pruned = [i for i in items if i["pruned"] and i["status"] == "open"]
            by_type[kind] = {"live_candidates": len(items),
                             "settled_at_first_decision": sum(i["status"] != "open" for i in items) / len(items),
                             "kendall": _pooled_kendall([(i["partial"], float(i["followed"])) for i in items]),
                             "pruned_while_open": len(open_pruned),
                             "pruned_while_open_would_pass": (sum(i["followed"] for i in open_pruned) / len(open_pruned)
                                                              if open_pruned else None)}
        reward_share = [r["reward_seconds"]["SR rounds"] / r["reward_seconds"]["SR rounds total"] for r in group]
        out[f"N={n}, {tokens} tokens"] = {"prompts": len(group), "methods": methods, "by_instruction_type": by_type,
                                          "reward_share_of_sr_time": _mean_median(reward_share)}
    return out


def _tied_share(groups: Sequence[Sequence[tuple[float, float]]]) -> float | None:
    """Share of pairs of live candidates (within each prompt's first decision point) whose partial rewards
    differ by less than the length tie-break: ordered by length alone."""
    pairs = [abs(a[0] - b[0]) < TIE_BREAK for g in groups for a, b in itertools.combinations(g, 2)]
    return sum(pairs) / len(pairs) if pairs else None


def _pooled_kendall(pairs: Sequence[tuple[float, float]]) -> float | None:
    if len(pairs) < 2:
        return None
    kendall = correlations([a for a, _ in pairs], [b for _, b in pairs])["kendall"]
    return None if kendall != kendall else kendall  # NaN (a constant side) -> None


def add_parser(sub) -> None:
    p = sub.add_parser("ifeval", help="IFEval prompts with the ifeval reward: one sample, Best-of-N, Speculative "
                                      "Rejection (rounds and tau), Best-of-M; where partial verdicts predict final ones")
    common.add_common_args(p, k=10, n=16, max_new_tokens=128)
    p.set_defaults(reward="ifeval", prompts_file=None)
    helps = {"reward": "reward preset: ifeval, the only one this experiment takes",
             "prompts_file": "an IFEval-format JSON lines file (key, prompt, instruction_id_list, kwargs), all of "
                             "its rows; None: the shipped file's evaluation split (even keys)"}
    for action in p._actions:
        action.help = helps.get(action.dest, action.help)
    g = p.add_argument_group("ifeval")
    g.add_argument("--ns", type=int, nargs="+", default=None, help="several N (default: --n)")
    g.add_argument("--lengths", type=int, nargs="+", default=None, help="several max new tokens (default: --max-new-tokens)")
    g.add_argument("--alpha", type=float, default=RunConfig.alpha,
                   help=f"rejection rate of both variants (default: {RunConfig.alpha})")
    g.add_argument("--tau", type=int, default=RunConfig.tau, help=f"decision token of sbon-tau (default: {RunConfig.tau})")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.reward != "ifeval":
        raise SBoNError("python -m benchmarks ifeval needs --reward ifeval (its prompts carry IFEval instructions)")
    prompts, split = evaluation_prompts(args.k, args.offset, args.prompts_file)
    prompts_path = Path(args.prompts_file) if args.prompts_file else SHIPPED_FILE
    gen, reward = runners.setup(args)
    sampling = common.sampling_from(args)
    common.warm_up(gen, CallableReward(lambda prompt, rs: [0.0] * len(rs)), sampling)  # ifeval refuses "Say hello."
    grid = [(n, t) for n in (args.ns or [args.n]) for t in (args.lengths or [args.max_new_tokens])]
    json_path, _ = common.result_paths(args, "ifeval")
    settings = {**common.base_settings(args, gen, reward), "prompts_file": prompts_path.name,
                "prompts_checksum": checksum(prompts_path), "split": split,
                "prompt_keys": [p.key for p in prompts], "grid": grid,
                "alpha": args.alpha, "tau": args.tau}
    start_env, rows = common.environment(gen), []
    bar = common.progress(len(prompts) * len(grid), "ifeval", disable=args.quiet)
    for n, tokens in grid:
        reward.progress.horizon_tokens = tokens  # the partial values price the room left in this run
        for p in prompts:
            if prompts_path != SHIPPED_FILE:
                IFEvalReward.register(p.prompt, p.instruction_ids, p.kwargs)
            rows.append(prompt_row(gen, reward, p, n=n, max_new_tokens=tokens, alpha=args.alpha, tau=args.tau,
                                   sampling=sampling, seed=args.seed))
            bar.update(1)
            common.write_json({"experiment": "ifeval", "settings": settings, "environment_at_start": start_env,
                               "environment": common.environment(gen), "summary": summarize(rows), "rows": rows},
                              json_path)  # after every prompt: a run cut short keeps what it finished
    bar.close()
    for name, s in summarize(rows).items():
        print(f"\n{name} ({s['prompts']} prompts): prompt-level / instruction-level strict accuracy, token rate "
              f"(mean, median)")
        for method, m in s["methods"].items():
            print(f"  {method:<24} {_fmt(m['prompt_accuracy'])}  {_fmt(m['instruction_accuracy'])}  "
                  f"{_fmt(m['token_rate'])}" + (f"  decision points {_fmt(m['decision_points'])}, none on "
                                                f"{m['no_decision_point']}, Kendall (pooled, 1st) "
                                                f"{_fmt_kendall(m['kendall_first_pooled'])}, per prompt "
                                                f"{_fmt(m['kendall_first_per_prompt'])}, tied pairs "
                                                f"{_fmt_share(m['tied_pairs_first'])}" if "decision_points" in m else ""))
    print(f"\nwrote {json_path}")
    return 0


def _fmt(mm: dict) -> str:
    return "—" if mm["mean"] is None else f"{mm['mean']:.3f} / {mm['median']:.3f}"


def _fmt_share(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def _fmt_kendall(k: float | None) -> str:
    return "—" if k is None else f"{k:+.2f}"
