"""Models loaded on first use and kept per (name, device), so the app starts at once and a replay
never loads a model."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable

import torch

from sbon.engine import Generator
from sbon.models import default_device, load_generator, load_reward
from sbon.rewards import RewardModel


def configure_threads() -> int:
    """Set torch's CPU threads and return how many are in use: SBON_THREADS if set, else one thread
    on a machine with at most two cores and no GPU, else torch's default (one per core).

    Why one on two cores: when other work keeps the cores busy, torch's threads wait on each other
    at every operation. On 2 shared cores a decoding step of 16 candidates took 1.2 s with two
    threads and 0.17 s with one; on idle cores two threads would win by well under 2x."""
    threads = os.environ.get("SBON_THREADS")
    if threads:
        torch.set_num_threads(max(1, int(threads)))
    elif not torch.cuda.is_available() and (os.cpu_count() or 1) <= 2:
        torch.set_num_threads(1)
    return torch.get_num_threads()


class ModelCache:
    """At most ``size`` generators and ``size`` rewards stay loaded (least recently used go first):
    on a GPU Space two 8B models would not fit beside a third."""

    def __init__(self, size: int = 2, load_gen: Callable[..., Generator] = load_generator,
                 load_rew: Callable[..., RewardModel] = load_reward):
        self.size = size
        self._load_gen, self._load_rew = load_gen, load_rew
        self._generators: OrderedDict[tuple, Generator] = OrderedDict()
        self._rewards: OrderedDict[tuple, RewardModel] = OrderedDict()
        self._lock = threading.Lock()  # two sessions asking for the same model load it once

    def device(self) -> torch.device:
        return default_device()

    def is_loaded(self, generator: str, reward: str) -> bool:
        dev = str(self.device())
        return (generator, dev) in self._generators and self._reward_key(reward, generator, dev) in self._rewards

    @staticmethod
    def _reward_key(reward: str, generator: str, device: str) -> tuple:
        # The likelihood reward scores with the generator itself, so it is one per generator.
        return (reward, generator if reward == "likelihood" else None, device)

    def get(self, generator: str, reward: str) -> tuple[Generator, RewardModel]:
        """The generator and reward, loaded if needed (raises SBoNError with a one-line reason)."""
        dev = self.device()
        with self._lock:
            gkey = (generator, str(dev))
            if gkey not in self._generators:
                gen = self._load_gen(generator, device=dev)
                _warm_up(gen)
                self._generators[gkey] = gen
            self._generators.move_to_end(gkey)
            gen = self._generators[gkey]
            rkey = self._reward_key(reward, generator, str(dev))
            if rkey not in self._rewards:
                self._rewards[rkey] = self._load_rew(reward, generator=gen, device=dev)
            self._rewards.move_to_end(rkey)
            for cache in (self._generators, self._rewards):
                while len(cache) > self.size:
                    cache.popitem(last=False)
            return gen, self._rewards[rkey]


def _warm_up(gen: Generator) -> None:
    """One tiny prefill and decode step, so the first timed run does not pay for lazy initialisation
    (kernel selection, allocator growth) and the speedup compares like with like."""
    prefix = gen.prefill(gen.encode_prompt("Hi"))
    batch = gen.start(prefix, [0, 1])
    gen.forward(batch, prefix.logits.argmax(-1).expand(2))
    gen.synchronize()
