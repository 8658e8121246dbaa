"""Models loaded once and kept per (name, device), on the torch thread (components/torch_thread.py), with a status
line; each run's decode path comes from components/decode_paths.py.

The app starts loading its default models as soon as it serves (a first load on a fresh machine
converts the packaged GGUF generator to a float32 copy: about 20 s), so a first Run mostly finds
them ready; a replay never loads a model. ``sources`` says where each model will come from (the
packages, the local copy, or the hub) before anything is loaded.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from contextlib import nullcontext
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from sbon.analysis.comparison import comparison_events
from sbon.engine import Generator
from sbon.errors import SBoNError
from sbon.cache import cache_dir
from sbon.models import (GENERATOR_REWARDS, GENERATORS, REWARDS, default_device, default_weights, dequantized_copy_dir,
                         generator_title, hub_source, load_generator, load_reward, reward_title)
from sbon.probe import watched
from sbon.results import RunResult
from sbon.rewards import RewardModel
from sbon.zerogpu import on_zerogpu

from .decode_paths import DecodePaths, app_decode, sentence, subject
from .torch_thread import TORCH_THREAD

log = logging.getLogger(__name__)



# -- where the models come from ---------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """Where one model will load from, decided without loading it."""
    role: str  # "generator", "reward encoder", "reward model"
    name: str  # the preset, folder or hub id asked for
    origin: str  # a package, a local folder or copy, or a hub id
    hub: bool = False  # True: it will be fetched from the Hugging Face hub
    first_time: bool = False  # True: a one-time conversion runs before it loads

    def describe(self) -> str:
        if self.hub:
            return f"the {self.role} {self.name} from the hub ({self.origin})"
        return f"the {self.role} {self.name} from {self.origin}"


def generator_source(name: str) -> Source:
    hub, preset = hub_source(name, GENERATORS), GENERATORS.get(name)
    if hub is not None or preset is None:  # the hub, or a local folder
        return Source("generator", name, hub or name, hub=hub is not None)
    copy = dequantized_copy_dir(name, preset.gguf_file)  # its package is installed
    if (copy / "config.json").exists():
        return Source("generator", name, f"its float32 copy in {copy}")
    return Source("generator", name, f"the package {preset.package.replace('_', '-')}, converted once to a "
                                     f"float32 copy in {cache_dir()}", first_time=True)


def reward_sources(name: str, generator: str) -> list[Source]:
    hub, preset = hub_source(name, REWARDS), REWARDS.get(name)
    if hub is not None or preset is None:  # the hub, or a local folder
        return [Source("reward model", name, hub or name, hub=hub is not None)]
    if preset.offline:
        return []  # code, or the generator itself
    return [Source("reward model", name, f"the package {preset.package.replace('_', '-')}")]


def sources(generator: str, reward: str) -> list[Source]:
    """Where the generator and the reward will load from (a Space without the embedded packages
    fetches SmolLM2 and all-MiniLM-L6-v2 from the hub)."""
    return [generator_source(generator), *reward_sources(reward, generator)]


def hub_fetches(generator: str, reward: str) -> list[str]:
    """The hub ids a first load of these models will download (empty: everything is local)."""
    return [s.origin for s in sources(generator, reward) if s.hub]


# -- the cache --------------------------------------------------------------------------------------

class ModelCache:
    """At most ``size`` generators and ``size`` rewards stay loaded (least recently used go first):
    on a GPU Space two 8B models would not fit beside a third. Loads run one at a time on TORCH_THREAD
    (``load_async``), the thread runs use, so the page can say what is loading while it waits."""

    def __init__(self, size: int = 2, load_gen: Callable[..., Generator] = load_generator,
                 load_rew: Callable[..., RewardModel] = load_reward, decode_paths: "DecodePaths | None" = None):
        """``decode_paths``: the app's decode paths, measured and built in the background (None: runs decode as
        SBON_DECODE says, in their own process)."""
        self.size = size
        self._load_gen, self._load_rew = load_gen, load_rew
        self._generators: OrderedDict[tuple, Generator] = OrderedDict()
        self._rewards: OrderedDict[tuple, RewardModel] = OrderedDict()
        self._lock = threading.Lock()  # two sessions asking for the same model load it once
        self._jobs: dict[tuple[str, str], Future] = {}
        self._jobs_lock = threading.Lock()  # not self._lock, which a load holds for seconds
        self._loading = ""  # what the running load is doing, for the status line
        self._loading_started = 0.0
        self._failures: dict[tuple[str, str], str] = {}  # (generator, reward) -> why its last load failed
        self.decode_paths = decode_paths

    def loaded(self) -> tuple[list[str], list[str]]:
        """What is in memory now, on this device: generator names, and reward names (a reward that
        scores with the generator says which one, e.g. "likelihood (smollm2-135m)"). The status line
        reads this, not what was asked for, so it stays true after evictions and failed loads."""
        dev = str(self.device())
        gens = [g for g, d in list(self._generators) if d == dev]
        rews = [r if g is None else f"{r} ({g})" for r, g, d in list(self._rewards) if d == dev]
        return gens, rews

    def loaded_reward(self, reward: str, generator: str) -> RewardModel | None:
        """The reward if it is in memory now (never loads): the candidate detail asks it to explain
        itself when it can."""
        return self._rewards.get(self._reward_key(reward, generator, str(self.device())))

    def failures(self) -> dict[tuple[str, str], str]:
        """(generator, reward) -> the one-line reason its last load failed; gone once it loads."""
        return dict(self._failures)

    def device(self) -> torch.device:
        return default_device()

    def is_loaded(self, generator: str, reward: str) -> bool:
        """Both in memory, the generator in the format this machine's measured choice names (a choice that came
        since loads it again)."""
        dev = str(self.device())
        return ((generator, dev) in self._generators and self._reward_key(reward, generator, dev) in self._rewards
                and self.is_current(generator))

    @staticmethod
    def _reward_key(reward: str, generator: str, device: str) -> tuple:
        # The likelihood rewards score with the generator itself, so there is one per generator.
        return (reward, generator if reward in GENERATOR_REWARDS else None, device)

    def get(self, generator: str, reward: str) -> tuple[Generator, RewardModel]:
        """The generator and reward, loaded if needed (raises SBoNError with a one-line reason)."""
        dev = self.device()
        with self._lock:
            gkey = (generator, str(dev))
            wanted = self.decode_paths.path(generator) if self.decode_paths else None
            if gkey in self._generators and wanted and self._generators[gkey].weights != wanted.weights:
                self._drop(generator, str(dev))  # this machine's measured choice came since: load it in that format
            if gkey not in self._generators:
                source = generator_source(generator)
                # the page's words; where from is the log's (components.runs.start_loading_models)
                self._set_loading(f"1/3 loading the generator, {generator_title(generator)}"
                               + (" (first time only: about 20 s on 2 CPU cores)" if source.first_time else ""))
                if source.first_time and self._load_gen is load_generator and (child := convert_in_background(generator)):
                    child.wait()
                if wanted and wanted.threads:  # the thread count the choice was measured at, on TORCH_THREAD
                    torch.set_num_threads(wanted.threads)
                gen = self._load_gen(generator, device=dev, **({"weights": wanted.weights} if wanted else {}))
                self._set_loading("2/3 warming up the generator")
                if not on_zerogpu():  # ZeroGPU's main process has no real GPU: its workers warm up in the run
                    _warm_up(gen)
                    if self.decode_paths:  # loads its compiled step if chosen and saved, or starts measuring
                        self.decode_paths.decode(generator, gen)
                self._generators[gkey] = gen
            self._generators.move_to_end(gkey)
            gen = self._generators[gkey]
            rkey = self._reward_key(reward, generator, str(dev))
            if rkey not in self._rewards:
                self._set_loading(f"3/3 loading the reward, {reward_title(reward)}"
                               + (", from the hub" if any(s.hub for s in reward_sources(reward, generator)) else ""))
                self._rewards[rkey] = self._load_rew(reward, generator=gen, device=dev)
            self._rewards.move_to_end(rkey)
            self._set_loading("")
            for cache in (self._generators, self._rewards):
                while len(cache) > self.size:
                    cache.popitem(last=False)
            return gen, self._rewards[rkey]

    def _drop(self, generator: str, device: str) -> None:
        """Forget a generator and the rewards that score with it (the next get loads them again)."""
        self._generators.pop((generator, device), None)
        for key in [k for k in self._rewards if k[1] == generator and k[2] == device]:
            del self._rewards[key]

    def is_current(self, generator: str) -> bool:
        """The loaded generator is in the weight format auto's path names now (a choice measured since it loaded
        names another)."""
        gen = self._generators.get((generator, str(self.device())))
        return gen is None or not self.decode_paths or gen.weights == self.decode_paths.path(generator).weights

    def comparison(self, settings) -> Iterator:
        """The comparison's events for these run settings (components.controls.RunSettings): the app's one run path,
        its models from here, decoded as ``decode`` says."""
        gen, reward = self.get(settings.generator, settings.reward)
        decode = self.decode(settings.generator, gen)
        config = settings.config().replace(decode=decode)
        watch = self.decode_paths.watch(settings.generator, gen, decode) if self.decode_paths else None
        # The instructions travel in the settings (to a ZeroGPU worker too) and bind this run's own copy.
        yield from watched(comparison_events(gen, settings.reward_for_run(reward), settings.prompt, config,
                                             bon_same_memory=settings.bon_same_memory), watch)

    def decode(self, generator: str, gen: Generator) -> str:
        """The decode path (sbon.decoders) of a run of this generator that starts now, and on a CPU its threads: see
        DecodePaths.for_run."""
        return self.decode_paths.for_run(generator, gen) if self.decode_paths else app_decode()

    def planned(self, generator: str) -> tuple[str, str | None, bool]:
        """What a run of this generator starting now would take, known without loading, measuring or building
        anything: its weight format (the one ``get`` loads), its decode path (None: the generator is not loaded yet),
        and whether later runs will take the same (DecodePaths.settled)."""
        gen, paths = self._generators.get((generator, str(self.device()))), self.decode_paths
        if not paths:
            return default_weights(self.device(), generator), None if gen is None else app_decode(), True
        path = paths.path(generator)  # the choice file, read once for all three
        return path.weights, None if gen is None else paths.planned(generator, gen, path), paths.settled(generator, path)

    def generating(self):
        """Around a run's generation (the decode paths' child times nothing meanwhile)."""
        return self.decode_paths.generating() if self.decode_paths else nullcontext()

    def share(self) -> Iterator[float]:
        """Before a run's generation: the seconds it waits for the decode paths' child, which runs sent back to back
        left no gap to measure in (DecodePaths.share)."""
        return self.decode_paths.share() if self.decode_paths else iter(())

    def observe(self, result: RunResult) -> None:
        """A finished run of this app: the decode paths check it against what was measured."""
        if self.decode_paths:
            self.decode_paths.observe(result.generator, result)

    def decode_status(self, generator: str, alone: bool = False) -> str:
        """One line for the page about this generator's decode path ('' where there is nothing to say); ``alone`` as
        in DecodePaths.status."""
        if not self.decode_paths:
            return ""
        if not self.is_current(generator):  # measured since it loaded: a run never changes its path midway
            _, lead = subject(generator, alone)
            return (sentence(f"{lead}a faster way of decoding was measured here, "
                             f"{self.decode_paths.choice(generator).words}; the next run loads it (seconds)."))
        return self.decode_paths.status(generator, alone)

    def load_async(self, generator: str, reward: str) -> Future:
        """Start loading in the background thread (or join the load already under way) and return
        its future: ``result()`` gives (generator, reward) or raises the load's SBoNError. A failed
        load, or one whose models were evicted since, is done again by the next call."""
        key = (generator, reward)
        with self._jobs_lock:
            job = self._jobs.get(key)
            # A finished load is reused only while its models are still loaded: one that failed, or
            # whose models were evicted since, loads again (and the status line sees them again).
            if job is None or (job.done() and (job.exception() is not None or not self.is_loaded(generator, reward))):
                job = self._jobs[key] = TORCH_THREAD.submit(self._get_logged, generator, reward)  # the run's thread
            return job

    def _get_logged(self, generator: str, reward: str) -> tuple[Generator, RewardModel]:
        try:
            models = self.get(generator, reward)
        except Exception as e:  # the status line shows it; a load that is not an SBoNError is still one line
            self._set_loading("")
            error = e if isinstance(e, SBoNError) else SBoNError(
                f"could not load the models: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
            self._failures[(generator, reward)] = str(error)
            if error is e:
                raise
            raise error from e
        self._failures.pop((generator, reward), None)
        return models

    def loading(self) -> str:
        """What the background load is doing, with the seconds it has taken so far; '' when idle."""
        if not self._loading:
            return ""
        number, what = self._loading.split(" ", 1)
        return f"Step {number}: {what}… {time.perf_counter() - self._loading_started:.0f} s"

    def _set_loading(self, step: str) -> None:
        self._loading, self._loading_started = step, time.perf_counter()


def convert_in_background(generator: str) -> subprocess.Popen | None:
    """Start making the one-time float32 copy of a packaged generator in a child process (or return
    the child already doing it); None when there is nothing to convert. ``python app.py`` calls this
    before its slow imports, so the conversion overlaps them; the load then waits for the child.

    A child process, not a thread: the conversion is mostly Python (parsing the GGUF header's 49k-token
    vocabulary) and would hold this process's GIL throughout, stalling the pages the app serves. If the
    child fails, the load in this process tries again and reports the reason."""
    if generator in _CONVERSIONS:
        return _CONVERSIONS[generator]
    if not generator_source(generator).first_time:
        return None
    code = f"from sbon.models import load_generator; load_generator({generator!r}, device='cpu')"
    try:
        _CONVERSIONS[generator] = subprocess.Popen(
            [sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    return _CONVERSIONS[generator]


_CONVERSIONS: dict[str, subprocess.Popen] = {}


def _warm_up(gen: Generator) -> None:
    """One tiny prefill and decode step, so the first timed run does not pay for lazy initialisation
    (kernel selection, allocator growth) and the speedup compares like with like."""
    prefix = gen.prefill(gen.encode_prompt("Hi"))
    batch = gen.start(prefix, [0, 1])
    gen.forward(batch, prefix.logits.argmax(-1).expand(2))
    gen.synchronize()


# The page's one cache, shared by all its sessions (models are read-only; results live in each session's state),
# by its handlers and by a ZeroGPU worker, which inherits it.
MODELS = ModelCache(decode_paths=DecodePaths())
