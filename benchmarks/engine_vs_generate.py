"""Our engine against `transformers`' own sampler, on the same model, settings and process.

Best-of-N generation (no reward: a constant one, so only generation is timed) against
`model.generate(do_sample=True, num_return_sequences=N, ...)` with the same temperature, top-p,
top-k and stop tokens; the order alternates between prompts. Tokens per second count the tokens
of each response up to its stop token (what `generate` computes for the padding after a row
finished is its waste). Peak memory: see PeakRSS. Then Speculative Rejection with the real reward,
for the share of its wall time spent scoring rewards.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Sequence

import pandas as pd
import torch

from sbon.algorithms import events, speculative_rejection
from sbon.config import RunConfig
from sbon.engine import Generator, SamplingConfig
from sbon.rewards import CallableReward, RewardModel

from . import common, runners

TARGET_RATIO, TARGET_REWARD_SHARE = 1.2, 0.15

NO_REWARD = CallableReward(lambda prompt, responses: [0.0] * len(responses), name="none")


@torch.inference_mode()
def hf_generate(gen: Generator, prompt_ids: Sequence[int], n: int, max_new_tokens: int, sampling: SamplingConfig,
                seed: int, logits_processor=None) -> dict[str, Any]:
    """`model.generate` for N samples of one prompt; tokens counted up to each row's stop token.
    ``logits_processor``: passed to ``generate`` (the GPU check forces its random models' lengths with it)."""
    torch.manual_seed(seed)
    ids = torch.tensor([list(prompt_ids)], device=gen.device)
    stop = sorted(gen.stop_ids)
    start = time.perf_counter()
    out = gen.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=sampling.temperature > 0,
                             num_return_sequences=n, max_new_tokens=max_new_tokens,
                             temperature=sampling.temperature or None, top_p=sampling.top_p, top_k=sampling.top_k,
                             eos_token_id=stop, pad_token_id=gen.tokenizer.pad_token_id or stop[0],
                             logits_processor=logits_processor)
    gen.synchronize()
    elapsed = time.perf_counter() - start
    new = out[:, ids.shape[1]:]
    is_stop = torch.isin(new, torch.tensor(stop, device=new.device))
    first_stop = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, torch.full_like(is_stop[:, 0], new.shape[1], dtype=torch.long))
    return {"time": elapsed, "tokens": int(first_stop.sum()), "steps": int(new.shape[1]),
            "rows_x_steps": int(new.shape[0] * new.shape[1])}


def ours(gen: Generator, text: str, n: int, max_new_tokens: int, sampling: SamplingConfig, seed: int,
         decode_chunk: int = 1) -> dict[str, Any]:
    # Op by op, as generate runs: the engines are compared here, not the decode steps (python -m benchmarks step).
    config = RunConfig.build(sampling, method="bon", n=n, max_new_tokens=max_new_tokens, seed=seed,
                             decode_chunk=decode_chunk, decode="eager")
    # From the run's start to its result, as generate is timed: not timed_run's garbage collection before it (a
    # full collection walks every object of a process that holds a model, tenths of a second on a CPU).
    seconds: list[float] = []
    r = common.timed_run(events(gen, NO_REWARD, text, config), on_event=lambda event, s: seconds.append(s))
    return {"time": seconds[-1], "tokens": r.total_tokens, "steps": max(c.tokens_generated for c in r.candidates),
            "rows_x_steps": r.total_tokens, "timings": r.timings}


def run_engine(gen: Generator, reward: RewardModel, prompts: Sequence[dict], *, n: int = 32, max_new_tokens: int = 256,
               sampling: SamplingConfig | None = None, seed: int = 0, reward_share: bool = True,
               quiet: bool = False, decode_chunk: int = 1) -> dict[str, Any]:
    sampling = sampling or SamplingConfig()
    from transformers.utils import logging as tf_logging

    tf_logging.set_verbosity_error()
    common.warm_up(gen, reward, sampling, decode="eager")
    hf_generate(gen, gen.encode_prompt("Say hello."), 2, 4, sampling, seed)
    rows = []
    bar = common.progress(len(prompts) * (3 if reward_share else 2), "engine", disable=quiet)
    for i, p in enumerate(prompts):
        text = p["instruction"]
        prompt_ids = gen.encode_prompt(text)
        row: dict[str, Any] = {"prompt_id": p["id"], "prompt_tokens": len(prompt_ids)}
        order = ("ours", "hf") if i % 2 == 0 else ("hf", "ours")  # alternate, so drift favours neither
        for who in order:
            bar.set_description(f"engine prompt {p['id']} {who}")
            with common.PeakRSS(gen.device) as mem:
                m = (ours(gen, text, n, max_new_tokens, sampling, seed, decode_chunk) if who == "ours"
                     else hf_generate(gen, prompt_ids, n, max_new_tokens, sampling, seed))
            row.update({f"{who}_time": m["time"], f"{who}_tokens": m["tokens"], f"{who}_steps": m["steps"],
                        f"{who}_rows_x_steps": m["rows_x_steps"], f"{who}_tok_per_s": m["tokens"] / m["time"],
                        f"{who}_peak_mem_growth": mem.growth})
            if "timings" in m:
                row["ours_timings"] = m["timings"]
            bar.update()
        row["tok_per_s_ratio"] = row["ours_tok_per_s"] / row["hf_tok_per_s"]
        row["peak_mem_ratio"] = row["ours_peak_mem_growth"] / max(1, row["hf_peak_mem_growth"])
        if reward_share:
            bar.set_description(f"engine prompt {p['id']} SBoN reward share")
            sbon = common.timed_run(speculative_rejection(gen, reward, text, n, max_new_tokens=max_new_tokens,
                                                      sampling=sampling, seed=seed, decode="eager"))
            row.update({"sbon_time": sbon.wall_time, "sbon_timings": sbon.timings,
                        "sbon_reward_share": sbon.timings["reward"] / sbon.wall_time})
            bar.update()
        rows.append(row)
        bar.set_postfix(ratio=f"{row['tok_per_s_ratio']:.2f}")
    bar.close()

    def s(name):
        return common.summarize([r[name] for r in rows])

    ours_tokens, hf_tokens = sum(r["ours_tokens"] for r in rows), sum(r["hf_tokens"] for r in rows)
    ours_time, hf_time = sum(r["ours_time"] for r in rows), sum(r["hf_time"] for r in rows)
    summary = {
        "ours_tok_per_s": ours_tokens / ours_time, "hf_tok_per_s": hf_tokens / hf_time,
        "tok_per_s_ratio_pooled": (ours_tokens / ours_time) / (hf_tokens / hf_time),
        "tok_per_s_ratio": s("tok_per_s_ratio"),
        "ours_mean_length": ours_tokens / (n * len(rows)), "hf_mean_length": hf_tokens / (n * len(rows)),
        "hf_padding_waste": 1 - hf_tokens / sum(r["hf_rows_x_steps"] for r in rows),
        "ours_peak_mem_growth": s("ours_peak_mem_growth"), "hf_peak_mem_growth": s("hf_peak_mem_growth"),
        "peak_mem_ratio": s("peak_mem_ratio"), "memory_method": common.PeakRSS(gen.device).method,
        "ours_phase_share": {ph: sum(r["ours_timings"][ph] for r in rows) / sum(r["ours_timings"]["total"] for r in rows)
                             for ph in ("prefill", "decode", "reward", "rejection")},
    }
    targets = {f"our tokens/s >= {TARGET_RATIO}x model.generate's (pooled)": summary["tok_per_s_ratio_pooled"] >= TARGET_RATIO}
    if reward_share:
        total = sum(r["sbon_timings"]["total"] for r in rows)
        summary["sbon_phase_share"] = {ph: sum(r["sbon_timings"][ph] for r in rows) / total
                                       for ph in ("prefill", "decode", "reward", "rejection")}
        summary["sbon_reward_share"] = s("sbon_reward_share")
        targets[f"reward scoring <= {TARGET_REWARD_SHARE:.0%} of SBoN's wall time (pooled)"] = (
            summary["sbon_phase_share"]["reward"] <= TARGET_REWARD_SHARE)
    return {"rows": rows, "summary": summary, "targets": targets}


def plot(result: dict[str, Any]):
    from plotly.subplots import make_subplots

    df = pd.DataFrame(result["rows"])
    ids = df["prompt_id"].astype(str)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per second", "peak memory growth (MiB)"))
    fig.add_bar(x=ids, y=df["ours_tok_per_s"], name="sbon best_of_n", marker_color="#1f77b4", row=1, col=1)
    fig.add_bar(x=ids, y=df["hf_tok_per_s"], name="model.generate", marker_color="#7f7f7f", row=1, col=1)
    fig.add_bar(x=ids, y=df["ours_peak_mem_growth"] / 2**20, name="sbon best_of_n", marker_color="#1f77b4",
                showlegend=False, row=1, col=2)
    fig.add_bar(x=ids, y=df["hf_peak_mem_growth"] / 2**20, name="model.generate", marker_color="#7f7f7f",
                showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="prompt id")
    fig.update_layout(title="Engine: our Best-of-N vs transformers' generate (same model and sampling)", barmode="group")
    return fig


def add_parser(sub) -> None:
    p = sub.add_parser("engine", help="our Best-of-N vs model.generate: tokens/s and peak memory; reward share of SBoN",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_common_args(p, k=5)
    p.add_argument("--no-reward-share", action="store_true", help="skip the Speculative Rejection runs")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    prompts = common.prompts_from(args)
    gen, reward = runners.setup(args)
    result = run_engine(gen, reward, prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                        sampling=common.sampling_from(args), seed=args.seed,
                        reward_share=not args.no_reward_share, quiet=args.quiet)
    json_path, html_path = common.result_paths(args, "engine")
    common.write_json({"experiment": "engine", "settings": common.base_settings(args, gen, reward, prompts),
                       "environment": common.environment(gen), **result}, json_path)
    df = pd.DataFrame(result["rows"])
    cols = ["prompt_id", "ours_tokens", "hf_tokens", "ours_tok_per_s", "hf_tok_per_s", "tok_per_s_ratio",
            "ours_peak_mem_growth", "hf_peak_mem_growth", "sbon_reward_share"]
    df["ours_peak_mem_growth"] /= 2**20
    df["hf_peak_mem_growth"] /= 2**20
    common.print_table("per prompt (memory in MiB):", df[[c for c in cols if c in df]])
    s = result["summary"]
    print(f"\nour Best-of-N: {s['ours_tok_per_s']:.1f} tok/s; model.generate: {s['hf_tok_per_s']:.1f} tok/s "
          f"(ratio {s['tok_per_s_ratio_pooled']:.2f}; generate computed {s['hf_padding_waste']:.0%} padding)")
    print(f"peak memory growth, median: ours {s['ours_peak_mem_growth']['median'] / 2**20:.0f} MiB, "
          f"generate {s['hf_peak_mem_growth']['median'] / 2**20:.0f} MiB ({s['memory_method']})")
    print("our Best-of-N time by phase: " + ", ".join(f"{k} {v:.0%}" for k, v in s["ours_phase_share"].items()))
    if "sbon_phase_share" in s:
        print("Speculative Rejection time by phase: " + ", ".join(f"{k} {v:.0%}" for k, v in s["sbon_phase_share"].items()))
    for name, ok in result["targets"].items():
        print(f"  target {name}: {'met' if ok else 'NOT met'}")
    if not args.no_plot:
        common.write_plot(plot(result), html_path)
    print(f"\nwrote {json_path}" + ("" if args.no_plot else f" and {html_path}"))
    return 0
