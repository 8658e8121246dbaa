"""Saved runs as files: a run written for download, a page written for download, an uploaded file read and
checked before any view draws it. Plain data and files only: the page (app.py) shows what these return.

The four run modules: `runs` generates a run on the page (live); `replays` shows a finished run without
generating (opened, uploaded, linked, from the gallery); `saved_runs` reads and writes a run as a file (no page
state); `record` is the command that makes the shipped recordings the replays open."""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path

from sbon.analysis.comparison import Comparison
from sbon.errors import SBoNError

MAX_UPLOAD_BYTES = 20_000_000
MAX_ABS_NUMBER = 1e9  # no reward, threshold or timing of a real run comes near this
DOWNLOAD_TTL_S = 3600


def save_for_download(comp: Comparison) -> str:
    """Write a new run where Gradio may serve it (the system temp dir) and return the path; files
    older than DOWNLOAD_TTL_S go, so a long-lived server does not fill its disk."""
    return temp_file(comp.to_json(), "sbon-run-", ".json")


def temp_file(text: str, prefix: str, suffix: str) -> str:
    folder = Path(tempfile.gettempdir()) / "sbon-explorer"
    folder.mkdir(exist_ok=True)
    for old in folder.glob(f"{prefix}*{suffix}"):
        if time.time() - old.stat().st_mtime > DOWNLOAD_TTL_S:
            old.unlink(missing_ok=True)
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def load_upload(path: str | None) -> Comparison:
    if not path:
        raise SBoNError("no file was uploaded")
    if Path(path).stat().st_size > MAX_UPLOAD_BYTES:
        raise SBoNError(f"the file is larger than {MAX_UPLOAD_BYTES // 1_000_000} MB: not a saved run of this app")
    try:
        comp = Comparison.load(path)
    except RecursionError:  # JSON nested thousands deep: the parser gives up before any check runs
        raise SBoNError("not a saved comparison: the JSON is nested too deeply") from None
    check_replayable(comp)
    return comp


def check_replayable(comp: Comparison) -> None:
    """Refuse what Comparison.load accepts but no run makes: rewards, thresholds or timings that are
    not finite or absurdly large, a candidate pruned at a decision point its run does not have.
    Such a file would draw empty or broken views instead of a clear refusal."""
    for run in (comp.bon, comp.speculative):
        rounds = {p.round for p in run.decision_points}
        numbers = [*run.timings.values(), *(x for p in run.decision_points for x in (p.cut, *p.scores))]
        for c in run.candidates:
            numbers += [r.reward for r in c.partial_rewards] + [c.final_reward or 0.0]
            if c.pruned_round is not None and c.pruned_round not in rounds:
                raise SBoNError(f"not a saved comparison: candidate {c.id} of the {run.method} run was pruned in "
                                f"round {c.pruned_round}, which the run does not have")
        if run is comp.bon:  # the counterfactual partial rewards and the watched signals score its candidates
            scored = [*comp.partials.values(), *(row for by_t in comp.signal_scores.values() for row in by_t.values())]
            numbers += [x for row in scored for x in row if x is not None]
        bad = next((x for x in numbers if not math.isfinite(x) or abs(x) > MAX_ABS_NUMBER), None)
        if bad is not None:
            raise SBoNError(f"not a saved comparison: the {run.method} run holds the number {bad:g} "
                            f"(rewards and timings of a real run are finite and far below {MAX_ABS_NUMBER:g})")
