"""Record the comparison the app shows on start: `python -m components.record`.

The shipped recording (assets/recorded_run.json) was made with the command in RECORDED_WITH below;
re-run it after changing a default (generator, reward) so the first thing a visitor sees matches
what Run gives them.
"""

from __future__ import annotations

import argparse
import sys
import time

from sbon.analysis.comparison import ComparisonDone, MethodEvent, comparison_events
from sbon.algorithms import DecisionTaken
from sbon.config import PRUNING_METHODS
from sbon.errors import SBoNError
from sbon.options import add_options, values

from .controls import ASSETS, RunSettings, load_examples
from .model_cache import ModelCache, configure_threads

RECORDED_WITH = "python -m components.record"  # the app's defaults, on its first example prompt


def main(argv: list[str] | None = None) -> int:
    examples = load_examples()
    defaults = RunSettings(prompt=examples[0].prompt if examples else "What is Atlantis?")
    p = argparse.ArgumentParser(prog="python -m components.record", description=__doc__.splitlines()[0])
    # Every setting of the page, with the page's defaults: the recording is what Run gives a visitor.
    add_options(p, defaults, skip=("batch_size",), overrides={"method": dict(choices=list(PRUNING_METHODS))})
    p.add_argument("--out", default=str(ASSETS / "recorded_run.json"))
    args = p.parse_args(argv)
    configure_threads()
    try:
        settings = RunSettings(**values(args, RunSettings))
        settings.check()
        gen, reward = ModelCache().get(settings.generator, settings.reward)
        start = time.perf_counter()
        for event in comparison_events(gen, reward, settings.prompt, settings.config(),
                                          bon_same_memory=settings.bon_same_memory):
            if isinstance(event, MethodEvent) and isinstance(event.event, DecisionTaken):
                point = event.event.decision
                print(f"{time.perf_counter() - start:6.1f} s  round {point.round} after {point.tokens} tokens: "
                      f"pruned {len(point.pruned)} of {len(point.contenders)}", file=sys.stderr)
            elif isinstance(event, ComparisonDone):
                event.comparison.to_json(args.out)
                m = event.comparison.metrics
                print(f"{time.perf_counter() - start:6.1f} s  written {args.out}: speedup {m['speedup']:.2f}, "
                      f"normalized score {m['normalized_score']:.1f}, token rate {m['token_rate']:.2f}", file=sys.stderr)
    except SBoNError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
