"""The gallery: recorded runs that open without generating, each a story with a one-line caption.

Each entry of ``GALLERY`` names the settings that make its story (on top of the page's defaults) and
the claims the story makes about its run (Best-of-N's winner kept or pruned, a candidate pruned for an
instruction it had already broken, ...). ``python -m components.record --gallery`` records every entry
into ``assets/gallery/`` and writes ``index.json`` with the settings, command, commit and load that made
each file; it refuses a recording whose data does not tell the entry's story. The caption is written
from the run itself (``caption``), never typed, so it cannot disagree with the file.

The app loads every gallery run once (``GalleryRuns``), so opening one costs no model and no file read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from sbon.analysis.comparison import Comparison
from sbon.errors import SBoNError
from sbon.metrics import decision_quality
from sbon.models import INSTRUCTION_REWARD
from sbon.rewards import bind_instructions
from sbon.signals import signal_title

from .controls import ASSETS

log = logging.getLogger("sbon.gallery")
GALLERY_DIR = ASSETS / "gallery"
INDEX_FILE = GALLERY_DIR / "index.json"


@dataclass(frozen=True)
class GalleryEntry:
    key: str = field(metadata={"help": "the file's name (assets/gallery/<key>.json) and the run's id in a link"})
    title: str = field(metadata={"help": "what the run shows, a few words (the gallery's choice label)"})
    settings: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "RunSettings fields that differ from the page's defaults"})
    ifeval_key: int | None = field(default=None, metadata={
        "help": "an IFEval prompt of the shipped file, by key (the prompt setting then comes from it)"})
    winner: str | None = field(default=None, metadata={
        "help": "the story's claim about Best-of-N's winner: 'kept' at every decision point, or 'pruned' at one"})
    violation_pruned: bool = field(default=False, metadata={
        "help": "the story's claim that some candidate was pruned after it had already broken an instruction"})
    open_pruned: bool = field(default=False, metadata={
        "help": "the story's claim that some candidate was pruned while an instruction was still open"})
    weak: bool = field(default=False, metadata={
        "help": "the story's claim that its partial rewards did not predict (see prediction): its caption says why"})

    file_name: str = field(default="", metadata={"help": "its file, under assets/ or absolute, when not assets/gallery/<key>.json"})

    @property
    def file(self) -> Path:
        return ASSETS / self.file_name if self.file_name else GALLERY_DIR / f"{self.key}.json"

    def run_settings(self) -> dict[str, Any]:
        """The settings the recording passes on top of the page's defaults (the prompt included)."""
        settings = dict(self.settings)
        if self.ifeval_key is not None:
            settings["prompt"] = ifeval_prompt(self.ifeval_key)
        return settings


IFEVAL = dict(reward=INSTRUCTION_REWARD, prune_by="reward", alpha=0.5)  # the Follow-instructions scenario, one deep cut
# Stories recorded with the page's former defaults: their settings pinned, so they record the same whatever the
# page starts from now.
FIRST_EXAMPLE = "Hi, I'd like to make my own peanut brittle. Can you give me a recipe and cooking instructions for that?"
FLUENCY = dict(reward="likelihood", prune_by="logprob", prompt=FIRST_EXAMPLE)

GALLERY: dict[str, GalleryEntry] = {e.key: e for e in (
    # The run the page opens on (assets/recorded_run.json) is the gallery's first story: of the page's defaults
    # recorded with several seeds, the one whose partial rewards predicted best (prediction; python -m
    # components.record --seeds chooses it, and the page's default seed is its seed).
    GalleryEntry("default", "The page's defaults", winner="kept", file_name="recorded_run.json"),
    GalleryEntry("coin-toss", "A weak case: partial rewards no better than a coin toss",
                 settings=dict(seed=0), winner="kept", weak=True),
    GalleryEntry("early-violation", "Follow instructions: an early violation prunes safely",
                 settings=IFEVAL, ifeval_key=2798, winner="kept", violation_pruned=True),
    GalleryEntry("open-instruction", "Follow instructions: an open instruction, Best-of-N's winner pruned",
                 settings=dict(IFEVAL, seed=3), ifeval_key=102, winner="pruned", open_pruned=True),
    GalleryEntry("high-alpha", "A high α: most candidates cut at the first decision point", settings=dict(alpha=0.8, **FLUENCY)),
    GalleryEntry("reward-free", "A reward-free pruning signal (how certain the generator is)",
                 settings=dict(reward="minilm-pref", prune_by="self-certainty", prompt=FIRST_EXAMPLE)),
    GalleryEntry("single-tau", "The single-τ variant: one decision point at τ", settings=dict(method="sbon-tau", **FLUENCY)),
)}


def ifeval_prompt(key: int) -> str:
    from sbon.ifeval import load_prompts
    from sbon.ifeval.data import SHIPPED_FILE

    for p in load_prompts(SHIPPED_FILE):
        if p.key == key:
            return p.prompt
    raise SBoNError(f"no IFEval prompt with key {key} in the shipped file")


# -- what a run shows: facts read from its data, the caption written from them ----------------------

@dataclass(frozen=True)
class Facts:
    """What a recorded run shows, read from its data; the caption and the story's checks use only these."""
    method: str
    alpha: float
    signal: str
    reward: str
    points: int  # decision points
    pruned: int  # candidates pruned over all of them
    n: int
    winner: str  # "kept" (survived every decision point), "pruned", "retired" (finished), "none" (no decision point)
    winner_round: int | None  # where it was pruned
    same_answer: bool
    token_rate: float
    violation_pruned: int  # pruned candidates that had already broken an instruction (rewards that explain)
    open_pruned: int  # pruned candidates whose instructions were all still open or followed
    weakness: str = ""  # why its partial rewards did not predict ('' when they did): see weakness()

    def story_errors(self, entry: GalleryEntry) -> list[str]:
        """Where this run does not tell the entry's story ([] when it does)."""
        errors = []
        if entry.winner and self.winner != entry.winner:
            errors.append(f"Best-of-N's winner was {self.winner}, the story says {entry.winner}")
        if entry.violation_pruned and not self.violation_pruned:
            errors.append("no candidate was pruned after breaking an instruction")
        if entry.open_pruned and not self.open_pruned:
            errors.append("no candidate was pruned while its instructions were open")
        if entry.weak and not self.weakness:
            errors.append("its partial rewards predicted: not a weak case")
        expected = {**{"method": "sbon", "alpha": None}, **entry.settings}
        if self.method != expected["method"] or (expected["alpha"] is not None and self.alpha != expected["alpha"]):
            errors.append(f"recorded with {self.method}, α={self.alpha}, not the entry's settings")
        if self.points == 0:
            errors.append("the run has no decision point")
        return errors


def prediction(comp: Comparison) -> tuple[int, float]:
    """How well a run's partial rewards predicted, the measure that chooses the run the page opens on: (decision
    points whose cut was not a coin toss, i.e. some live contender lay outside the reward's noise of the cut
    (components.reasons.coin_toss); Kendall of the partial with the final rewards at the first decision point),
    compared in that order, higher is better."""
    from .reasons import coin_toss  # the captions' own test of a coin toss

    points = comp.speculative.decision_points
    kendall = decision_quality(comp.bon, comp.speculative)[0]["kendall"] if points else float("nan")
    return sum(not coin_toss(p) for p in points), kendall


def weakness(comp: Comparison) -> str:
    """Why a run's partial rewards did not predict, in words from its data ('' when they did: some cut outside the
    reward's noise and a positive Kendall at the first decision point)."""
    decided, kendall = prediction(comp)
    points = len(comp.speculative.decision_points)
    if decided and kendall > 0:
        return ""
    noise = (f"at {'every' if not decided else f'{points - decided} of {points}'} decision point"
             f"{'' if not decided else 's'} the scores were within the reward's noise of the cut")
    return (f"{noise}, and at the first the partial rewards' Kendall with the final rewards was {kendall:.2f}: "
            "close to a coin toss")


def facts(comp: Comparison) -> Facts:
    quality = decision_quality(comp.bon, comp.speculative)
    fates = [q["winner"] for q in quality]
    winner = ("diverged" if "diverged" in fates else "pruned" if "pruned" in fates else "retired" if "retired" in fates
              else "kept" if fates else "none")
    winner_round = next((q["round"] for q in quality if q["winner"] == "pruned"), None)
    violated, open_ = _instruction_fates(comp)
    s = comp.speculative.settings
    return Facts(method=comp.speculative.method, alpha=s.get("alpha"), signal=str(s.get("prune_by") or "reward"),
                 reward=comp.speculative.reward, points=len(comp.speculative.decision_points),
                 pruned=sum(len(p.pruned) for p in comp.speculative.decision_points), n=comp.n, winner=winner,
                 winner_round=winner_round, same_answer=comp.speculative.best_id == comp.bon.best_id,
                 token_rate=comp.metrics["token_rate"], violation_pruned=violated, open_pruned=open_,
                 weakness=weakness(comp))


def _instruction_fates(comp: Comparison) -> tuple[int, int]:
    """(pruned after breaking an instruction, pruned with every instruction open or kept) for a run judged by
    the ifeval reward, from the verdicts on each pruned candidate's text as it was when pruned; (0, 0) else."""
    if comp.speculative.reward != INSTRUCTION_REWARD:
        return 0, 0
    from sbon.ifeval.reward import IFEvalReward  # no model: the checks are programs

    reward, violated, open_ = bind_instructions(IFEvalReward(), comp.speculative.prompt, comp.speculative.instructions), 0, 0
    for c in comp.speculative.candidates:
        if c.pruned_round is None:
            continue
        verdicts = reward.explain(comp.speculative.prompt, c.text, final=False)
        if any(v.status == "violated" for v in verdicts):
            violated += 1
        else:
            open_ += 1
    return violated, open_


def caption(comp: Comparison, entry: GalleryEntry | None = None, titled: bool = True) -> str:
    """One line, written from the run's data: what was pruned, by what, and what it cost; after the entry's title
    unless ``titled`` is False (a list that sets the title apart already)."""
    f = facts(comp)
    by = "its partial rewards" if f.signal == "reward" else signal_title(f.signal)
    what = (f"{f.pruned} of {f.n} candidates pruned at {f.points} decision point{'s' if f.points != 1 else ''} "
            f"(α={f.alpha}, by {by})")
    if f.violation_pruned or f.open_pruned:
        what += (f"; {f.violation_pruned} had already broken an instruction, "
                 f"{f.open_pruned} still had every instruction open")
    winner = {"kept": "Best-of-N's winner kept", "retired": "Best-of-N's winner finished before a cut",
              "none": "nothing pruned", "diverged": "Best-of-N's winner came out differently in this run",
              "pruned": f"Best-of-N's winner pruned in round {f.winner_round}"}[f.winner]
    answer = "same answer as Best-of-N" if f.same_answer else "a different answer than Best-of-N"
    head = f"{entry.title}: " if entry and titled else ""
    weak = f" Why it is weak: {f.weakness}." if entry is not None and entry.weak and f.weakness else ""
    return f"{head}{what}; {winner}, {answer}, {f.token_rate:.0%} of Best-of-N's tokens.{weak}"


# -- the shipped gallery, loaded once ---------------------------------------------------------------

def read_index(path: Path = INDEX_FILE) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class GalleryRun:
    entry: GalleryEntry
    comp: Comparison | None
    error: str = ""  # one line when its file did not load

    @cached_property
    def caption(self) -> str:
        return caption(self.comp, self.entry) if self.comp is not None else f"{self.entry.title}: {self.error}"

    @cached_property
    def untitled(self) -> str:
        """The caption without the title, for a list that shows the title beside it."""
        return caption(self.comp, self.entry, titled=False) if self.comp is not None else self.error


class GalleryRuns:
    """Every gallery file, read and checked once (at the app's start): opening one is a lookup. A file
    that fails to load stays in the list with its one-line reason instead of taking the gallery down."""

    def __init__(self, entries: dict[str, GalleryEntry] = GALLERY, check=None):
        self.runs: dict[str, GalleryRun] = {}
        for key, entry in entries.items():
            try:
                comp = Comparison.load(entry.file)
                if check is not None:
                    check(comp)
                self.runs[key] = GalleryRun(entry, comp)
            except (SBoNError, OSError, ValueError, RecursionError) as e:
                log.warning("gallery run %s not loaded: %s", key, first_line(e))  # the detail for the operator
                self.runs[key] = GalleryRun(entry, None, "this recorded run is missing or broken; the others still open")

    def choices(self) -> list[tuple[str, str]]:
        return [(run.entry.title, key) for key, run in self.runs.items()]

    def get(self, key: str) -> GalleryRun:
        run = self.runs.get(key)
        if run is None:
            raise SBoNError(f"there is no gallery run named {key[:40]!r}")
        if run.comp is None:
            raise SBoNError(run.caption)
        return run


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
