"""`python -m benchmarks ... --ray`: the same results as one process, a lost worker's prompt retried
or reported, and no Ray at all without the flag. A local Ray of 2 one-CPU workers on the embedded
model (N=4, 16 new tokens, 4 prompts, one torch thread everywhere, since the thread count can move
float32 sums)."""

import json
import subprocess
import sys
from functools import partial

import pytest
import torch

from benchmarks import common, distributed, efficiency, table1
from benchmarks.__main__ import build_parser, main
from sbon.engine import SamplingConfig

N, TOKENS, K = 4, 16, 4
SMALL = ["--k", str(K), "--n", str(N), "--max-new-tokens", str(TOKENS), "--reward", "likelihood", "--threads", "1",
         "--no-best-of-m", "--no-plot", "--quiet"]
TIMING = {"bon_time", "sbon_time", "speedup", "bon_tok_per_s", "sbon_tok_per_s", "bon_timings", "sbon_timings",
          "sbon_reward_share", "bom_score"}  # Best-of-M's M comes from the measured speedups


def test_benchmarks_never_import_ray_without_the_flag():
    code = ("import sys\n"
            "from benchmarks.__main__ import build_parser\n"
            "from benchmarks import common, distributed, efficiency, table1\n"
            "args = build_parser().parse_args(['table1'])\n"
            "assert args.ray is None and not hasattr(args, 'runner')\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=common.REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_ray_flag_without_ray_installed_fails_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    code = main(["table1", *SMALL, "--out-dir", str(tmp_path), "--ray"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == ["error: --ray needs Ray: pip install -r requirements-ray.txt (or pip install 'ray>=2.9')"]
    assert not list(tmp_path.iterdir())  # failed before any work


# -- with Ray ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(common.REPO), "OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def prompts():
    return common.load_prompts(K)


@pytest.fixture(scope="module")
def work():
    sb = dict(method="sbon", alpha=0.5, first_decision=None, kv_budget=None, tau=32, max_new_tokens=TOKENS,
              sampling=SamplingConfig(), seed=0)
    return partial(table1.prompt_runs, n=N, bon_memory="all", sb=sb)


@pytest.fixture(scope="module")
def single_process(gen, likelihood, prompts, work, one_thread):
    """Table 1's per-prompt runs in this process: (row, Best-of-N run) per prompt."""
    return [out for _, out in common.map_prompts(work, prompts, gen, likelihood)]


# efficiency's per-prompt row; at 40 new tokens only prompt 1 (38 tokens) fits N=4 in the budget of B=2,
# the others come back None (skipped), so both paths are checked
EFFICIENCY = partial(efficiency.prompt_row, b=2, n=4, alphas=(0.5,), max_new_tokens=40, sampling=SamplingConfig(),
                     seed=0, saved=None)


def without_seconds(obj):
    """An efficiency row without what was timed (keys ending in _s, and the reward's share of the time)."""
    if isinstance(obj, dict):
        return {k: without_seconds(v) for k, v in obj.items()
                if not (isinstance(k, str) and (k.endswith("_s") or k == "reward_share"))}
    return obj


def ray_args(*extra: str):
    args = build_parser().parse_args(["table1", *SMALL, "--ray", *extra])
    common.apply_protocol(args)
    return args


def without_timings(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING}


def test_ray_workers_give_the_single_process_results_in_order(ray_cluster, gen, likelihood, prompts, work,
                                                              single_process):
    efficiency_here = [row for _, row in common.map_prompts(EFFICIENCY, prompts, gen, likelihood)]
    pool = distributed.Pool(ray_args("--ray-workers", "2"))
    try:
        assert not pool.owns_ray and len(pool.workers) == 2
        out = list(common.map_prompts(work, prompts, gen, likelihood, runner=pool))
        efficiency_there = [row for _, row in common.map_prompts(EFFICIENCY, prompts, gen, likelihood, runner=pool)]
        record = common.environment(runner=pool)["distributed"]
    finally:
        pool.close()
    assert [p["id"] for p, _ in out] == [p["id"] for p in prompts]
    for (_, (row, bon)), (row_here, bon_here) in zip(out, single_process):
        assert without_timings(row) == without_timings(row_here)
        assert [c.text for c in bon.candidates] == [c.text for c in bon_here.candidates]
        assert [c.final_reward for c in bon.candidates] == [c.final_reward for c in bon_here.candidates]
        assert [len(c.token_ids) for c in bon.candidates] == [len(c.token_ids) for c in bon_here.candidates]
    assert [r is None for r in efficiency_here] == [True, False, True, True]
    assert [without_seconds(r) for r in efficiency_there] == [without_seconds(r) for r in efficiency_here]
    assert [s["prompts"] for s in record["sweeps"]] == [K, K]
    envs = record["worker_environments"]
    assert [e["worker"] for e in envs] == [0, 1] and len({e["pid"] for e in envs}) == 2
    assert all(e["torch_threads"] == 1 for e in envs)
    assert record["retried"] == record["failed_prompts"] == []
    assert "distributed" not in common.environment()  # the local runner has no workers to record


def test_a_killed_worker_s_prompt_is_retried_and_the_file_is_complete(ray_cluster, single_process, tmp_path):
    assert main(["table1", *SMALL, "--out-dir", str(tmp_path), "--ray", "--ray-workers", "2",
                 "--ray-test-deaths", "1"]) == 0
    saved = json.loads((tmp_path / "table1.json").read_text())
    assert [without_timings(r) for r in saved["rows"]] == [without_timings(json.loads(json.dumps(common.jsonable(r))))
                                                           for r, _ in single_process]
    record = saved["environment"]["distributed"]
    assert [r["prompt_id"] for r in record["retried"]] == [0] and "died" in record["retried"][0]["error"]
    assert record["failed_prompts"] == []
    assert len(record["worker_environments"]) == 3  # the two workers and the lost one's replacement
    assert ray_cluster.is_initialized()  # the pool closed its workers, the test's Ray stays


def test_a_prompt_lost_twice_is_reported_not_dropped(ray_cluster, tmp_path, capsys):
    # one worker; the first three started die on their first prompt: prompt 0 is lost twice, prompt 1 once
    assert main(["table1", *SMALL, "--k", "2", "--out-dir", str(tmp_path), "--ray", "--ray-workers", "1",
                 "--ray-test-deaths", "3"]) == 0
    saved = json.loads((tmp_path / "table1.json").read_text())
    record = saved["environment"]["distributed"]
    assert [r["prompt_id"] for r in saved["rows"]] == [1]
    assert [(r["prompt_id"], r["attempt"]) for r in record["failed_prompts"]] == [(0, 2)]
    assert [r["prompt_id"] for r in record["retried"]] == [0, 1]
    assert "prompt 0 failed 2 times" in capsys.readouterr().err


# -- the vLLM baseline: not runnable here (no GPU, no vLLM), so it must fail in one line, first --

@pytest.mark.parametrize("experiment", ["table1", "efficiency"])
def test_vllm_baseline_without_vllm_or_gpu_fails_in_one_line_before_any_work(experiment, capsys, tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM and a GPU are here: the baseline can run")
    argv = [experiment, "--k", "1", "--n", "8", "--max-new-tokens", "8", "--no-plot", "--quiet",
            "--out-dir", str(tmp_path), "--baseline", "vllm"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --baseline vllm needs ")
    assert not list(tmp_path.iterdir())  # nothing loaded, nothing written


def test_vllm_baseline_and_ray_are_refused_together(capsys, tmp_path):
    assert main(["table1", *SMALL, "--out-dir", str(tmp_path), "--ray", "--baseline", "vllm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --baseline vllm runs in this process on its GPU: run it without --ray"


def test_vllm_baseline_asks_vllm_for_the_experiments_prompt_tokens_and_sampling(gen, likelihood, monkeypatch):
    """vLLM itself cannot run here, so a stand-in module records what the baseline asks of it: the weights and
    dtype the generator was loaded from, one request per prompt with this engine's chat-templated token ids,
    the experiment's sampling settings (top-k off is vLLM's -1), and the experiment's reward choosing the best."""
    import types

    from benchmarks import vllm_bon

    asked = {"requests": []}

    class LLM:
        def __init__(self, **kwargs):
            asked["llm"] = kwargs

        def generate(self, prompts, params, use_tqdm=True):
            asked["requests"].append((prompts, params))
            texts = ["Paris.", "The capital of France is Paris.", "I do not know."][:params.n]
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(text=t, token_ids=[7] * len(t))
                                                   for t in texts])]

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams, fake.__version__ = LLM, types.SimpleNamespace, "stand-in"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    prompts = [{"id": 3, "instruction": "What is the capital of France?"}]
    out = vllm_bon.run_vllm_bon(gen, likelihood, prompts, n=3, max_new_tokens=16, quiet=True,
                                sampling=SamplingConfig(temperature=0.7, top_p=0.9, top_k=0), seed=5, gpu_memory=0.4)

    assert asked["llm"] == {"model": gen.model.name_or_path, "tokenizer": gen.model.name_or_path,
                            "dtype": str(gen.model.dtype).removeprefix("torch."), "seed": 5,
                            "gpu_memory_utilization": 0.4}
    (request, params), = asked["requests"][1:]  # the first is the warm-up
    assert request == [{"prompt_token_ids": gen.encode_prompt(prompts[0]["instruction"])}]
    assert vars(params) == {"n": 3, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 16, "seed": 5}
    row, = out["rows"]
    texts = ["Paris.", "The capital of France is Paris.", "I do not know."]
    assert row["vllm_best"] == pytest.approx(max(likelihood.score(prompts[0]["instruction"], texts)))
    assert row["vllm_tokens"] == sum(len(t) for t in texts) and out["engine"] == "vllm stand-in"
    vllm_bon.against_table1(out, [{"prompt_id": 3, "sbon_time": row["vllm_time"] / 4, "bon_time": row["vllm_time"]}])
    assert row["sbon_speedup_vs_vllm"] == pytest.approx(4) and row["bon_speedup_vs_vllm"] == pytest.approx(1)
