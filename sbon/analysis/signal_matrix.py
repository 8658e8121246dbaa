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

import time
from typing import TYPE_CHECKING, Iterable, Sequence

from ..algorithms import Done, TokensGenerated, events
from ..config import RunConfig
from ..engine import Generator
from ..metrics import correlations
from ..results import RunResult
from ..rewards import RewardModel
from ..signals import PruningSignal, make_signal, on_reward_scale
from .replay import replay_tau

if TYPE_CHECKING:  # imported where a table is built: pandas is among the slowest imports of a command line's start
    import pandas as pd

# scores[signal][t][k]: signal's score of candidate k at t tokens, None if k had finished by then.
Scores = dict[str, dict[int, list[float | None]]]


class SignalWatch:
    """Signals watching a Best-of-N run: feed it the run's events (:meth:`see`); whenever the
    candidates reach one of ``taus`` tokens, each signal scores those still generating. ``observers``
    go to :func:`sbon.algorithms.events`; ``observe_seconds`` is the time they spent observing (inside
    the run's decode timer), ``score_seconds`` the time spent scoring at decision points (outside it). With Best-of-N in batches, each batch's candidates are scored
    when that batch reaches t; signals that compare candidates with each other (``one_batch``) are
    then left out, since they would only see one batch."""

    def __init__(self, gen: Generator, reward: RewardModel | None, prompt: str, signals: Sequence[str],
                 taus: Iterable[int], n: int, max_new_tokens: int, one_batch: bool = True):
        made = {name: make_signal(name, gen, reward) for name in signals}
        self.gen, self.prompt, self.n, self.max_new_tokens = gen, prompt, n, max_new_tokens
        self.taus = sorted(set(taus))
        self.signals = {name: _Timed(s, self) for name, s in made.items() if one_batch or not s.one_batch}
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.scores: Scores = {name: {} for name in self.signals}
        self.observe_seconds = self.score_seconds = 0.0

    @property
    def observers(self) -> list[PruningSignal]:
        return list(self.signals.values())

    def see(self, event) -> None:
        if not isinstance(event, TokensGenerated):
            return
        for k, tok in zip(event.candidate_ids, event.token_ids):
            self.tokens[k].append(tok)
        t = event.tokens
        if t not in self.taus or t >= self.max_new_tokens:
            return
        start = time.perf_counter()
        # The event's tokens are host integers: checked against the host set (no tensor on the generator's device).
        live = [k for k, tok in zip(event.candidate_ids, event.token_ids) if tok not in self.gen.stop_ids]
        texts = None
        for name, timed in self.signals.items():
            signal = timed.signal
            if signal.needs_text and texts is None:
                texts = [self.gen.decode(self.tokens[k]) for k in live]
            by_id = dict(zip(live, signal.score(self.prompt, live, texts if signal.needs_text else None)))
            row = self.scores[name].setdefault(t, [None] * self.n)
            for k, v in by_id.items():
                row[k] = float(v)
        self.score_seconds += time.perf_counter() - start

    def result(self) -> Scores:
        """The scores, with an all-None row for each decision point no candidate reached."""
        for by_t in self.scores.values():
            for t in self.taus:
                by_t.setdefault(t, [None] * self.n)
        return {name: dict(sorted(by_t.items())) for name, by_t in self.scores.items()}


class _Timed(PruningSignal):
    """A signal whose observe() time is added to its watch's ``observe_seconds``."""

    def __init__(self, signal: PruningSignal, watch: SignalWatch):
        self.signal, self.watch = signal, watch
        self.name, self.needs_text, self.needs_hidden = signal.name, signal.needs_text, signal.needs_hidden

    def observe(self, step) -> None:
        start = time.perf_counter()
        self.signal.observe(step)
        self.watch.observe_seconds += time.perf_counter() - start


def signal_scores(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig, signals: Sequence[str],
                  taus: Iterable[int]) -> tuple[RunResult, Scores]:
    """Best-of-N (all candidates in one batch) with every signal watching, and each signal's score of
    the candidates still generating at each decision point t."""
    if config.method != "bon" or (config.batch_size or config.n) < config.n:
        raise ValueError("signal_scores needs Best-of-N with all candidates in one batch")
    watch = SignalWatch(gen, reward, prompt, signals, taus, config.n, config.max_new_tokens)
    for event in events(gen, reward, prompt, config, observers=watch.observers):
        watch.see(event)
        if isinstance(event, Done):
            bon = event.result
    return bon, watch.result()


def single_cut(bon: RunResult, score: Sequence[float | None], t: int, alpha: float,
               rank_finished: bool = False) -> dict[str, float]:
    """One decision point at t (:func:`sbon.analysis.replay.replay_tau`): the returned response is the best
    final reward among survivors and finished candidates. Keyed ``tau``, the decision token, as every result
    file is (files written before read ``t``: :func:`decision_token`)."""
    return replay_tau(bon, score, t, alpha, rank_finished).metrics(bon)


def kendall(bon: RunResult, score: Sequence[float | None]) -> float:
    """Kendall's tau of the signal's score with the final reward over the candidates still generating."""
    pairs = [(s, c.final_reward) for s, c in zip(score, bon.candidates) if s is not None]
    return correlations(*zip(*pairs))["kendall"] if len(pairs) >= 2 else float("nan")


def signal_grid(bon: RunResult, scores: Scores, alphas: Iterable[float], run_reward: str | None = None) -> pd.DataFrame:
    """One row per signal x decision point x alpha for one prompt. ``run_reward``: the reward that scored the
    reward signal's partial texts, when ``bon``'s final rewards were replaced by another reward's."""
    import pandas as pd

    alphas = list(alphas)
    rows = []
    for name, by_t in scores.items():
        for t, score in sorted(by_t.items()):
            tau_k = kendall(bon, score)
            if not any(s is not None for s in score):
                continue
            for a in alphas:
                rows.append({"signal": name, **single_cut(bon, score, t, a, on_reward_scale(name, bon.reward, run_reward)),
                             "kendall": tau_k})
    return pd.DataFrame(rows)


def scores_from_json(d: dict) -> Scores:
    return {name: {int(t): v for t, v in by_t.items()} for name, by_t in d.items()}


def mean_grid(bons: Sequence[RunResult], scores: Sequence[Scores], alphas: Iterable[float],
              run_rewards: Sequence[str | None] | None = None) -> pd.DataFrame:
    """signal x tau x alpha averaged over prompts (winner kept as a fraction); ``run_rewards`` as in signal_grid,
    per prompt."""
    import pandas as pd

    alphas = list(alphas)
    run_rewards = run_rewards or [None] * len(bons)
    df = pd.concat([signal_grid(b, s, alphas, r).assign(prompt=i)
                    for i, (b, s, r) in enumerate(zip(bons, scores, run_rewards))], ignore_index=True)
    cols = ["winner_kept", "normalized_score", "token_rate", "kendall"]
    grid = df.groupby(["signal", "tau", "alpha"], as_index=False)[cols].mean()
    grid["score_min_prompt"] = df.groupby(["signal", "tau", "alpha"])["normalized_score"].min().values
    grid["prompts"] = df.groupby(["signal", "tau", "alpha"]).size().values
    return grid


def cheapest_setting(grid: pd.DataFrame, floor: float = 98.0) -> dict | None:
    """The (tau, alpha) with the lowest mean token rate whose mean normalized score is >= floor (ties:
    the earlier tau, then the larger alpha); None if no setting keeps the score."""
    ok = grid[grid["normalized_score"] >= floor]
    if not len(ok):
        return None
    best = ok.sort_values(["token_rate", "tau", "alpha"], ascending=[True, True, False]).iloc[0].to_dict()
    return {**best, "token_speedup": 1.0 / best["token_rate"]}
