"""A tuning result (`python -m benchmarks tune`, a `tune*.json`) as the trade-off view shows it: the
rejection rate α and decision point that cost the fewest tokens at a mean normalized score above the
floor, for each pruning signal, and the run settings that reproduce the best one."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sbon.errors import SBoNError
from sbon.results import decision_token

from .updates import WARNING, Update

MAX_TUNE_BYTES = 5_000_000
COLUMNS = ["signal", "decision point (tokens)", "α", "normalized score", "token speedup", "winner kept", "Kendall"]


@dataclass
class Tuning:
    generator: str
    reward: str
    prompts: int
    floor: float
    run_config: dict[str, Any]  # the RunConfig fields of the best setting
    per_signal: dict[str, dict[str, Any] | None]  # None: the signal never reached the floor


def load_tuning(path: str | Path | None) -> Tuning:
    """Read a tune*.json, refusing anything else in one line."""
    if not path:
        raise SBoNError("no file was uploaded")
    if Path(path).stat().st_size > MAX_TUNE_BYTES:
        raise SBoNError("the file is too large for a tuning result")
    try:
        saved = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SBoNError(f"not a tuning result: {type(e).__name__}") from None
    if not isinstance(saved, dict) or saved.get("experiment") != "tune":
        raise SBoNError("not a tuning result: make one with `python -m benchmarks tune --from RAW.json`")
    try:
        tuning = Tuning(str(saved["generator"]), str(saved["reward"]), int(saved["prompts"]), float(saved["floor"]),
                        dict(saved["run_config"] or {}), dict(saved["per_signal"]))
    except (KeyError, TypeError, ValueError) as e:
        raise SBoNError(f"not a tuning result: {type(e).__name__} {e}") from None
    return tuning


def tuning_table(tuning: Tuning) -> pd.DataFrame:
    """One row per pruning signal: its cheapest setting at the floor, or that none reached it."""
    rows = []
    for signal, best in tuning.per_signal.items():
        if not best:
            rows.append([signal, None, None, None, None, "never reached the floor", None])
            continue
        rows.append([signal, decision_token(best), best.get("alpha"), _round(best.get("normalized_score"), 1),
                     _round(best.get("token_speedup"), 2), _percent(best.get("winner_kept")),
                     _round(best.get("kendall"), 2)])
    return pd.DataFrame(rows, columns=COLUMNS)


def tuning_summary(tuning: Tuning) -> str:
    """Markdown: what was tuned, on what, and the best setting."""
    c = tuning.run_config
    head = (f"**Tuned for** `{tuning.generator}` with reward `{tuning.reward}` on {tuning.prompts} prompts: the cheapest "
            f"single cut with a mean normalized score ≥ {tuning.floor:g}.")
    if not c:
        return head + " No setting reached the floor."
    return (head + f" Best: prune by **{c.get('prune_by')}** after **{c.get('first_decision', c.get('tau'))} tokens** "
            f"at **α = {c.get('alpha')}**. *Use these settings* puts them in the controls (method: one decision "
            "token τ, as tuned).")


def tuned_settings(tuning: Tuning) -> dict[str, Any]:
    """The RunSettings fields the best setting sets (those the page has controls for)."""
    c = tuning.run_config
    if not c:
        raise SBoNError("this tuning result has no setting that reached its floor")
    settings = {name: c[name] for name in ("method", "alpha", "tau", "prune_by", "n", "max_new_tokens") if name in c}
    if "first_decision" in c:
        settings["first_decision"] = c["first_decision"]
    return settings


def _round(x: Any, digits: int) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), digits)


def _percent(x: Any) -> str | None:
    return None if x is None else f"{100 * float(x):.0f} %"


def on_tune_upload(path: str | None) -> dict[str, Any]:
    try:
        tuning = load_tuning(path)
    except SBoNError as e:
        return {"tune_summary": f"⚠ could not read that file: {e}", "use_tuned": Update(visible=False), WARNING: str(e)}
    return {"tuning": tuning, "tune_summary": tuning_summary(tuning), "tune_table": tuning_table(tuning),
            "use_tuned": Update(visible=bool(tuning.run_config))}


def on_use_tuned(tuning: Tuning | None) -> dict[str, Any]:
    """Put the tuned setting in the controls (their change events then show the method's own knobs)."""
    return tuned_settings(tuning) if tuning is not None else {}
