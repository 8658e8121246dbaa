"""Analysis built on the core: replays and comparisons of runs, never imported by the core.

- :mod:`.replay` -- the single-decision-token cut replayed on completed Best-of-N candidates, through
  the same :func:`sbon.cut.cut` the real run takes (so a replay keeps what a run keeps).
- :mod:`.counterfactual` -- partial rewards of Best-of-N's prefixes, the (tau, alpha) trade-off grid.
- :mod:`.signal_matrix` -- pruning signals side by side on the same candidates.
- :mod:`.comparison` -- Best-of-N and Speculative Rejection on one prompt, paired by coupled sampling.

Data flows one way: engine -> events/results (``sbon``) -> analysis -> figures (``components``).
"""
