"""Where an experiment's prompts run: in this process (``common.LocalRunner``) or on Ray workers
(``distributed.Pool``, with --ray). :func:`setup` loads the models and picks the runner; the experiment
passes ``args.runner`` down to ``common.map_prompts`` and ``common.environment``."""

from __future__ import annotations

import argparse
import sys

import torch

from sbon.engine import Generator
from sbon.rewards import RewardModel

from . import common


def setup(args: argparse.Namespace) -> tuple[Generator, RewardModel]:
    """This process's models and the runner (``args.runner``); with --ray also the Ray workers, each
    loading its own. This process then only tokenizes and names the models: it loads them on the CPU
    unless --device says otherwise, so that it takes no GPU from a worker."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    args.runner = common.LOCAL
    if getattr(args, "ray", None) is not None:
        from . import distributed

        args.runner = distributed.Pool(args)
        device = device or "cpu"
    print(f"loading generator '{args.generator}' and reward '{args.reward}' ...", file=sys.stderr)
    return common.load_models(args.generator, args.reward, device, args.dtype)
