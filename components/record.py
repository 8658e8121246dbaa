"""Record the comparison the app shows on start, and the gallery: `python -m components.record`.

The shipped recording (assets/recorded_run.json) was made with the command in RECORDED_WITH below;
re-run it after changing a default (generator, reward) so the first thing a visitor sees matches
what Run gives them. `--seeds 0 1 2 ...` records the page's defaults with each seed and keeps the one whose
partial rewards predicted best (components.gallery.prediction) as the run the page opens on.
`python -m components.record --gallery` records every other gallery story (components/gallery.py) into
assets/gallery/, with the settings, commit and load that made each file in assets/gallery/index.json;
`--gallery KEY ...` records only those.

The four run modules: `runs` generates a run on the page (live); `replays` shows a finished run without
generating (opened, uploaded, linked, from the gallery); `saved_runs` reads and writes a run as a file (no page
state); `record` is the command that makes the shipped recordings the replays open.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from sbon.analysis.comparison import Comparison, ComparisonDone, MethodEvent, comparison_events
from sbon.algorithms import DecisionTaken
from sbon.config import PRUNING_METHODS
from sbon.decoders import prepare
from sbon.errors import SBoNError
from sbon.options import add_options, values

from .controls import ASSETS, OPENING_SEED, RunSettings
from .gallery import GALLERY, INDEX_FILE, caption, facts, prediction, read_index
from .decode_paths import app_decode
from .model_cache import ModelCache
from .torch_thread import configure_threads

RECORDED_WITH = "python -m components.record"  # the app's defaults, on its default prompt
OPENING = "default"  # the gallery's entry for the run the page opens on (made by --seeds)
REPO = ASSETS.parent


def record(settings: RunSettings, out: str | Path, models: ModelCache) -> Comparison:
    """Run one comparison with these settings, say each decision point on stderr, write it to ``out``."""
    gen, reward = models.get(settings.generator, settings.reward)
    start = time.perf_counter()
    # The step is loaded (compiled here, in this process, where needed) before the clock starts, as the app loads it
    # while it warms up.
    config = settings.config()
    prepare(gen, config.decode)
    for event in comparison_events(gen, settings.reward_for_run(reward), settings.prompt, config,
                                   bon_same_memory=settings.bon_same_memory):
        if isinstance(event, MethodEvent) and isinstance(event.event, DecisionTaken):
            point = event.event.decision
            print(f"{time.perf_counter() - start:6.1f} s  round {point.round} after {point.tokens} tokens: "
                  f"pruned {len(point.pruned)} of {len(point.contenders)}", file=sys.stderr)
        elif isinstance(event, ComparisonDone):
            event.comparison.to_json(out)
            m = event.comparison.metrics
            print(f"{time.perf_counter() - start:6.1f} s  written {out}: speedup {m['speedup']:.2f}, "
                  f"normalized score {m['normalized_score']:.1f}, token rate {m['token_rate']:.2f}", file=sys.stderr)
            return event.comparison
    raise SBoNError("the comparison stopped without a result")


def git_commit() -> str | None:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or None


def record_gallery(keys: list[str], base: RunSettings, models: ModelCache) -> int:
    """Record the named gallery entries (when none is named, all but the page's opening run, which --seeds makes);
    a run that does not tell its entry's story is kept aside (<key>.rejected.json) and the command fails, so a
    caption never claims what its data does not show."""
    unknown = [k for k in keys if k not in GALLERY]
    if unknown:
        raise SBoNError(f"no gallery entry named {', '.join(unknown)}: use {', '.join(GALLERY)}")
    if OPENING in keys:
        raise SBoNError(f"the page's defaults ('{OPENING}') are recorded with --seeds, which keeps the seed whose "
                        f"partial rewards predict best: {RECORDED_WITH} --seeds 0 1 2 3")
    INDEX_FILE.parent.mkdir(parents=True, exist_ok=True)
    failed = 0
    for key in keys or [k for k in GALLERY if k != OPENING]:
        entry = GALLERY[key]
        settings = RunSettings(**{**base.to_dict(), **entry.run_settings()})
        settings.check()
        print(f"== {key}: {entry.title}", file=sys.stderr)
        comp = record(settings, entry.file, models)
        errors = facts(comp).story_errors(entry)
        if errors:
            entry.file.rename(entry.file.with_suffix(".rejected.json"))
            print(f"   does not tell its story: {'; '.join(errors)} (try another --seed)", file=sys.stderr)
            failed += 1
            continue
        line = write_index_entry(key, comp, settings, f"{RECORDED_WITH} --gallery {key}")
        print(f"   {line['caption']}", file=sys.stderr)
    return 1 if failed else 0


def write_index_entry(key: str, comp: Comparison, settings: RunSettings, command: str) -> dict:
    """The gallery index's line for one recording, made now by ``command``: its file, caption, command, settings,
    commit and load."""
    entry = GALLERY[key]
    commit, when, load = git_commit(), datetime.now(timezone.utc), list(os.getloadavg())
    index = read_index()  # read again: another recording may have written its entries meanwhile
    index[key] = {"file": str(entry.file.relative_to(ASSETS)), "title": entry.title, "caption": caption(comp, entry),
                  "command": command, "settings": settings.to_dict(), "commit": commit,
                  "machine": comp.speculative.machine, "weights": comp.speculative.weights, "decode": comp.speculative.decode,
                  "recorded": when.isoformat(timespec="seconds"), "load_average": load}
    INDEX_FILE.write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n")
    return index[key]


def record_opening(seeds: list[int], base: RunSettings, out: str | Path, models: ModelCache) -> int:
    """Record the page's defaults with each of ``seeds`` and keep, as the run the page opens on (``out``), the one
    whose partial rewards predicted best (components.gallery.prediction); say each seed's measure, and the seed the
    page's default must be (components.controls.OPENING_SEED) so that Run gives a visitor the run they first see."""
    folder = Path(tempfile.mkdtemp(prefix="sbon-opening-"))  # the seeds not chosen are not kept
    measured, made = {}, {}
    for seed in seeds:
        settings = RunSettings(**{**base.to_dict(), "seed": seed})
        settings.check()
        made[seed] = settings, record(settings, folder / f"seed{seed}.json", models)
        measured[seed] = prediction(made[seed][1])
        print(f"   seed {seed}: {measured[seed][0]} decision points outside the noise, Kendall at the first "
              f"{measured[seed][1]:.2f}", file=sys.stderr)
    best = max(measured, key=lambda seed: measured[seed])
    shutil.copyfile(folder / f"seed{best}.json", out)
    if Path(out).resolve() == GALLERY[OPENING].file.resolve():
        write_index_entry(OPENING, made[best][1], made[best][0], f"{RECORDED_WITH} --seeds {' '.join(map(str, seeds))}")
    print(f"the page opens on seed {best}: written {out}"
          + ("" if best == OPENING_SEED else f"; set OPENING_SEED = {best} in components/controls.py"), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    # The page's defaults, its prompt included, decoding as the app does (SBON_DECODE): the index's settings then say
    # which path the run asked for, and each entry's `decode` which one it took.
    defaults = RunSettings(decode=app_decode())
    p = argparse.ArgumentParser(prog="python -m components.record", description=__doc__.splitlines()[0])
    # Every setting of the page, with the page's defaults: the recording is what Run gives a visitor.
    add_options(p, defaults, skip=("batch_size",), overrides={"method": dict(choices=list(PRUNING_METHODS))})
    p.add_argument("--out", default=str(ASSETS / "recorded_run.json"))
    p.add_argument("--gallery", nargs="*", metavar="KEY", default=None,
                   help=f"record the gallery's stories instead ({', '.join(GALLERY)}; all but {OPENING}, which --seeds "
                        "makes, when none is named), each "
                        "with its own settings over the ones given here")
    p.add_argument("--seeds", nargs="+", type=int, metavar="SEED", default=None,
                   help="record the page's defaults with each seed and keep the one whose partial rewards predict best "
                        "as the run the page opens on (components.gallery.prediction)")
    args = p.parse_args(argv)
    configure_threads()
    try:
        settings = RunSettings(**values(args, RunSettings))
        if args.gallery is not None:
            return record_gallery(args.gallery, settings, ModelCache())
        if args.seeds:
            return record_opening(args.seeds, settings, args.out, ModelCache())
        settings.check()
        record(settings, args.out, ModelCache())
    except SBoNError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
