"""`python -m sbon.ifeval.score_noise --reward NAME`: measure a reward preset's score noise on partial responses
on the IFEval calibration split's sampled responses (the definition is in :mod:`sbon.score_noise`) and write it to
``sbon/assets/score_noise.json``."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ..score_noise import NOISE_FILE, measure
from .calibrate import SAMPLES_FILE, read_samples
from .data import SHIPPED_FILE, is_calibration, load_prompts


def main(argv=None) -> int:
    from ..models import load_generator, load_reward  # the models only when measuring

    p = argparse.ArgumentParser(prog="python -m sbon.ifeval.score_noise", description=__doc__.split("\n\n")[0])
    p.add_argument("--reward", required=True, help="a reward preset")
    p.add_argument("--tokens", type=int, default=32, help="the decision point: tokens of the first prefix")
    p.add_argument("--step", type=int, default=8, help="tokens more in the second prefix")
    p.add_argument("--samples-file", type=Path, default=SAMPLES_FILE)
    args = p.parse_args(argv)
    start, load = time.perf_counter(), os.getloadavg()
    gen = load_generator()
    reward = load_reward(args.reward, generator=gen)
    prompts = {q.key: q for q in load_prompts(SHIPPED_FILE) if is_calibration(q.key)}
    rows = [r for r in read_samples(args.samples_file) if r["key"] in prompts]
    found = measure(gen, reward, rows, prompts, args.tokens, args.step)
    data = json.loads(NOISE_FILE.read_text()) if NOISE_FILE.exists() else {"rewards": {}}
    data["rewards"][args.reward] = {**found, "tokens": args.tokens, "step": args.step, "split": "IFEval calibration (odd key)",
                                    "command": f"python -m sbon.ifeval.score_noise --reward {args.reward}",
                                    "seconds": round(time.perf_counter() - start, 1), "load_average": load}
    NOISE_FILE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.reward}: score noise {found['noise']:.4g} over {found['responses']} responses; wrote {NOISE_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
