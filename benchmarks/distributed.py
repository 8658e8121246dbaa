"""Benchmark sweeps on a Ray cluster: `python -m benchmarks <experiment> --ray [ADDRESS]`.

One actor per worker (a GPU, or `--threads` CPU cores) loads the generator and the reward once and
warms them up; each prompt goes to whichever worker is free next, and results come back in prompt
order, so an experiment writes the same result file as a single-process run (timings aside: each
worker times its own prompts). A prompt whose worker dies is retried once on a fresh worker; if it
fails again it is listed under `environment.distributed.failed_prompts` of the result file and
printed, never silently dropped.

What scales is the number of prompts (and of settings, where an experiment runs them per prompt);
one prompt's candidates stay on one worker, since Speculative Rejection prunes them together.

Ray is imported in this module's functions only: without --ray nothing imports it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import deque
from typing import Any, Callable, Iterator, Sequence

from sbon.engine import SamplingConfig
from sbon.errors import SBoNError

from . import common

RETRIES = 1  # a prompt whose worker died runs once more on a fresh worker, then is reported as failed
LOCAL = "local"  # --ray without an address: start Ray on this machine


def add_ray_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scaling out (pip install -r requirements-ray.txt)")
    g.add_argument("--ray", nargs="?", const=LOCAL, default=None, metavar="ADDRESS",
                   help="run the prompts on Ray workers, one model copy per worker; ADDRESS of a running cluster "
                        "('auto', 'ray://host:10001'), or none to start Ray here")
    g.add_argument("--ray-workers", type=int, default=None, metavar="K",
                   help="workers (default: the cluster's GPUs, or its CPUs / --threads without a GPU)")
    # test hook: the first D workers started exit on their first prompt, as a lost machine would
    g.add_argument("--ray-test-deaths", type=int, default=0, help=argparse.SUPPRESS)


def import_ray():
    try:
        import ray
    except ImportError:
        raise SBoNError("--ray needs Ray: pip install -r requirements-ray.txt (or pip install 'ray>=2.9')") from None
    return ray


# -- a worker ---------------------------------------------------------------------------------

class ModelWorker:
    """One Ray actor: the experiment's models, loaded once, and its per-prompt function run on them."""

    def __init__(self, index: int, models: dict[str, Any], die_on_first_prompt: bool = False):
        import torch

        torch.set_num_threads(models["threads"])
        self.index, self.die = index, die_on_first_prompt
        self.gen, self.reward = common.load_models(models["generator"], models["reward"], models["device"],
                                                   models["dtype"])
        common.warm_up(self.gen, self.reward, SamplingConfig(*models["sampling"]))

    def environment(self) -> dict[str, Any]:
        return {"worker": self.index, "host": platform.node(), "pid": os.getpid(), **common.environment(self.gen)}

    def run(self, work: Callable, prompt: dict) -> Any:
        if self.die:
            os._exit(1)  # test hook (--ray-test-deaths): the process vanishes mid-run, as a lost machine
        return work(self.gen, self.reward, prompt)


# -- the pool ---------------------------------------------------------------------------------

def worker_resources(ray, args: argparse.Namespace) -> tuple[int, dict[str, float]]:
    """How many workers, and what each asks of Ray: a GPU each where the cluster has GPUs, else
    --threads CPU cores (default 1)."""
    cluster = ray.cluster_resources()
    gpus, cpus = int(cluster.get("GPU", 0)), int(cluster.get("CPU", 1))
    if gpus and args.device != "cpu":
        return args.ray_workers or gpus, {"num_gpus": 1, "num_cpus": 1}
    threads = args.threads or 1
    return args.ray_workers or max(1, cpus // threads), {"num_cpus": threads}


def init_ray(ray, args: argparse.Namespace) -> bool:
    """Connect to (or start) Ray; True when this process started it. Workers import this checkout's
    `sbon` and `benchmarks`: on this machine through PYTHONPATH, on a remote cluster uploaded."""
    if ray.is_initialized():
        return False
    repo = str(common.REPO)
    if args.ray == LOCAL:
        threads, gpus = args.threads or 1, _local_gpus()
        k = args.ray_workers or gpus or max(1, (os.cpu_count() or 1) // threads)
        ray.init(num_cpus=max(os.cpu_count() or 1, k * threads), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": repo}})
    else:
        ray.init(address=args.ray, log_to_driver=False,
                 runtime_env={"py_modules": [str(common.REPO / "sbon"), str(common.REPO / "benchmarks")],
                              "excludes": ["results/", "__pycache__/"]})
    return True


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


class Pool:
    """K model workers on Ray, and what the result file says about them: the runner of a --ray run
    (the interface of benchmarks.common.LocalRunner)."""
    remote = True

    def __init__(self, args: argparse.Namespace):
        ray = self.ray = import_ray()
        self.owns_ray = init_ray(ray, args)
        k, self.resources = worker_resources(ray, args)
        self.models = {"generator": args.generator, "reward": args.reward, "device": args.device, "dtype": args.dtype,
                       "threads": args.threads or 1, "sampling": (args.temperature, args.top_p, args.top_k)}
        self.deaths_left = args.ray_test_deaths
        self.started = 0
        self.record: dict[str, Any] = {"ray": ray.__version__, "address": args.ray, "workers": k,
                                       "worker_resources": self.resources, "retries_per_prompt": RETRIES,
                                       "worker_environments": [], "retried": [], "failed_prompts": []}
        print(f"starting {k} Ray worker(s) ({self.resources}) ...", file=sys.stderr)
        start = time.perf_counter()
        self.workers = self.start_workers(k)
        self.record["startup_s"] = time.perf_counter() - start  # all workers up, models loaded and warmed up
        self.record["sweeps"] = []  # per map over the prompts: how many and its wall seconds on the workers

    def start_workers(self, count: int) -> list:
        """Fresh actors, loading their models side by side; their environments go into the record."""
        actors = []
        for _ in range(count):
            actors.append(self.ray.remote(**self.resources)(ModelWorker).remote(self.started, self.models,
                                                                                self.deaths_left > 0))
            self.started += 1
            self.deaths_left -= 1
        try:
            self.record["worker_environments"] += self.ray.get([a.environment.remote() for a in actors])
        except self.ray.exceptions.RayActorError as e:
            raise SBoNError(f"a Ray worker could not load the models: {one_line(e)}") from None
        return actors

    def map(self, work: Callable, prompts: Sequence[dict], gen=None, reward=None, bar=None,
            steps: int = 1) -> Iterator[tuple[dict, Any]]:
        """(prompt, work(gen, reward, prompt)) in prompt order, each run on the next free worker with its
        own models (this process's ``gen`` and ``reward`` are not used); `bar` moves `steps` per prompt
        done, in whatever order they finish."""
        ray = self.ray
        started = time.perf_counter()
        work_ref = ray.put(work)  # the function and its settings, shipped once
        queue = deque((i, 0) for i in range(len(prompts)))  # (prompt index, attempt)
        idle, running, done, failed, next_out, finished = list(range(len(self.workers))), {}, {}, set(), 0, 0
        while queue or running:
            while idle and queue:
                slot, (i, attempt) = idle.pop(0), queue.popleft()
                running[self.workers[slot].run.remote(work_ref, prompts[i])] = (slot, i, attempt)
            [ref], _ = ray.wait(list(running), num_returns=1)
            slot, i, attempt = running.pop(ref)
            try:
                done[i] = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # the experiment itself raised: as it would in one process
                raise e.cause if isinstance(e.cause, (SBoNError, SystemExit)) else e
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.ObjectLostError) as e:  # the worker died: a fresh one, the prompt once more
                self.lost(prompts[i], slot, attempt, e, queue, failed, i)
                self.workers[slot] = self.start_workers(1)[0]
            idle.append(slot)
            if i in done or i in failed:
                finished += 1
                if bar is not None:
                    bar.update(steps)
                    bar.set_postfix_str(f"{finished}/{len(prompts)} prompts on {len(self.workers)} Ray workers")
            while next_out in done or next_out in failed:
                if next_out == len(prompts) - 1:  # the last result is in: the sweep's time, before the caller's work
                    self.record["sweeps"].append({"prompts": len(prompts), "wall_s": time.perf_counter() - started})
                if next_out in done:
                    yield prompts[next_out], done.pop(next_out)
                next_out += 1

    def lost(self, prompt: dict, slot: int, attempt: int, error: Exception, queue: deque, failed: set, i: int) -> None:
        entry = {"prompt_id": prompt["id"], "worker_slot": slot, "attempt": attempt + 1, "error": one_line(error)}
        if attempt < RETRIES:
            self.record["retried"].append(entry)
            queue.appendleft((i, attempt + 1))
            print(f"warning: Ray worker lost on prompt {prompt['id']}; retrying it on a fresh worker", file=sys.stderr)
        else:
            self.record["failed_prompts"].append(entry)
            failed.add(i)
            print(f"warning: prompt {prompt['id']} failed {attempt + 1} times (worker lost): left out, listed in "
                  f"the result file under environment.distributed.failed_prompts", file=sys.stderr)

    def close(self) -> None:
        for actor in self.workers:
            self.ray.kill(actor)
        if self.owns_ray:
            self.ray.shutdown()


def one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"
