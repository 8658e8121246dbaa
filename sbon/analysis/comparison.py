"""Speculative Rejection next to Best-of-N on the same prompt and seed, as one saved object.

:func:`comparison_events` runs Speculative Rejection, then Best-of-N with the same settings, then
scores every Best-of-N candidate's prefixes at a few decision tokens (the counterfactual data of
the paper's Figure 3). It yields each algorithm's events as they happen, wrapped with the method
that produced them, and ends with :class:`ComparisonDone` carrying a :class:`Comparison`.

Coupled sampling makes candidate k the same response in both runs: a candidate pruned by
Speculative Rejection is a prefix of Best-of-N's candidate k, so Best-of-N supplies the final
reward (and the continuation) the pruned candidate never got. A response both runs finished has one
final reward, the one Speculative Rejection gave it (:class:`ScoredOnce`).

A :class:`Comparison` holds only plain data; it saves to JSON and loads back with no model, so
every view of a run can be replayed from a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, Union

import torch

from ..algorithms import Done, Event, drive, events
from ..config import PRUNING_METHODS, RunConfig
from ..engine import Generator
from ..errors import SBoNError
from ..ifeval.instructions import parse_instructions
from ..machine_load import busy_note
from ..metrics import compare, diverged_ids, final_of, twin_diverged
from ..results import RunResult, dump_json
from ..rewards import RewardModel
from ..signals import check_signal, watched_by_default
from .counterfactual import prefix_rewards, prefix_uncertainties, run_partials
from .signal_matrix import Scores, SignalWatch

FORMAT = "sbon-comparison/1"


# -- the saved object -------------------------------------------------------------------------

@dataclass
class Comparison:
    """A Speculative Rejection run and the Best-of-N run with the same prompt, seed and settings.

    ``partials[tau][k]`` is the partial reward of Best-of-N candidate k after tau tokens (None if
    it had finished by then): what Speculative Rejection would have seen with decision token tau.
    ``signal_scores[name][t][k]`` is pruning signal ``name``'s score of Best-of-N candidate k after t
    tokens (None if it had finished), at the SBoN run's decision-point token counts t: recorded while
    Best-of-N generated (no extra pass), so that each signal's cut can be replayed on the same
    candidates. The reward's own partial scores are in ``partials``. Empty in files saved before it
    existed, or when the run watched no signal.
    ``metrics`` is :func:`sbon.metrics.compare` of the two runs; it is recomputed on load, so a
    saved file cannot disagree with its own runs. The saved file also carries the headline
    (:func:`headline_text`) and the wall-time line (:func:`wall_time_text`) as text, for readers without this
    package; they too are recomputed, never read.
    """
    bon: RunResult
    speculative: RunResult  # Speculative Rejection's run (its JSON key is "sbon", its method's name)
    partials: dict[int, list[float | None]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    signal_scores: Scores = field(default_factory=dict)
    # uncertainties[tau][k]: the half-width of partials[tau][k] (sbon.cut's undecided candidates), where the reward
    # knows it; empty otherwise and in files saved before it existed.
    uncertainties: dict[int, list[float | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_pair(self.bon, self.speculative, self.partials)
        for name, by_t in self.signal_scores.items():
            check_pair(self.bon, self.speculative, by_t, what=f"{name} scores")
        self.metrics = compare(self.bon, self.speculative)

    @property
    def n(self) -> int:
        return len(self.bon.candidates)

    def final_reward(self, k: int) -> float | None:
        """Final reward of candidate k: its own if it finished in the SBoN run, else Best-of-N's -- None when its
        Best-of-N twin diverged (that final reward scores another text: :func:`sbon.metrics.final_of`)."""
        return final_of(self.bon, self.speculative, k)

    def diverged(self, k: int) -> bool:
        """True if candidate k's token ids in the SBoN run are not a prefix of its Best-of-N twin's.

        Coupled sampling makes them equal where a row's logits do not depend on the batch; in bfloat16 (on a GPU,
        or a CPU that emulates it) batch-dependent rounding can flip a token, and the two texts part from there on."""
        return twin_diverged(self.bon, self.speculative, k)

    @property
    def diverged_ids(self) -> list[int]:
        """The candidates that came out differently in the two runs: for them the runs are not one story."""
        return diverged_ids(self.bon, self.speculative)

    def twin(self, k: int) -> bool:
        """True if Best-of-N's candidate k is the same response as this run's candidate k (coupling held for it)."""
        return not self.diverged(k)

    def continuation(self, k: int) -> str:
        """The text candidate k would have generated after it was pruned (from Best-of-N); empty
        for a candidate that finished or whose twin diverged. With coupled sampling the pruned text
        is a prefix of the Best-of-N text, so the continuation is what lies past its length."""
        cand, twin = self.speculative.candidates[k], self.bon.candidates[k]
        if cand.finished or self.diverged(k) or not twin.text.startswith(cand.text):
            return ""
        return twin.text[len(cand.text):]

    # -- JSON --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        # The headline and wall-time lines are derived, as the metrics are, and ignored on load (recomputed).
        return {"format": FORMAT, "headline": headline_text(self), "wall_time": wall_time_text(self),
                "bon": self.bon.to_dict(), "sbon": self.speculative.to_dict(),
                "partials": {str(tau): list(p) for tau, p in self.partials.items()}, "metrics": dict(self.metrics),
                "signal_scores": {name: {str(t): list(v) for t, v in by_t.items()}
                                  for name, by_t in self.signal_scores.items()},
                "uncertainties": {str(tau): list(u) for tau, u in self.uncertainties.items()}}

    def to_json(self, path: str | Path | None = None) -> str:
        return dump_json(self.to_dict(), path)

    @classmethod
    def from_dict(cls, d: Any) -> "Comparison":
        if not isinstance(d, dict):
            raise SBoNError("not a saved comparison: the file holds no JSON object")
        if d.get("format") != FORMAT:
            raise SBoNError(f"not a saved comparison: expected format '{FORMAT}', found {d.get('format')!r}")
        for key in ("bon", "sbon"):
            if not isinstance(d.get(key), dict):
                raise SBoNError(f"not a saved comparison: '{key}' is missing or not an object")
        try:
            bon, sbon = RunResult.from_dict(d["bon"]), RunResult.from_dict(d["sbon"])
        except (AttributeError, TypeError, ValueError) as e:
            if isinstance(e, SBoNError):
                raise
            raise SBoNError(f"not a saved comparison: malformed run ({type(e).__name__}: {e})") from None
        raw = d.get("partials", {})
        if not isinstance(raw, dict):
            raise SBoNError("not a saved comparison: 'partials' is not an object")
        try:
            partials = {int(tau): [None if r is None else float(r) for r in p] for tau, p in raw.items()}
            uncertainties = {int(tau): [None if r is None else float(r) for r in u]
                             for tau, u in (d.get("uncertainties") or {}).items()}
        except (TypeError, ValueError, AttributeError) as e:
            raise SBoNError(f"not a saved comparison: bad partial rewards ({e})") from None
        signal_scores = _read_signal_scores(d.get("signal_scores", {}))  # absent in files saved before it
        if len(bon.candidates) != len(sbon.candidates):  # the likeliest damage: say it plainly, first
            raise SBoNError(f"not a comparison: {len(bon.candidates)} Best-of-N candidates but "
                            f"{len(sbon.candidates)} SBoN candidates")
        for key, run in (("bon", bon), ("sbon", sbon)):
            _check_types(run)
            if run.instructions:  # the ones its reward judged by: they must still build (absent in older files)
                parse_instructions(run.instructions, f"not a saved comparison: {key}.instructions")
        try:
            return cls(bon, sbon, dict(sorted(partials.items())), signal_scores=signal_scores,
                       uncertainties={tau: u for tau, u in sorted(uncertainties.items()) if len(u) == len(bon.candidates)})
        except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as e:
            if isinstance(e, SBoNError):
                raise
            raise SBoNError(f"not a saved comparison: {type(e).__name__}: {e}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> "Comparison":
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SBoNError(f"not a saved comparison (invalid JSON: {e})") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> "Comparison":
        try:
            return cls.from_json(Path(path).read_bytes())
        except OSError as e:
            raise SBoNError(f"cannot read saved comparison '{path}': {e.strerror or e}") from None


# -- the headline: one text for the page, the command line and /compare --------------------------------

def headline_text(comp: Comparison, strong: Callable[[str], str] = lambda text: text) -> str:
    """What Speculative Rejection returned and what it cost, in costs the runs themselves determine: the same
    for the same seed and settings on any machine, under any load (no time in it). ``strong`` marks the key
    phrases (Markdown bold on the page, nothing on the command line)."""
    m, sbon, bon = comp.metrics, comp.speculative, comp.bon
    same = "the same response as Best-of-N" if sbon.best.text == bon.best.text else \
        f"candidate {sbon.best_id} where Best-of-N returned candidate {bon.best_id}" if sbon.best_id != bon.best_id else \
        f"its own version of candidate {sbon.best_id}, not Best-of-N's"
    steps, bon_steps = m["sbon_steps"], m["bon_steps"]
    after = ""
    if steps == bon_steps:
        cost = (f"in as many sequential decode steps as Best-of-N ({steps}: Best-of-N held all its candidates in one "
                + ("batch, and no candidate was pruned, so the two runs cost the same)"
                   if m["sbon_tokens"] == m["bon_tokens"] else "batch, so here only the tokens differ)"))
    else:
        ratio = m["step_speedup"]
        times = f"{ratio:.2f}× fewer" if ratio >= 1 else f"{1 / ratio:.2f}× more"
        batches = bon.batches
        # Nothing pruned: every step saved is Best-of-N's batching (it reserves each candidate's full length, so
        # the same memory holds fewer of them), and the key phrase says so, since the projector shows it alone.
        unpruned = steps < bon_steps and len(batches) > 1 and all(c.pruned_round is None for c in sbon.candidates)
        cost = "in " + strong(f"{steps} sequential decode steps, {times} than Best-of-N's {bon_steps}"
                              + (f" in {len(batches)} batches, with no candidate pruned" if unpruned else ""))
        if unpruned:
            after = (f" Every step saved comes from Best-of-N's batches: it held at most {max(map(len, batches))} of its "
                     f"{comp.n} candidates at once, where Speculative Rejection held all {comp.n}.")
    coupling = coupling_note(comp)
    return (f"{coupling}\n\n" if coupling else "") + (f"{strong(f'Speculative Rejection returned {same}')} (normalized score {m['normalized_score']:.1f}; "
            f"pruning at random with the same survivor counts would have scored "
            f"{m['random_pruning_normalized_score']:.1f} on average) {cost}, generating {m['sbon_tokens']} of "
            f"Best-of-N's {m['bon_tokens']} tokens ({m['token_rate']:.0%} of them).{after}")


def coupling_note(comp: Comparison) -> str:
    """One plain line when the two runs are not one story: how many candidates came out differently (their
    Best-of-N twins diverged), so that what the page says of a candidate in both runs is approximate; '' when
    coupling held for every candidate."""
    parted = comp.diverged_ids
    if not parted:
        return ""
    return (f"{len(parted)} of {comp.n} candidate{'s' if comp.n != 1 else ''} came out differently in the two runs on "
            f"this machine: the comparison is approximate.")


def wall_time_text(comp: Comparison, name: Callable[[str], str] = str) -> str:
    """The wall times this machine measured, secondary to the headline, with a warning when the machine was
    busy while a run ran (:func:`sbon.machine_load.busy`). ``name``: how the machine class is written (the page
    leaves out a CPU's instruction set)."""
    m = comp.metrics
    ratio = f"{m['speedup']:.2f}× faster" if m["speedup"] >= 1 else f"{1 / m['speedup']:.2f}× slower"
    machine = comp.speculative.machine and name(comp.speculative.machine)
    where = f"on {machine}" if machine else "on the machine that ran it (not recorded)"
    line = (f"Wall time {where}: {comp.speculative.wall_time:.1f} s against {comp.bon.wall_time:.1f} s ({ratio}; "
            "it depends on the machine and what else runs on it).")
    note = busy_note({"Speculative Rejection": comp.speculative.load, "Best-of-N": comp.bon.load})
    return f"{line} {note}" if note else line


def _read_signal_scores(raw: Any) -> Scores:
    if not isinstance(raw, dict) or not all(isinstance(by_t, dict) for by_t in raw.values()):
        raise SBoNError("not a saved comparison: 'signal_scores' is not an object of objects")
    try:
        return {str(name): {int(t): [None if v is None else float(v) for v in row] for t, row in sorted(
            by_t.items(), key=lambda item: int(item[0]))} for name, by_t in raw.items()}
    except (TypeError, ValueError) as e:
        raise SBoNError(f"not a saved comparison: bad signal scores ({e})") from None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_types(run: RunResult) -> None:
    """Reject a file whose fields have the right names but the wrong kinds of value, so that a
    hand-edited or foreign file fails here with a message instead of deep inside a plot."""
    where = f"the {run.method!r} run"
    if not isinstance(run.prompt, str) or not isinstance(run.settings, dict):
        raise SBoNError(f"not a saved comparison: {where} has no prompt or settings")
    if not isinstance(run.timings, dict) or not all(_number(v) for v in run.timings.values()):
        raise SBoNError(f"not a saved comparison: {where} has non-numeric timings")
    if not all(v is None or isinstance(v, str) for v in (run.machine, run.decode, run.weights)):
        raise SBoNError(f"not a saved comparison: {where} has a malformed machine, weights or decode path")
    if run.threads is not None and (not isinstance(run.threads, int) or isinstance(run.threads, bool)
                                    or run.threads < 1):
        raise SBoNError(f"not a saved comparison: {where} has a malformed thread count")
    if not isinstance(run.load, dict) or not all(v is None or _number(v) for v in run.load.values()):
        raise SBoNError(f"not a saved comparison: {where} has a malformed machine load")
    for c in run.candidates:
        if not isinstance(c.id, int) or not isinstance(c.text, str) or not isinstance(c.token_ids, list) \
                or not all(isinstance(t, int) for t in c.token_ids):
            raise SBoNError(f"not a saved comparison: candidate {c.id!r} of {where} is malformed")
        if c.final_reward is not None and not _number(c.final_reward):
            raise SBoNError(f"not a saved comparison: candidate {c.id} of {where} has a non-numeric final reward")
        if not all(_number(p.reward) and isinstance(p.round, int) and isinstance(p.tokens, int)
                   for p in c.partial_rewards):
            raise SBoNError(f"not a saved comparison: candidate {c.id} of {where} has malformed partial rewards")
        if c.pruned_round is not None and not isinstance(c.pruned_round, int):
            raise SBoNError(f"not a saved comparison: candidate {c.id} of {where} has a malformed pruned round")
    for p in run.decision_points:
        if not _number(p.cut) or not all(_number(x) for x in p.scores) or len(p.scores) != len(p.contenders) \
                or not all(isinstance(k, int) and 0 <= k < len(run.candidates)
                           for k in p.contenders + p.survivors + p.pruned + p.retired + p.final + p.forced):
            raise SBoNError(f"not a saved comparison: decision point {p.round} of {where} is malformed")


def check_pair(bon: RunResult, sbon: RunResult, partials: dict[int, list[float | None]],
               what: str = "partial rewards") -> None:
    """The two runs must be comparable: same prompt, seed and candidates, every BoN candidate scored."""
    if bon.method != "bon":
        raise SBoNError(f"not a comparison: the Best-of-N run has method {bon.method!r}")
    if sbon.method not in PRUNING_METHODS:
        raise SBoNError(f"not a comparison: the Speculative Rejection run has method {sbon.method!r}")
    if bon.prompt != sbon.prompt or bon.settings.get("seed") != sbon.settings.get("seed"):
        raise SBoNError("not a comparison: the two runs differ in prompt or seed")
    n = len(bon.candidates)
    if n == 0 or len(sbon.candidates) != n:
        raise SBoNError(f"not a comparison: {n} Best-of-N candidates but {len(sbon.candidates)} SBoN candidates")
    if [c.id for c in bon.candidates] != list(range(n)) or [c.id for c in sbon.candidates] != list(range(n)):
        raise SBoNError("not a comparison: candidate ids must be 0..N-1 in order")
    if any(c.final_reward is None for c in bon.candidates):
        raise SBoNError("not a comparison: every Best-of-N candidate needs a final reward")
    if sbon.best is None or bon.best is None:
        raise SBoNError("not a comparison: both runs need a best candidate")
    if not (bon.wall_time > 0 and sbon.wall_time > 0):
        raise SBoNError("not a comparison: both runs need a positive total time")
    for tau, p in partials.items():
        if len(p) != n:
            raise SBoNError(f"not a comparison: {what} at tau={tau} have {len(p)} entries for {n} candidates")


# -- running one -------------------------------------------------------------------------------

@dataclass
class MethodEvent:
    """An event of one of the two algorithms, tagged with its method ('sbon', 'sbon-tau' or 'bon')."""
    method: str
    event: Event


@dataclass
class CounterfactualScored:
    """Best-of-N's candidates were scored at decision token ``tau`` (``done`` of ``total``)."""
    tau: int
    done: int
    total: int


@dataclass
class ComparisonReady:
    """Both runs are done: ``comparison`` has everything but the counterfactual prefix rewards (its
    ``partials`` are empty), which are scored next. A UI shows the runs now and the views that need
    the prefix rewards (the trade-off) at :class:`ComparisonDone`."""
    comparison: Comparison


@dataclass
class ComparisonDone:
    comparison: Comparison


ComparisonEvent = Union[MethodEvent, ComparisonReady, CounterfactualScored, ComparisonDone]


def peak_kv_tokens(run: RunResult) -> int:
    """The most KV-cache tokens a run held at once: at step t every candidate still generating holds
    prompt + t tokens (a candidate of length L is in the cache for steps 1..L)."""
    lengths = [c.tokens_generated for c in run.candidates]
    return max((sum(length >= t for length in lengths) * (run.prompt_tokens + t) for t in range(1, max(lengths, default=0) + 1)),
               default=0)


def same_memory_batch_size(sbon: RunResult) -> int:
    """Best-of-N batch size that fits in the KV memory the SBoN run peaked at: each BoN candidate may
    need prompt + max_new_tokens tokens. This is the paper's setting, where Best-of-N cannot hold all N
    complete candidates at once and must run in batches (or on more GPUs)."""
    full = sbon.prompt_tokens + int(sbon.settings["max_new_tokens"])
    return max(1, min(len(sbon.candidates), peak_kv_tokens(sbon) // full))


def default_taus(max_new_tokens: int, extra: tuple[int, ...] = ()) -> list[int]:
    """Decision tokens for the counterfactual trade-off: fractions of the length, plus ``extra``
    (the real run's decision points), all in [1, max_new_tokens)."""
    fractions = (1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4)
    taus = {max(1, round(max_new_tokens * f)) for f in fractions} | set(extra)
    return sorted(t for t in taus if 1 <= t < max_new_tokens)


def comparison_config(config: RunConfig | int | None = None, **settings: Any) -> RunConfig:
    """A RunConfig from a RunConfig, or from N and keyword settings (``sampling=`` a SamplingConfig
    included): the shortcut the keyword API of the algorithms also takes."""
    if isinstance(config, RunConfig):
        return config.replace(**settings) if settings else config
    return RunConfig.build(**({"n": config} if config is not None else {}), **settings)


def comparison_events(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig | int | None = None, *,
                      taus: list[int] | None = None, bon_same_memory: bool = False,
                      signals: Sequence[str] | None = None, **settings: Any) -> Iterator[ComparisonEvent]:
    """Run ``config.method`` (Speculative Rejection), then Best-of-N with the same prompt, seed and N
    (:class:`ComparisonReady`), then the counterfactual prefix rewards; yield every event, then
    :class:`ComparisonDone`.
    ``config`` is a RunConfig, or N with the settings as keywords.

    Best-of-N generates all N candidates in one batch, unless ``bon_same_memory``: then it runs in
    batches that fit the KV memory Speculative Rejection peaked at (:func:`same_memory_batch_size`),
    which is what makes it slower in the paper. Coupled sampling keeps its candidates the same.

    While Best-of-N generates, ``signals`` (default: :func:`sbon.signals.watched_by_default`; ``()``
    for none) watch it and score its candidates at the SBoN run's decision points
    (``Comparison.signal_scores``): no extra forward pass, and the candidates do not change. Their
    observing time is moved out of Best-of-N's decode time (into ``timings["watched_signals"]``), so
    the speedup is not flattered; keeping hidden states for the signals that need them stays in.

    Each run records what else the machine did while it ran (``RunResult.load``, :mod:`sbon.machine_load`), over
    the window of its timers, the consumer's time between events included.

    Speculative Rejection runs first so that a UI shows its rounds without waiting for Best-of-N.
    All settings are checked before anything is generated (:class:`SBoNError` on bad input).
    """
    config = comparison_config(config, **settings)
    if config.method not in PRUNING_METHODS:
        raise SBoNError(f"method must be one of {', '.join(PRUNING_METHODS)}, got {config.method!r}")
    config.validate(prompt)
    signals = watched_by_default(gen) if signals is None else list(signals)
    for name in signals:
        check_signal(name)

    sbon = None
    for event in events(gen, reward, prompt, config):
        if isinstance(event, Done):
            sbon = event.result
        yield MethodEvent(config.method, event)
    batch_size = same_memory_batch_size(sbon) if bon_same_memory else None
    bon_config = config.replace(method="bon", n=len(sbon.candidates), batch_size=batch_size)
    watch = watch_signals(gen, reward, prompt, bon_config, signals, [p.tokens for p in sbon.decision_points])
    bon = None
    for event in events(gen, ScoredOnce(reward, sbon), prompt, bon_config,
                        observers=watch.observers if watch else ()):
        if watch:
            watch.see(event)
        if isinstance(event, Done):
            bon = event.result
        yield MethodEvent("bon", event)
    if watch:
        discount_watching(bon, watch.observe_seconds)
    signal_scores = watch.result() if watch else {}
    yield ComparisonReady(Comparison(bon, sbon, signal_scores=signal_scores))

    if taus is None:
        taus = default_taus(config.max_new_tokens, tuple(p.tokens for p in sbon.decision_points))
    partials: dict[int, list[float | None]] = {}
    known = run_partials(sbon, bon)  # the prefixes Speculative Rejection scored itself: not scored again
    uncertainties = prefix_uncertainties(bon, reward, gen.decode, taus)  # no model: the reward's own half-widths
    scored = 0
    for chunk in counterfactual_chunks(taus, reward, gen.device):
        partials.update(prefix_rewards(bon, reward, gen.decode, chunk, known))
        for t in chunk:
            scored += 1
            yield CounterfactualScored(t, scored, len(taus))
    yield ComparisonDone(Comparison(bon, sbon, partials, signal_scores=signal_scores, uncertainties=uncertainties))


def counterfactual_chunks(taus: list[int], reward: RewardModel, device: Any) -> list[list[int]]:
    """The decision tokens whose prefixes the counterfactual asks the reward for at once: one at a time shows progress
    on a CPU, where each takes a visible while; all at once where the reward scores every prefix in one pass
    (``score_prefixes``), and on a GPU (``device``, the generator's), where a call takes milliseconds and the batches
    are fuller."""
    return [taus] if hasattr(reward, "score_prefixes") or torch.device(device).type == "cuda" else [[t] for t in taus]


class ScoredOnce:
    """The reward Best-of-N scores with in a comparison: one response, one final reward.

    It scores every response with ``reward``, so Best-of-N pays for all of its own scoring, then gives a response
    that Speculative Rejection's run already scored that run's final reward. A reward is a function of the text,
    but one computed in bfloat16 or int4 (the generator's own likelihood) rounds differently in a batch of another
    size; without this, a survivor could score otherwise than its Best-of-N twin, and Speculative Rejection's
    answer beat Best-of-N's by rounding alone. Everything but ``score`` is the reward's own."""

    def __init__(self, reward: RewardModel, sbon: RunResult):
        self.reward = reward
        self.scored: dict[str, float] = {}
        for c in sbon.candidates:  # of two equal texts, the first one's score
            if c.final_reward is not None:
                self.scored.setdefault(c.text, c.final_reward)

    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        fresh = self.reward.score(prompt, responses)
        return [self.scored.get(text, r) for text, r in zip(responses, fresh)]

    def __getattr__(self, name: str) -> Any:
        if "reward" not in self.__dict__:  # being copied or unpickled: nothing to forward to yet
            raise AttributeError(name)
        return getattr(self.reward, name)


def watch_signals(gen: Generator, reward: RewardModel, prompt: str, bon_config: RunConfig, signals: Sequence[str],
                  taus: Sequence[int]) -> SignalWatch | None:
    """The signals that watch Best-of-N, scoring at the SBoN run's decision-point token counts."""
    signals = [name for name in signals if name != "reward"]  # the reward's partial scores are `partials`
    if not signals or not taus:
        return None
    one_batch = (bon_config.batch_size or bon_config.n) >= bon_config.n
    return SignalWatch(gen, reward, prompt, signals, taus, bon_config.n, bon_config.max_new_tokens, one_batch)


def discount_watching(bon: RunResult, seconds: float) -> None:
    """Move the signals' observing time out of Best-of-N's decode (and total) time: it is analysis,
    not Best-of-N's cost, and left in it would flatter Speculative Rejection's speedup."""
    seconds = min(seconds, bon.timings.get("decode", 0.0))
    bon.timings["decode"] -= seconds
    bon.timings["total"] -= seconds
    bon.timings["watched_signals"] = seconds


def run_comparison(gen: Generator, reward: RewardModel, prompt: str, config: RunConfig | int | None = None,
                   **settings: Any) -> Comparison:
    """:func:`comparison_events` driven to the end."""
    return drive(comparison_events(gen, reward, prompt, config, **settings), ComparisonDone).comparison
