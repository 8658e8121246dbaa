"""Counterfactual Speculative Rejection: replay the single-decision-token method on completed
Best-of-N candidates, with no new generation (the paper's Figure 3 and Appendix D).

The cut itself is :func:`sbon.analysis.replay.replay_tau`: the real run's rule, on Best-of-N's prefixes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from ..metrics import correlations, oracle_cut
from ..results import RunResult
from ..rewards import RewardModel
from ..signals import RewardSignal
from .replay import replay_tau

if TYPE_CHECKING:  # imported where a table is built: pandas is among the slowest imports of a command line's start
    import pandas as pd


def prefix_rewards(bon: RunResult, reward: RewardModel, decode: Callable[[Sequence[int]], str],
                   taus: Iterable[int], known: dict[tuple[int, int], float] | None = None
                   ) -> dict[int, list[float | None]]:
    """Partial reward of every BoN candidate after tau tokens (None if it had finished by then).

    ``known``: partial rewards already scored, by (tau, candidate id), for those very prefixes (the real run's at
    its decision points, :func:`run_partials`); they are taken as they are and the reward is not asked again.
    A reward with ``score_prefixes`` (the generator's likelihood) scores the rest of a candidate's prefixes in one
    pass; any other is asked once, for every prefix of every tau."""
    taus = sorted(set(taus))
    live = {tau: [c.id for c in bon.candidates if c.tokens_generated > tau] for tau in taus}
    scores = {(tau, k): known[(tau, k)] for tau in taus for k in live[tau] if known and (tau, k) in known}
    asked = {tau: [k for k in live[tau] if (tau, k) not in scores] for tau in taus}
    text = {(tau, k): decode(bon.candidates[k].token_ids[:tau]) for tau in taus for k in asked[tau]}
    if hasattr(reward, "score_prefixes"):
        cut_at = {c.id: [tau for tau in taus if c.id in asked[tau]] for c in bon.candidates}
        ids = [k for k, cuts in cut_at.items() if cuts]
        grouped = reward.score_prefixes(bon.prompt, [[text[(tau, k)] for tau in cut_at[k]] for k in ids])
        scores.update({(tau, k): s for k, row in zip(ids, grouped) for tau, s in zip(cut_at[k], row)})
    else:
        partial = getattr(reward, "score_partial", reward.score)  # as the run's RewardSignal scores partial texts
        keys = [(tau, k) for tau in taus for k in asked[tau]]
        scores.update(zip(keys, partial(bon.prompt, [text[key] for key in keys]) if keys else []))
    return {tau: [scores.get((tau, c.id)) for c in bon.candidates] for tau in taus}


def run_partials(run: RunResult, bon: RunResult) -> dict[tuple[int, int], float]:
    """The partial rewards a pruning run scored at its decision points, by (tokens, candidate id), for prefixes
    that are Best-of-N's own (the coupling): where its pruning signal was the reward, they are the scores those
    prefixes get, so a replay at a real decision point cuts on the numbers the run cut on."""
    if run.settings.get("prune_by", "reward") != "reward":
        return {}
    return {(p.tokens, c.id): p.reward for c in run.candidates for p in c.partial_rewards
            if bon.candidates[c.id].token_ids[:p.tokens] == c.token_ids[:p.tokens]}


def prefix_uncertainties(bon: RunResult, reward: RewardModel, decode: Callable[[Sequence[int]], str],
                         taus: Iterable[int]) -> dict[int, list[float | None]]:
    """Half-width of every BoN candidate's partial reward after tau tokens, as the run's reward signal gives it
    (None if it had finished by then); empty when the reward has no uncertainty."""
    signal = RewardSignal(reward)
    if not signal.knows_uncertainty:
        return {}
    out = {}
    for tau in sorted(set(taus)):
        live = [c.id for c in bon.candidates if c.tokens_generated > tau]
        texts = [decode(bon.candidates[k].token_ids[:tau]) for k in live]
        found = dict(zip(live, signal.uncertainty(bon.prompt, live, texts) if live else []))
        out[tau] = [found.get(c.id) for c in bon.candidates]
    return out


def simulate_tau(bon: RunResult, partial: Sequence[float | None], tau: int, alpha: float,
                 uncertainty: Sequence[float | None] | None = None, undecided: str = "paper") -> dict[str, float]:
    """Normalized score and token rate of deciding at tau with rejection rate alpha, by the partial
    rewards (on the final reward's scale: finished candidates compete with their final reward, and
    one ranked below the cut stays eligible, as in the real algorithm), with the run's undecided rule."""
    r = replay_tau(bon, partial, tau, alpha, uncertainty=uncertainty, undecided=undecided,
                   seed=bon.settings.get("seed", 0))
    return {k: v for k, v in r.metrics(bon).items() if k in ("tau", "alpha", "normalized_score", "token_rate")}


def tradeoff_grid(bon: RunResult, partials: dict[int, list[float | None]], alphas: Iterable[float],
                  uncertainties: dict[int, list[float | None]] | None = None, undecided: str = "paper") -> pd.DataFrame:
    """Normalized score and token rate over a grid of (tau, alpha), by the run's undecided rule where the
    partials' half-widths are known."""
    import pandas as pd

    alphas, uncertainties = list(alphas), uncertainties or {}
    return pd.DataFrame([simulate_tau(bon, partial, tau, a, uncertainties.get(tau), undecided)
                         for tau, partial in partials.items() for a in alphas])


def partial_final_stats(bon: RunResult, partials: dict[int, list[float | None]]) -> pd.DataFrame:
    """Per decision token: Pearson and Kendall of partial vs final rewards, and the oracle cut c*,
    over the candidates still generating at tau."""
    import pandas as pd

    rows = []
    for tau, partial in partials.items():
        pairs = [(p, c.final_reward) for p, c in zip(partial, bon.candidates) if p is not None]
        if len(pairs) < 2:
            continue
        p, f = zip(*pairs)
        rows.append({"tau": tau, "candidates": len(pairs), **correlations(p, f), "oracle_cut": oracle_cut(p, f)})
    return pd.DataFrame(rows)
