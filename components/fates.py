"""What happened to each candidate of a Speculative Rejection run, and the colour it is drawn in.

Every view names fates the same way: "survived" (never pruned and had at least one partial
reward), "pruned in round r", or "finished early" (finished before the first decision point,
so it only ever competed with its final reward).
"""

from __future__ import annotations

from sbon.results import FINISHED_EARLY, SURVIVED

from .style import FINISHED_EARLY_COLOR, PRUNED_COLORS, SURVIVED_COLOR


def fate_order(fates: set[str]) -> list[str]:
    """Legend order: survived, finished early, then pruned by round."""
    pruned = sorted((f for f in fates if f.startswith("pruned")), key=lambda f: int(f.rsplit(" ", 1)[1]))
    return [f for f in (SURVIVED, FINISHED_EARLY) if f in fates] + pruned


def fate_help(name: str) -> str:
    """One line saying what a fate means, for a legend or a tooltip."""
    if name == SURVIVED:
        return "never pruned: it reached at least one decision point and went on to finish"
    if name == FINISHED_EARLY:
        return "finished before the first decision point it could meet: no partial score ranked it, and it stays eligible"
    if name.startswith("pruned in round "):
        return (f"halted at decision point {name.rsplit(' ', 1)[1]}: its score fell below the cut (or could not be told "
                "apart from it, or the survivors had to fit the KV budget); its final reward comes from its Best-of-N twin")
    return ""


def fate_color(name: str) -> str:
    if name == SURVIVED:
        return SURVIVED_COLOR
    if name == FINISHED_EARLY:
        return FINISHED_EARLY_COLOR
    return PRUNED_COLORS[(int(name.rsplit(" ", 1)[1]) - 1) % len(PRUNED_COLORS)]
