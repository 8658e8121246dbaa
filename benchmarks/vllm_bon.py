"""Best-of-N on vLLM (`--baseline vllm`): the engine a user would otherwise serve with, as a baseline
next to this project's Best-of-N and Speculative Rejection.

For every prompt of the experiment, vLLM samples N responses in one request (`SamplingParams(n=N)`)
from the same weights, the same chat-templated prompt tokens, sampling settings and length; the
experiment's reward scores them here, and the best is kept. Its seconds are vLLM's generation plus
this reward's scoring, one prompt at a time (as the experiment times its own methods). vLLM draws
its own random numbers, not the coupled uniforms of sbon.engine: its candidates are another draw of
Best-of-N, so its best reward is comparable on average, not prompt for prompt.

Never run against a real vLLM yet: it follows vLLM's documented API (`LLM`, `SamplingParams`,
`LLM.generate` with token-id prompts). The tests check the one-line refusal where vLLM or a CUDA device is
missing, and, with a stand-in `vllm` module, what it asks of vLLM (weights, prompt tokens, sampling) and how it
scores the answers. Its numbers are to be measured on a GPU machine (`gpu-check`'s `vllm` part).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from typing import Any, Sequence

from sbon.engine import Generator, SamplingConfig
from sbon.errors import SBoNError
from sbon.metrics import normalized_score
from sbon.rewards import RewardModel

from . import common

NOT_RUN_NOTE = ("vLLM baseline code path written from vLLM's documented API; it was not run in this project's "
                "CPU-only environment (no GPU was available), so no vLLM number here was measured by it")


def add_baseline_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("baseline engine (GPU only)")
    g.add_argument("--baseline", choices=["vllm"], default=None,
                   help="also run Best-of-N with vLLM's n sampling on the same prompts and reward (pip install vllm "
                        "on a CUDA machine; not measured in this project's CPU environment)")
    g.add_argument("--vllm-gpu-memory", type=float, default=0.5,
                   help="vLLM's gpu_memory_utilization: the share of the GPU it may take (this process's models "
                        "hold the rest)")


def check_available(args: argparse.Namespace) -> None:
    """Fail in one line, before any work, where the vLLM baseline cannot run."""
    if getattr(args, "baseline", None) != "vllm":
        return
    if getattr(args, "ray", None) is not None:
        raise SBoNError("--baseline vllm runs in this process on its GPU: run it without --ray")
    if importlib.util.find_spec("vllm") is None:
        raise SBoNError("--baseline vllm needs vLLM, which is not installed: on a CUDA machine, pip install vllm "
                        "(it brings its own CUDA build of torch)")
    import torch

    if not torch.cuda.is_available() or args.device == "cpu":
        raise SBoNError("--baseline vllm needs a CUDA GPU: vLLM is installed but no CUDA device is in use here")


def load_llm(gen: Generator, seed: int, gpu_memory: float):
    """vLLM on the weights the generator was loaded from (a local folder or hub id), in its dtype."""
    from vllm import LLM

    source = gen.model.name_or_path
    dtype = str(gen.model.dtype).removeprefix("torch.")
    return LLM(model=source, tokenizer=source, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory)


def run_prompt(llm, gen: Generator, reward: RewardModel, p: dict, params) -> dict[str, Any]:
    """One prompt: N responses from one vLLM request, scored by the experiment's reward."""
    prompt_ids = gen.encode_prompt(p["instruction"])  # the chat template and tokens of this project's engine
    start = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)[0]
    generate_s = time.perf_counter() - start
    texts = [o.text for o in out.outputs]
    start = time.perf_counter()
    rewards = reward.score(p["instruction"], texts)
    gen.synchronize()
    reward_s = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in out.outputs)
    return {"prompt_id": p["id"], "vllm_time": generate_s + reward_s, "vllm_generate_s": generate_s,
            "vllm_reward_s": reward_s, "vllm_tokens": tokens, "vllm_tok_per_s": tokens / generate_s,
            "vllm_best": max(rewards), "vllm_rewards": rewards}


def run_vllm_bon(gen: Generator, reward: RewardModel, prompts: Sequence[dict], *, n: int, max_new_tokens: int,
                 sampling: SamplingConfig, seed: int, gpu_memory: float = 0.5, quiet: bool = False) -> dict[str, Any]:
    """Best-of-n with vLLM on every prompt: per-prompt rows (seconds, tokens, best reward) and their
    means; the caller sets them against its own methods."""
    from vllm import SamplingParams

    print("loading vLLM ...", file=sys.stderr)
    llm = load_llm(gen, seed, gpu_memory)
    params = SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                            max_tokens=max_new_tokens, seed=seed)
    llm.generate([{"prompt_token_ids": gen.encode_prompt("Say hello.")}],  # warm-up, as common.warm_up
                 SamplingParams(n=2, max_tokens=4, seed=seed), use_tqdm=False)
    rows = []
    bar = common.progress(len(prompts), "vLLM Best-of-N", disable=quiet)
    for p in prompts:
        rows.append(run_prompt(llm, gen, reward, p, params))
        bar.update()
    bar.close()
    import vllm

    return {"engine": f"vllm {vllm.__version__}", "n": n, "note": NOT_RUN_NOTE, "rows": rows,
            "summary": {k: common.summarize([r[k] for r in rows])
                        for k in ("vllm_time", "vllm_generate_s", "vllm_reward_s", "vllm_tok_per_s", "vllm_best")}}


def against_table1(baseline: dict[str, Any], table_rows: Sequence[dict]) -> None:
    """Table 1's view: Speculative Rejection's speedup over vLLM's Best-of-N, per prompt and on average."""
    by_id = {r["prompt_id"]: r for r in table_rows}
    for r in baseline["rows"]:
        t = by_id.get(r["prompt_id"])
        if t is not None:
            r["sbon_speedup_vs_vllm"] = r["vllm_time"] / t["sbon_time"]
            r["bon_speedup_vs_vllm"] = r["vllm_time"] / t["bon_time"]
    for k in ("sbon_speedup_vs_vllm", "bon_speedup_vs_vllm"):
        baseline["summary"][k] = common.summarize([r.get(k) for r in baseline["rows"]])


def against_efficiency(baseline: dict[str, Any], eff_rows: Sequence[dict]) -> None:
    """The efficiency view: vLLM's Best-of-N scored against the same Best-of-B reward range, and its
    seconds on one accelerator relative to Best-of-B's."""
    by_id = {r["prompt_id"]: r for r in eff_rows}
    for r in baseline["rows"]:
        e = by_id.get(r["prompt_id"])
        if e is not None:
            r["score"] = normalized_score([e["baseline_min"], e["baseline_max"]], r["vllm_best"])
            r["time_vs_best_of_b"] = r["vllm_time"] / e["batch_s"][0]
    for k in ("score", "time_vs_best_of_b"):
        baseline["summary"][k] = common.summarize([r.get(k) for r in baseline["rows"]])
