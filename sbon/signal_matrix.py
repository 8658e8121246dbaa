"""Pruning signals side by side on the same candidates (coupled sampling makes the comparison exact).

Best-of-N runs once with every signal as an observer; whenever the candidates reach a decision point
t, each signal scores the candidates still generating. Because a Speculative Rejection run with the
same seed samples exactly these candidates, a single cut at t by a signal keeps exactly the
responses the replay says it keeps: no new generation, and every signal sees the same pool.

:func:`signal_scores` collects the scores (per signal, per t, per candidate); :func:`single_cut`
and :func:`signal_grid` turn them into the matrix: winner kept, normalized score, Kendall with the
final reward, token rate. The benchmark (``python -m benchmarks signals``) and the app share them.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import pandas as pd
import torch

from .algorithms import CandidateFinished, Done, TokensGenerated, events, survivors_count
from .config import RunConfig
from .engine import Generator
from .metrics import correlations, normalized_score
from .results import RunResult
from .rewards import RewardModel
from .signals import make_signal

# scores[signal][t][k]: signal's score of candidate k at t tokens, None if k had finished by then.
Scores = dict[str, dict[int, list[float | None]]]


def signal_scores(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig, signals: Sequence[str],
                  taus: Iterable[int]) -> tuple[RunResult, Scores]:
    """Best-of-N (all candidates in one batch) with every signal watching, and each signal's score of
    the candidates still generating at each decision point t."""
    if config.method != "bon" or (config.batch_size or config.n) < config.n:
        raise ValueError("signal_scores needs Best-of-N with all candidates in one batch")
    taus = sorted(set(taus))
    observers = {name: make_signal(name, gen, reward) for name in signals}
    n = config.n
    tokens: list[list[int]] = [[] for _ in range(n)]
    scores: Scores = {name: {} for name in signals}
    for event in events(gen, reward, prompt, config, observers=list(observers.values())):
        if isinstance(event, TokensGenerated):
            for k, tok in zip(event.candidate_ids, event.token_ids):
                tokens[k].append(tok)
            t = event.tokens
            if t in taus and t < config.max_new_tokens:
                stops = gen.is_stop(torch.tensor(event.token_ids)).tolist()
                live = [k for k, stop in zip(event.candidate_ids, stops) if not stop]
                texts = None
                for name, signal in observers.items():
                    if signal.needs_text and texts is None:
                        texts = [gen.decode(tokens[k]) for k in live]
                    by_id = dict(zip(live, signal.score(prompt, live, texts if signal.needs_text else None)))
                    scores[name][t] = [by_id.get(k) for k in range(n)]
        elif isinstance(event, Done):
            bon = event.result
    for name in signals:  # decision points no candidate reached: everyone had finished
        for t in taus:
            scores[name].setdefault(t, [None] * n)
    return bon, scores


def single_cut(bon: RunResult, score: Sequence[float | None], t: int, alpha: float) -> dict[str, float]:
    """One decision point at t: rank the candidates still generating by the signal, keep
    round((1 - alpha) * live) of them; candidates finished before t stay eligible (they cost nothing
    more, and a reward-free score is not on their final reward's scale). The returned response is the
    best final reward among survivors and finished ones."""
    cands = bon.candidates
    live = [k for k, s in enumerate(score) if s is not None]
    ranked = sorted(live, key=lambda k: (-score[k], k))
    kept = set(ranked[:survivors_count(len(live), alpha)]) if live else set()
    eligible = kept | {k for k, s in enumerate(score) if s is None}
    tokens = sum(c.tokens_generated if c.id in eligible else min(c.tokens_generated, t) for c in cands)
    best = max(cands[k].final_reward for k in eligible)
    return {"t": t, "alpha": alpha, "live": len(live),
            "winner_kept": float(bon.best_id in eligible),
            "normalized_score": normalized_score(bon.final_rewards, best),
            "token_rate": tokens / bon.total_tokens}


def kendall(bon: RunResult, score: Sequence[float | None]) -> float:
    """Kendall's tau of the signal's score with the final reward over the candidates still generating."""
    pairs = [(s, c.final_reward) for s, c in zip(score, bon.candidates) if s is not None]
    return correlations(*zip(*pairs))["kendall"] if len(pairs) >= 2 else float("nan")


def signal_grid(bon: RunResult, scores: Scores, alphas: Iterable[float]) -> pd.DataFrame:
    """One row per signal x decision point x alpha for one prompt."""
    alphas = list(alphas)
    rows = []
    for name, by_t in scores.items():
        for t, score in sorted(by_t.items()):
            tau_k = kendall(bon, score)
            if not any(s is not None for s in score):
                continue
            for a in alphas:
                rows.append({"signal": name, **single_cut(bon, score, t, a), "kendall": tau_k})
    return pd.DataFrame(rows)


def scores_from_json(d: dict) -> Scores:
    return {name: {int(t): v for t, v in by_t.items()} for name, by_t in d.items()}


def mean_grid(bons: Sequence[RunResult], scores: Sequence[Scores], alphas: Iterable[float]) -> pd.DataFrame:
    """signal x t x alpha averaged over prompts (winner kept as a fraction)."""
    alphas = list(alphas)
    df = pd.concat([signal_grid(b, s, alphas).assign(prompt=i) for i, (b, s) in enumerate(zip(bons, scores))],
                   ignore_index=True)
    cols = ["winner_kept", "normalized_score", "token_rate", "kendall"]
    grid = df.groupby(["signal", "t", "alpha"], as_index=False)[cols].mean()
    grid["score_min_prompt"] = df.groupby(["signal", "t", "alpha"])["normalized_score"].min().values
    grid["prompts"] = df.groupby(["signal", "t", "alpha"]).size().values
    return grid


def cheapest_setting(grid: pd.DataFrame, floor: float = 98.0) -> dict | None:
    """The (t, alpha) with the lowest mean token rate whose mean normalized score is >= floor (ties:
    the earlier t, then the larger alpha); None if no setting keeps the score."""
    ok = grid[grid["normalized_score"] >= floor]
    if not len(ok):
        return None
    best = ok.sort_values(["token_rate", "t", "alpha"], ascending=[True, True, False]).iloc[0].to_dict()
    return {**best, "token_speedup": 1.0 / best["token_rate"]}
