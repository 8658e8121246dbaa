"""A verifiable-instruction reward from IFEval (Zhou et al. 2023): checks a person can verify.

- ``checkers``: the 25 instruction types, each with the reference's final check and a partial verdict;
- ``verdicts``: ``Verdict`` and strict/loose final verdicts, partial verdicts;
- ``reward``: ``IFEvalReward``, the reward (``score``, ``score_partial``, ``explain``, ``register``);
- ``data``: IFEval prompt files, checked at load time; ``calibrate``: the open pass rates.
"""

from .checkers import CHECKERS, build
from .data import IFEvalPrompt, load_prompts
from .reward import IFEvalReward
from .verdicts import Verdict

__all__ = ["CHECKERS", "IFEvalPrompt", "IFEvalReward", "Verdict", "build", "load_prompts"]
