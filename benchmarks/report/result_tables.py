"""One generator per result table, and their registry `TABLES` (name -> function(results_dir) -> markdown).

A new table is one function here and one entry in `TABLES`; its markers in a doc are `<!-- report:NAME -->` /
`<!-- /report:NAME -->` (doc_blocks.py fills them). Reads JSON only (no torch at import)."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from .formatting import MACHINE, REPO, link, load, load_avg, markdown_table, mean_median, num, pct, times

TABLE1_FILES = ("table1_budget.json", "table1.json", "table1_budget_nolength.json",
                "table1_budget_likelihood_logprob.json")


def table1(results_dir: Path) -> str:
    """Workshop Table 1: Speculative Rejection against Best-of-N and Best-of-M, one row per result file."""
    rows = []
    for name in TABLE1_FILES:
        path = results_dir / MACHINE / "table1" / name
        d = json.loads(path.read_text())
        s, st = d["summary"], d["settings"]
        reward = st["reward"] + (f", pruned by `{st['prune_by']}`" if st.get("prune_by") else "")
        memory = ("all N at once" if s["bon_memory"] == "all"
                  else f"in batches of {num(s['bon_batch_size']['mean'], 1)} (mean) that fit SR's KV budget")
        bom = f"Best-of-{s['best_of_m']}: score {mean_median(s.get('bom_score'))}"
        bom += f", speedup {mean_median(s['bom_speedup'], 2, times)}" if "bom_speedup" in s else " (not timed)"
        rows.append([link(results_dir, path), reward, str(s["prompts"]), f"N={st['n']}, {st['max_new_tokens']}",
                     memory, mean_median(s["speedup"], 2, times), mean_median(s["sbon_score"]),
                     mean_median(s["token_rate"], 2), bom])
    return markdown_table(["file", "reward", "prompts", "N, new tokens", "Best-of-N decodes", "speedup",
                           "normalized score", "token rate", "Best-of-M at equal time"], rows)


def counterfactual(results_dir: Path, name: str) -> str:
    """Partial vs final reward per τ (Figure 3, Appendix D) and the single-decision-token method's score at
    α = 0.5, replayed on Best-of-N's candidates; then the cheapest (τ, α) that keeps a mean score ≥ 98."""
    path = results_dir / MACHINE / "counterfactual" / name
    d = json.loads(path.read_text())
    grid = {(g["tau"], g["alpha"]): g for g in d["grid"]}
    rows = []
    for c in d["correlations"]:
        g = grid.get((c["tau"], 0.5))
        boot = f"{num(g['normalized_score_boot_lo'])}–{num(g['normalized_score_boot_hi'])}" if g else "–"
        rows.append([str(c["tau"]), num(c["pearson"], 2), num(c["kendall"], 2), num(c["oracle_cut"], 2),
                     num(g and g["normalized_score"]), num(g and g["token_rate"], 2), boot])
    st = d["settings"]
    table = markdown_table(["τ (tokens)", "Pearson", "Kendall", "oracle cut c*", "score at α=0.5",
                            "token rate at α=0.5", "bootstrap interval of the score (N/2)"], rows)
    best = d.get("cheapest_setting_with_score_98")
    cheapest = (f"cheapest setting with a mean normalized score ≥ 98: τ = {best['tau']:.0f}, α = {best['alpha']}, "
                f"score {num(best['normalized_score'])} at token rate {num(best['token_rate'], 2)}"
                if best else "no setting reaches a mean normalized score of 98")
    return (f"{link(results_dir, path)}: reward `{st['reward']}`, {st['k']} prompts, N={st['n']}, "
            f"{st['max_new_tokens']} new tokens; {cheapest}.\n\n{table}")


def efficiency(results_dir: Path) -> str:
    """The NeurIPS metric (Section 5): score against Best-of-B's reward range, and accelerator compute."""
    path = results_dir / MACHINE / "efficiency" / "efficiency.json"
    d = json.loads(path.read_text())
    s, st = d["summary"], d["settings"]
    rows = [[f"Best-of-{b['n']}", str(b["accelerators"]), f"{num(b['score'])} / {num(b['score_median'])}",
             times(b["relative_compute"]), times(b.get("relative_steps")), "–", "–", "–"] for b in s["bon"]]
    rows += [[f"Speculative Rejection from {r['n']}, α={r['alpha']}", str(r["accelerators"]),
              f"{num(r['score'])} / {num(r['score_median'])}", times(r["relative_compute"]),
              times(r.get("relative_steps")), f"**{times(r['compute_ratio'])}**", times(r.get("step_ratio")),
              pct(r.get("picked_bon_best"))] for r in s["sbon"]]
    head = (f"{link(results_dir, path)}: {s['prompts']} prompts drawn with seed {st['prompt_seed']}, B={st['b']}, "
            f"{st['max_new_tokens']} new tokens, reward `{st['reward']}`; compute relative to {s['baseline']}.")
    return head + "\n\n" + markdown_table(
        ["method", "accelerators", "score (mean / median)", "accelerator-seconds", "decode steps",
         "Best-of-N compute at equal score", "… in decode steps", "returned Best-of-N's best"], rows)


def perplexity(results_dir: Path) -> str:
    """NeurIPS Table 2's shape: the perplexity of the returned response, and its compute."""
    path = results_dir / MACHINE / "perplexity" / "perplexity.json"
    d = json.loads(path.read_text())
    st = d["settings"]
    rows = [[r["method"], str(r["accelerators"]), f"{num(r['perplexity'], 2)} / {num(r['perplexity_median'], 2)}",
             times(r["relative_compute"]), times(r["compute_ratio_at_equal_perplexity"])] for r in d["table2"]]
    head = (f"{link(results_dir, path)}: {d['summary']['prompts']} prompts, B={st['b']}, {st['max_new_tokens']} new "
            f"tokens, reward `{st['reward']}` (lower perplexity = better).")
    return head + "\n\n" + markdown_table(
        ["method", "accelerators", "perplexity (mean / median)", "accelerator-seconds",
         "Best-of-N compute at equal perplexity"], rows)


def memory(results_dir: Path) -> str:
    """Section 6.3 (workshop numbering): Speculative Rejection from F·B candidates in Best-of-B's KV budget."""
    path = results_dir / MACHINE / "memory" / "memory.json"
    d = json.loads(path.read_text())
    s, st = d["summary"], d["settings"]
    rows = [[f"Speculative Rejection from {st['n']}", mean_median(s["sbon_score"]),
             mean_median(s["sbon_time_vs_bo_b"], 2, times), "–"]]
    for key in sorted((k for k in s if re.fullmatch(r"bo\d+", k)), key=lambda k: int(k[2:])):
        b = s[key]
        rows.append([f"Best-of-{key[2:]} (sequential batches)", num(b["score"]), times(b["time_vs_bo_b"]),
                     pct(b["sbon_at_least_as_good"])])
    head = (f"{link(results_dir, path)}: {s['prompts']} prompts, B={st['b']}, {st['max_new_tokens']} new tokens, "
            f"α={st['alpha']}, reward `{st['reward']}`.")
    return head + "\n\n" + markdown_table(
        ["method", "normalized score (mean / median; Best-of rows: mean)", f"wall time / Best-of-{st['b']}'s",
         "prompts where SR is at least as good"],
        rows)


def engine(results_dir: Path) -> str:
    """Our Best-of-N against `model.generate(num_return_sequences=N)`, and reward scoring's share of SR's time."""
    rows = []
    for name in ("engine.json", "engine_bf16_default.json"):  # float32 with SDPA; the CPU default (bf16)
        path = results_dir / MACHINE / "engine" / name
        d = json.loads(path.read_text())
        s, st = d["summary"], d["settings"]
        rows.append([link(results_dir, path), f"{st['k']} prompts, N={st['n']}, {st['max_new_tokens']}, "
                     f"{d['environment'].get('git_commit', '?')}", load_avg(d["environment"]),
                     num(s["ours_tok_per_s"]), num(s["hf_tok_per_s"]),
                     f"{mean_median(s['tok_per_s_ratio'], 2, times)} ({times(s['tok_per_s_ratio_pooled'])} over all tokens)",
                     pct(s["hf_padding_waste"]), mean_median(s["peak_mem_ratio"], 2),
                     pct(s["sbon_reward_share"]["mean"], 1)])
    return markdown_table(["file", "setting, commit", "load average", "our tokens/s", "`generate` tokens/s", "ratio (mean / median)",
                           "`generate`'s padding", "peak memory ours / `generate`'s",
                           "reward scoring share of SR's time"], rows)


def signals(results_dir: Path, name: str) -> str:
    """The signals matrix in full: per signal, Best-of-N's winner kept at every α and t, the mean normalized score
    at the first α, and the Kendall with the final reward; then per prompt set at the first α."""
    path = results_dir / MACHINE / "signals" / name
    d = json.loads(path.read_text())
    alphas, taus = d["settings"]["alphas"], d["settings"]["taus"]
    names = list(dict.fromkeys(m["signal"] for m in d["matrix"]))

    def cells(matrix):
        return {(m["signal"], m["tau"], m["alpha"]): m for m in matrix}

    def chain(c, sig, key, alpha, fmt):
        return " / ".join(fmt(c[sig, t, alpha][key]) if (sig, t, alpha) in c else "–" for t in taus)

    c = cells(d["matrix"])
    def kendall(x):
        return num(x, 2)
    rows = [[f"`{sig}`"] + [chain(c, sig, "winner_kept", a, lambda x: num(x, 0)) for a in alphas]
            + [chain(c, sig, "normalized_score", alphas[0], num), chain(c, sig, "kendall", alphas[0], kendall)]
            for sig in names]
    ts = " / ".join(str(t) for t in taus)
    out = (f"{link(results_dir, path)}: final reward `{d['final_reward']}`, {d['settings']['k']} + "
           f"{d['settings']['hh_k']} prompts; t = {ts}.\n\n" + markdown_table(
               ["signal"] + [f"winner kept (%), α = {a}" for a in alphas]
               + [f"mean normalized score, α = {alphas[0]}", "Kendall with the final reward"], rows))
    sets = list(d.get("by_set", {}))
    if sets:
        per = {s: cells(d["by_set"][s]) for s in sets}
        rows = [[f"`{sig}`"] + [x for s in sets for x in (chain(per[s], sig, "winner_kept", alphas[0], lambda v: num(v, 0)),
                                                         chain(per[s], sig, "kendall", alphas[0], kendall))]
                for sig in names]
        out += (f"\n\nPer prompt set, α = {alphas[0]}:\n\n"
                + markdown_table(["signal"] + [h for s in sets for h in (f"{s}: winner kept (%)", "Kendall")], rows))
    return out


def tune(results_dir: Path, name: str) -> str:
    """`python -m benchmarks tune`: per pruning signal, the cheapest (t, α) at a mean normalized score ≥ its floor."""
    path = results_dir / MACHINE / "signals" / name
    d = json.loads(path.read_text())
    reached = sorted((r for r in d["per_signal"].values() if r), key=lambda r: r["token_rate"])
    rows = [[f"`{r['signal']}`" + (" (best)" if r == d["best"] else ""), str(r["tau"]), str(r["alpha"]),
             num(r["normalized_score"]), num(r["token_rate"], 2), pct(r["winner_kept"]), num(r["kendall"], 2)]
            for r in reached]
    rows += [[f"`{sig}`", "no setting reaches the floor", "", "", "", "", ""]
             for sig, r in d["per_signal"].items() if not r]
    head = f"{link(results_dir, path)}: reward `{d['reward']}`, floor {d['floor']}, {d['prompts']} prompts."
    return head + "\n\n" + markdown_table(["signal", "τ", "α", "normalized score", "token rate",
                                           "winner kept", "Kendall"], rows)


def span(clicks: Sequence[dict], key: str) -> str:
    """The range of one timing over several clicks: `2.8–3.5 s`, or one value, or a dash for none."""
    vals = sorted(c[key] for c in clicks)
    if not vals:
        return "–"
    low, high = f"{vals[0]:.1f}", f"{vals[-1]:.1f}"
    return f"{low} s" if low == high else f"{low}–{high} s"


def app_timing(results_dir: Path, folder: str, only: Sequence[str] = ("*.json",)) -> str:
    """`python -m benchmarks app`: seconds from a click on Run to the first decision point drawn and to the final
    frame, and the start-up, one row per result file (those ``only`` names, in its order)."""
    rows = []
    for path in (p for name in only for p in sorted((results_dir / MACHINE / folder).glob(name))):
        d = json.loads(path.read_text())
        st, up = d["settings"], d.get("startup", {})
        setting = ", ".join(f"{k}={st[k]}" for k in ("n", "alpha", "max_new_tokens") if st.get(k) is not None)
        setting = setting or f"the app's defaults at commit {d['environment'].get('git_commit', '?')}"
        if st.get("SBON_THREADS"):
            setting += f", SBON_THREADS={st['SBON_THREADS']}"
        if "SBON_WEIGHTS" in st and not st["SBON_WEIGHTS"]:  # files that say whether the format was forced
            setting += f", weights {st['weights']} (the app's measured choice)"
        elif st.get("weights") not in (None, "app default"):
            setting += f", SBON_WEIGHTS={st['weights']}"
        decoded = list(dict.fromkeys(c["decode"] for c in d["clicks"] if "decode" in c))  # none: files from before the compiled step, eager
        if decoded:
            setting += f", decode step {' then '.join(decoded) if len(decoded) > 1 else decoded[0]}"
        first = [c for c in d["clicks"] if c["models"] != "loaded"]
        warm = [c for c in d["clicks"] if c["models"] == "loaded"]

        def timings(clicks: Sequence[dict]) -> str:  # files from before an answer was shown early have fewer
            keys = [k for k in ("first_round_s", "sbon_answer_s", "final_frame_s", "views_ready_s")
                    if all(k in c for c in clicks)]
            return " / ".join(span(clicks, k) if k in keys else "–" for k in
                              ("first_round_s", "sbon_answer_s", "final_frame_s", "views_ready_s"))

        clicks = d["clicks"]
        still = (f"{num(max(c['longest_still_s'] for c in clicks))} s / {num(max(c['chart_longest_still_s'] for c in clicks))} s"
                 if all("longest_still_s" in c and "chart_longest_still_s" in c for c in clicks) else "–")
        rows.append([link(results_dir, path), setting, load_avg(d["environment"]),
                     num(up.get("page_ready_s")), num(up.get("models_ready_s")), timings(first), timings(warm), still])
    columns = "first decision point / Speculative Rejection's answer / final frame / every view"
    return markdown_table(["file", "settings", "load average", "start → page ready (s)", "start → models ready (s)",
                           f"first Run (models loading): {columns}", f"later Runs: {columns}",
                           "longest the live view stood still during a run / its chart alone (every click)"], rows)


def step(results_dir: Path, name: str = "step_quiet_threads2.json") -> str:
    """`python -m benchmarks step`: ms per decode step by column and rows, next to the machine's probes;
    the speed-ups over the baseline (fp32 weights, SDPA) and llama.cpp, measured in the same run."""
    path = results_dir / MACHINE / "step" / name
    d = json.loads(path.read_text())
    from ..step import speedups  # here only: the step module imports torch

    cols = list(dict.fromkeys(r["format"] for r in d["table"]))
    row_counts = sorted({r["rows"] for r in d["table"]})
    ms = {(r["format"], r["rows"]): r["ms_per_step"] for r in d["table"]}
    div = {n: v["rate"] for n, v in d.get("divergence", {}).items()}

    def divergence(c: str) -> str:  # a compiled column's own check (its guards-skipped twin shares it), else its format's
        key = next((k for k in (c, c.split(",")[0], c.split()[0]) if k in div), None)
        return pct(div[key]) if key and "sdpa" not in c else "–"

    rows = [[f"`{c}`"] + [num(ms.get((c, n))) for n in row_counts] + [divergence(c)] for c in cols]
    p, st = d["probes"], d["settings"]
    parts = [f"{link(results_dir, path)} ({st['threads']} threads, {st['steps']} timed steps, median of "
             f"{st['repeats']} interleaved round(s); load average {load_avg(d['environment_start'])} at the start, "
             f"{load_avg(d['environment'])} at the end; this machine: matmul {num(p['matmul_fp32_gflops'], 0)} GFLOP/s "
             f"fp32, {num(p['matmul_bf16_gflops'], 0)} bf16, copy {num(p['copy_gbps'])} GB/s):",
             markdown_table(["column"] + [f"{n} rows (ms)" for n in row_counts] + ["divergence"], rows),
             "\n".join(f"- {line}" for line in speedups(d["table"]))]
    return "\n\n".join(part for part in parts if part)


def machine_files(results_dir: Path) -> list[dict]:
    """`python -m benchmarks machines`' files, in its classes' order: one per CPU class on the reference machine
    (each emulated there but the machine's own class), then each file another machine measured of its own class."""
    from ..cpu_classes import CPU_CLASSES, native  # no torch at import

    def read(path: Path) -> dict:
        return {**json.loads(path.read_text()), "_path": path}

    own = results_dir / MACHINE / "machines"
    found = [read(own / f"{name}.json") for name in CPU_CLASSES if (own / f"{name}.json").exists()]
    found += [d for name in CPU_CLASSES for path in sorted(results_dir.glob(f"cpu-*/machines/{name}.json"))
              if path.parent != own and native(name, (d := read(path))["environment"])]
    return found


def class_label(d: dict) -> str:
    """A result's CPU class and the CPU it ran on, native or emulated (benchmarks.cpu_classes.native); a native
    result says too where its CPU has AMX, which oneDNN's bfloat16 matrix products use where no limit hides it."""
    from ..cpu_classes import CPU_CLASSES, native  # no torch at import

    env = d["environment"]
    how = "native" if native(d["class"], env) else "emulated"
    amx = ", with AMX" if how == "native" and "amx_bf16" in env.get("cpu_flags", ()) else ""
    return f"{CPU_CLASSES[d['class']].title} ({how} on {env['cpu_model']}{amx})"


def seconds_span(xs: Sequence[float], digits: int = 1) -> str:
    """Seconds as one value or the range of several ("175–204"); "–" for none."""
    if not xs:
        return "–"
    low, high = f"{min(xs):.{digits}f}", f"{max(xs):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def met(value: float | None, target: float | None) -> str:
    return "" if value is None or target is None else f" ({'met' if value <= target else 'missed'}: ≤ {target:g})"


def machines(results_dir: Path) -> str:
    """`python -m benchmarks machines`: per emulated CPU class, whether its limits held, ms per step of every path
    at each row count with each format's divergence there, the app's path and its page-default comparison, warm."""
    parts = []
    for d in machine_files(results_dir):
        st, isa, s = d["step_settings"], d["isa"], d["summary"]
        ms = {(r["format"], r["rows"]): r["ms_per_step"] for r in d["table"]}
        cols, row_counts = list(dict.fromkeys(r["format"] for r in d["table"])), sorted({r["rows"] for r in d["table"]})
        div = {f: v["rate"] for f, v in d["divergence"].items()}
        rows = [[f"`{c}`"] + [num(ms.get((c, n))) for n in row_counts] + [pct(div.get(c.split()[0]))] for c in cols]
        limits = " ".join(f"`{k}={v}`" for k, v in d["limits"].items()) or "none"
        held = "held" if not d["limit_problems"] else "did not hold: " + "; ".join(d["limit_problems"])
        compare = d.get("compare") or {}
        runs = compare.get("runs") or []
        took = ", ".join(sorted({f"{r['weights']} weights, {r['decode']} step" for r in runs})) or "–"
        parts += [f"**{class_label(d)}** ({link(results_dir, d['_path'])}; limits {limits}: {held}; torch capability "
                  f"{isa['capability']}, matmul {num(isa['matmul_fp32_gflops'], 0)} GFLOP/s fp32, "
                  f"{num(isa['matmul_bf16_gflops'], 0)} bf16, inductor `{isa.get('inductor_flags') or '–'}`; "
                  f"{st['threads']} threads, {st['steps']} timed steps, median of {st['repeats']} round(s); load "
                  f"average {load_avg(d['environment_start'])} at the start, {load_avg(d['environment'])} at the end):",
                  markdown_table(["path"] + [f"{n} rows (ms)" for n in row_counts] + ["divergence"], rows),
                  f"Fastest exact path at 1 row: `{s['fastest_exact']}` {num(s['fastest_exact_ms'])} ms"
                  f"{met(s['fastest_exact_ms'], s['step_target_ms'])}. The app's path here: "
                  f"`{d['app_path']['weights']}` weights, decode `{d['app_path']['decode']}` ({d['app_path'].get('reason', '')}); "
                  + (f"its page-default comparison, warm: {seconds_span(compare['seconds'])} s"
                     f"{met(s['compare_s'], s['compare_target_s'])} ({took}; {sum(r['diverged'] for r in runs)} "
                     "candidates diverged from Best-of-N)." if runs else
                     "the page-default comparison was not run (`--runs 0`).")
                  + every_path(s.get("compare_by_path_s") or {}, s.get("chosen_against_fastest"))]
    if not parts:
        return "No result files yet: `python -m benchmarks machines`."
    return "\n\n".join(parts)


def every_path(seconds: dict[str, float], ratio: float | None) -> str:
    """`--every-path`: the page-default comparison on each exact format's compiled step, fastest first."""
    if not seconds:
        return ""
    return (" The same comparison on each exact format's compiled step (median): "
            + ", ".join(f"`{path}` {num(s)} s" for path, s in sorted(seconds.items(), key=lambda kv: kv[1]))
            + f"; the app's path took {num(ratio, 2)}× the fastest.")


def machines_readme(results_dir: Path) -> str:
    """One row per emulated CPU class: the page-default comparison, warm, on the app's path there."""
    rows = []
    for d in machine_files(results_dir):
        compare, s = d.get("compare") or {}, d["summary"]
        runs = compare.get("runs") or []
        took = ", ".join(sorted({f"{r['weights']}, {r['decode']}" for r in runs})) or \
            f"{d['app_path']['weights']}, {d['app_path']['decode']}"
        ran = f"{seconds_span(compare['seconds'])} s" if runs else "not run"
        rows.append([class_label(d), link(results_dir, d["_path"]), took, ran,
                     f"`{s['fastest_exact']}` {num(s['fastest_exact_ms'])} ms", load_avg(d["environment_start"])])
    if not rows:
        return "No result files yet: `python -m benchmarks machines`."
    return markdown_table(["CPU class", "file", "the app's path", "page-default run, warm",
                           "fastest exact step, 1 row", "load average"], rows)


def machines_neighbour(results_dir: Path) -> str:
    """`python -m benchmarks machines --neighbour N`: per CPU class, the quiet start's choice and when its runs took
    it, then the starts beside a busy loop: how many chose the same, when their runs took that path, the
    page-default comparison after the loop stopped against the quiet start's, and beside a busy loop: as the app runs
    it, and on the measured thread count (files written before these were measured: –)."""
    from ..cpu_classes import CPU_CLASSES  # no torch at import

    files = [(json.loads(path.read_text()), path) for path in results_dir.glob("cpu-*/machines/neighbour-*.json")]
    order = list(CPU_CLASSES)
    rows = []
    for d, path in sorted(files, key=lambda f: (order.index(f[0]["class"]), str(f[1]))):
        s, quiet = d["summary"], d["quiet_start"].get("choice") or {}
        reached = [x for x in s.get("fast_path_after_s", []) if x is not None]
        rows.append([class_label(d), link(results_dir, path),
                     f"`{quiet.get('weights')}` {quiet.get('decode')}",
                     f"{num(s['quiet_fast_path_s'], 0)} s" if s.get("quiet_fast_path_s") is not None else "–",
                     warm_up_runs(d),
                     busy_starts(d),
                     f"{seconds_span(reached, 0)} s" if reached else "–",
                     f"{num(s['compare_after_s'])} s against {num(s['compare_quiet_s'])} s" if s["starts"] else
                     f"– against {num(s['compare_quiet_s'])} s",
                     beside_loop(d),
                     "built anew by each start" if "--fresh-steps" in d["command"] else
                     "built by the quiet start, reused by the others" if any(
                         "still be built" in (c.get("provisional") or "") for c in d["quiet_start"].get("choices", []))
                     else "saved on the machine before"])
    if not rows:
        return "No result files yet: `python -m benchmarks machines --neighbour 5`."
    return markdown_table(["CPU class", "file", "quiet start's choice", "its runs took it after",
                           "page-default run pressed at once: quiet start; beside a busy loop",
                           "starts beside a busy loop choosing the same", "their runs took it after",
                           "page-default run after the loop stopped, against quiet",
                           "page-default run beside a busy loop: as the app runs it; on the measured threads",
                           "compiled steps"], rows)


def warm_up_runs(d: dict) -> str:
    """A neighbour file's page-default runs pressed at once on each fresh start, while its measuring child works: the
    quiet start's, then those beside the loop; each with its path, the thread count it ended on, and the moves of its
    threads between its steps (sbon.probe.ThreadWatch; files written before it show none, and before the path was
    recorded, the seconds only)."""
    def one(run: dict) -> str:
        if "weights" not in run:
            return f"{num(run['s'])} s"
        moves = [f"{threads} at {at:g} s" for at, threads in run.get("thread_changes") or []]
        return (f"{num(run['s'])} s (`{run['weights']}` {run['decode']}, {run['threads']} "
                f"thread{'s' * (run['threads'] != 1)}" + (f"; moved to {', '.join(moves)}" if moves else "") + ")")
    runs = [start.get("run") or {"s": start["run_s"]} for start in (d["quiet_start"], *d["starts"])
            if start.get("run") or start.get("run_s") is not None]
    if not runs:
        return "–"
    return one(runs[0]) + "; " + (", ".join(one(r) for r in runs[1:]) or "none beside a loop")


def busy_starts(d: dict) -> str:
    """A neighbour file's starts beside a busy loop: how many chose the quiet start's path, and how many ended with a
    provisional choice (their measuring child waited for the cores, or could only time beside the loop), when."""
    s = d["summary"]
    if not s["starts"]:
        return "none started"
    ended = [start["choices"][-1] for start in d["starts"] if start.get("choices")]
    provisional = [c["s"] for c in ended if c.get("provisional")]
    settled = [start["run_settled"] for start in d["starts"] if start.get("run_settled")]
    return f"{s['same_choice_as_quiet']} of {s['starts']}" + (
        f"; {len(provisional)} ended provisional, after {seconds_span(provisional, 0)} s" if provisional else "") + (
        "; then a page-default run beside the loop: " + ", ".join(
            f"{num(r['s'])} s (`{r['weights']}` {r['decode']}, {r['threads']} thread{'s' * (r['threads'] != 1)})"
            for r in settled) if settled else "")


def beside_loop(d: dict) -> str:
    """A neighbour file's page-default comparison beside a busy loop: its seconds and the threads and step its runs
    decoded on, then the same kept on the measured thread count (SBON_THREADS), where measured."""
    s = d["summary"]
    if s.get("compare_beside_loop_s") is None:
        return "–"
    runs = d["compare_beside_loop"].get("runs", [])
    threads = sorted({r.get("threads") for r in runs} - {None})
    steps = sorted({r.get("decode") for r in runs} - {None})
    text = f"{num(s['compare_beside_loop_s'])} s" + (f" ({'/'.join(map(str, threads))} thread"
                                                      f"{'s' * (threads != [1])}, {'/'.join(steps)})" if threads else "")
    kept, failed = s.get("compare_beside_loop_kept_threads_s"), (d.get("compare_beside_loop_kept_threads") or {}).get(
        "failed")
    return text + (f"; {num(kept)} s" if kept is not None else f"; stopped ({failed})" if failed else "")


def ray(results_dir: Path) -> str:
    """`--ray`: one `table1` sweep on k workers; k=1 against k=2, per round of runs (rounds differ in load)."""
    path = results_dir / MACHINE / "ray" / "scaling.json"
    d = json.loads(path.read_text())
    rows = [[r["tag"], str(r["workers"] or "no Ray"), num(r["sweep_s"]), num(r["startup_s"]), num(r["end_to_end_s"]),
             r["load_average_before"].split()[0], "yes" if r["rows_equal_single_process_but_timings"] else "**no**"]
            for r in d["runs"]]
    table = markdown_table(["run (round)", "workers", "sweep (s)", "worker start-up (s)", "end to end (s)",
                            "load average before", "rows identical to one process"], rows)
    ratios = "; ".join(f"round {r['round']}: {times(r['sweep_k1_over_k2'])} sweep, "
                       f"{times(r['end_to_end_k1_over_k2'])} end to end" for r in d["speedup_k2_over_k1"])
    return f"{link(results_dir, path)}: {d['what']}.\n\n{table}\n\nk=2 over k=1: {ratios}."


RECORDED_RUN = REPO / "assets" / "recorded_run.json"


def recorded_run(results_dir: Path, path: Path = RECORDED_RUN) -> str:
    """The run the app opens on (made with the page's defaults by `python -m components.record`): its settings,
    decision points and headline. Read from the app's assets, not from results/, whatever `results_dir` is."""
    d = json.loads(path.read_text())
    m, st, bs = d["metrics"], d["sbon"]["settings"], d["bon"]["settings"]
    tokens = ", ".join(str(p["tokens"]) for p in d["sbon"]["decision_points"]) or "none"
    setting = (f"reward `{d['sbon']['reward']}`, pruned by `{st.get('prune_by', 'reward')}`, N={st['n']}, "
               f"α={st['alpha']}, {st['max_new_tokens']} new tokens, Best-of-N in batches of {bs.get('batch_size')}")
    return markdown_table(
        ["settings", "decision points after (tokens)", "Kendall at the first", "Best-of-N's winner",
         "speedup", "normalized score", "token rate", "Best-of-M at equal time"],
        [[setting, tokens, num(m["kendall_first_decision"], 2), "pruned" if m["bon_winner_pruned"] else "kept",
          times(m["speedup"]), num(m["normalized_score"]), num(m["token_rate"], 2),
          f"Best-of-{m['best_of_m']}: {num(m['best_of_m_normalized_score'])}"]])


def ifeval(results_dir: Path) -> str:
    """`python -m benchmarks ifeval`: each method's answer checked by IFEval's instructions, and per instruction
    type whether partial verdicts at the first decision point predicted the final ones."""
    path = results_dir / MACHINE / "ifeval" / "ifeval.json"
    d = load(results_dir, "ifeval", "ifeval.json")
    out = []
    for name, s in d["summary"].items():
        rows = []
        for method, m in s["methods"].items():
            dp = (f"{mean_median(m['decision_points'], 1)} (none on {m['no_decision_point']}); Kendall "
                  f"{num(m['kendall_first_pooled'], 2)}"
                  + (f", per prompt {mean_median(m['kendall_first_per_prompt'], 2)}; tied pairs "
                     f"{pct(m['tied_pairs_first'])}" if "tied_pairs_first" in m else "")
                  + f"; winner kept {mean_median(m['winner_kept'], 0, pct)}" if "decision_points" in m else "")
            rows.append([method, mean_median(m["prompt_accuracy"], 2), mean_median(m["instruction_accuracy"], 2),
                         mean_median(m["token_rate"], 2), mean_median(m["seconds"], 0), dp])
        out.append(f"**{name}**, {s['prompts']} prompts of the evaluation split ({link(results_dir, path)}; load "
                   f"average at start {load_avg(d['environment_at_start'])}). Reward scoring took "
                   f"{mean_median(s['reward_share_of_sr_time'], 1, pct)} of Speculative Rejection's time.\n\n"
                   + markdown_table(["method", "prompt-level strict", "instruction-level strict", "token rate",
                                     "seconds", "decision points; Kendall (pooled, first; per prompt); tied pairs (partial rewards closer "
                                     "than the tie-break); Best-of-N's winner kept"],
                                    rows))
        sr = s["methods"]["SR rounds"]
        if "settled_alike_pairs_first" in sr:
            cut = sr["one_cut_token_rate"]
            out.append(f"Of the live pairs at the first decision point, {pct(sr['settled_alike_pairs_first'])} have every "
                       f"instruction settled alike in both (tied by any partial value). One cut there, each candidate "
                       f"as long as its Best-of-N twin, would spend a token rate of {mean_median(cut['reward'], 3)} "
                       f"with the survivors the reward chose, {mean_median(cut['lowest'], 3)} keeping the shortest-"
                       f"lived and {mean_median(cut['highest'], 3)} keeping the longest-lived: the range any partial "
                       f"reward could reach at α = {d['settings']['alpha']}.")
        types = [[kind.replace("_", "\\_"), str(t["live_candidates"]), pct(t["settled_at_first_decision"]),
                  num(t["kendall"], 2), str(t["pruned_while_open"]), pct(t["pruned_while_open_would_pass"])]
                 for kind, t in sorted(s["by_instruction_type"].items(),
                                       key=lambda kv: -(kv[1]["settled_at_first_decision"] or 0))]
        out.append("Per instruction type, at the first decision point of the rounds run:\n\n" + markdown_table(
            ["instruction type", "live candidates", "verdict settled", "Kendall (partial value vs followed)",
             "pruned while open", "of those, would have followed it"], types))
    return "\n\n".join(out)


def latest_gpu_engine(results_dir: Path) -> Path:
    """The newest `python -m benchmarks engine` result measured on a GPU (by the time its environment records),
    in any folder under results/."""
    found = {}
    for path in results_dir.rglob("engine*.json"):
        d = json.loads(path.read_text())
        if d.get("environment", {}).get("gpu") and "tok_per_s_ratio" in d.get("summary", {}):
            found[path] = d["environment"]["time"]
    return max(found, key=found.get)


def gpu_engine_row(results_dir: Path) -> list[str]:
    """The headline's GPU row: the engine benchmark on the newest GPU result, with its date, device and commit,
    whether or not it favours us."""
    path = latest_gpu_engine(results_dir)
    d = json.loads(path.read_text())
    env, s = d["environment"], d["summary"]
    commit = f"commit {env['git_commit'][:7]}" if env.get("git_commit") else "commit not recorded in the file"
    return [f"[engine](benchmarks.md#engine) on one {env['gpu']}, {env['time'][:10]}, {commit} "
            f"({link(results_dir, path)})", "our Best-of-N tokens/s / `model.generate`'s",
            f"{mean_median(s['tok_per_s_ratio'], 2, times)} ({times(s['tok_per_s_ratio_pooled'])} over all tokens)"]


# The folders of `python -m benchmarks gpu-check` results the docs show, by the key their tables' names end in ("":
# the H100's check, which has the paper-scale part), with the parts shown of each.
GPU_CHECKS = {"": (("gpu-h100", "gpu-check"), ("engine", "paper", "compiled", "coupling")),
              # before the graphs' attention and sampling fixes
              "h200-first": (("gpu-h200", "gpu-check-abe3b2b"), ("app", "coupling", "compiled", "engine")),
              # after them, before the app built inductor's step under its graphs
              "h200-0d1bc3c": (("gpu-h200", "gpu-check-0d1bc3c"), ("app", "coupling", "compiled")),
              "h200": (("gpu-h200", "gpu-check"), ("app", "coupling", "compiled", "engine")),
              "h200-inductor": (("gpu-h200", "inductor"), ("compiled",))}
GPU_CHECK = GPU_CHECKS[""][0]


def gpu_check_file(results_dir: Path, part: str, folder: tuple[str, ...] = GPU_CHECK) -> Path:
    return results_dir.joinpath(*folder, f"{part}.json")


def gpu_check_part(results_dir: Path, part: str, folder: tuple[str, ...] = GPU_CHECK) -> tuple[dict, str]:
    """One part's file of the GPU check, and a line saying where it ran."""
    path = gpu_check_file(results_dir, part, folder)
    d = json.loads(path.read_text())
    env = d["environment"]
    return d, (f"{link(results_dir, path)}: one {env.get('gpu', env['device'])}, torch {env['torch']}, transformers "
               f"{env['transformers']}, {env['time'][:10]}, commit {env.get('git_commit') or 'not recorded'}.")


def gpu_check_engine(results_dir: Path, folder: tuple[str, ...] = GPU_CHECK) -> str:
    """`gpu-check`'s engine part: our Best-of-N against `generate` on the random SmolLM2 stand-in."""
    d, where = gpu_check_part(results_dir, "engine", folder)
    rows = [[f"{o['n']}", "`generate`" if o["engine"] == "generate" else f"ours, decode_chunk {o['decode_chunk']}",
             num(o["tok_per_s"], 0), num(o["ms_per_step"]), times(o["vs_generate"])] for o in d["summary"]]
    return (f"{where} {d['generator']}; {d['tokens']} new tokens at most, forced lengths around "
            f"{d['forced_length_median']}; bfloat16.\n\n"
            + markdown_table(["N", "engine", "tokens/s", "ms per step", "tokens/s / `generate`'s"], rows))


def gpu_check_paper(results_dir: Path, folder: tuple[str, ...] = GPU_CHECK) -> str:
    """`gpu-check`'s paper-scale part: 8B-architecture timing, and decode steps against the bandwidth floor."""
    d, where = gpu_check_part(results_dir, "paper-scale", folder)
    steps = [[f"{st['rows']}", f"{st['context']}", num(st["ms_per_step"]), num(st["floor_ms"]),
              times(st["of_floor"], 1)] for st in d["decode_steps"]]
    return (f"{where} {d['model']}, N = {d['n']}, {d['max_new_tokens']} new tokens at most.\n\n"
            + markdown_table(["", "wall time", "tokens"],
                             [["Speculative Rejection", f"{num(d['sbon']['wall_time'])} s", f"{d['sbon']['tokens']}"],
                              [f"Best-of-N, batches of {d['bon_batch_size']} (the same KV memory)",
                               f"{num(d['bon']['wall_time'])} s", f"{d['bon']['tokens']}"]])
            + f"\n\nSpeedup {times(d['speedup'])}. Eager decode steps (our engine) against the floor the measured "
              f"bandwidth puts under them:\n\n"
            + markdown_table(["rows", "tokens in cache", "ms per step", "floor ms", "of the floor"], steps))


def gpu_check_compiled(results_dir: Path, folder: tuple[str, ...] = GPU_CHECK) -> str:
    """`gpu-check`'s compiled part: the compiled step against eager on the stand-in (on a GPU its CUDA graphs, and
    inductor's step under the same graphs where the file has it)."""
    d, where = gpu_check_part(results_dir, "compiled", folder)
    inductor = any("inductor_ms" in st for st in d["steps"])
    rows = [[f"{st['rows']}", f"{st['computed_rows']}", num(st["eager_ms"], 2), num(st["compiled_ms"], 2),
             times(st["speedup"], 1), num(st["compile_s"]), f"{st.get('cudagraph_skips', '–')}",
             pct(st["top1_agreement"])]
            + ([num(st.get("inductor_ms"), 2), num(st.get("inductor_compile_s"))] if inductor else [])
            for st in d["steps"]]
    return (f"{where} {d['generator']}, {d['context']} tokens in each row's cache, {d['repeats']} timed steps.\n\n"
            + markdown_table(["live rows", "rows computed", "eager ms", "compiled ms", "speedup", "first step s",
                              "CUDA graph skipped", "top-1 = eager's"]
                             + (["inductor under the graphs ms", "its first step s"] if inductor else []), rows))


def gpu_check_coupling(results_dir: Path, folder: tuple[str, ...] = GPU_CHECK) -> str:
    """`gpu-check`'s coupling part on the GPU: eagerly, and through the graphs where the file has them."""
    d, where = gpu_check_part(results_dir, "coupling", folder)
    paths = [("eager", d["by_dtype"]), ("CUDA graphs", d.get("graphs") or {})]
    repeat = any("repeat_divergence_rate" in r for _, results in paths for r in results.values())
    rows = [[dtype, path, f"{r['survivors']}", pct(r["survivor_divergence_rate"], 1), f"{r['pruned']}",
             pct(r["pruned_divergence_rate"], 1)] + ([pct(r.get("repeat_divergence_rate"), 1)] if repeat else [])
            for path, results in paths for dtype, r in results.items()]
    return (f"{where} {d['generator']}, reward `{d['reward']}`, N = {d['n']}, {d['tokens']} tokens, α = {d['alpha']}."
            "\n\n" + markdown_table(["dtype", "decoded", "survivors", "differ from their Best-of-N twin", "pruned",
                                      "not a prefix of the twin"]
                                     + (["Best-of-N run twice: differ"] if repeat else []), rows))


def decode_cell(run: dict, method: str) -> str:
    """A method's decode seconds in an app-part run, and per step where the file has its steps."""
    seconds, steps = run["timings"][method]["decode"], run.get("steps", {}).get(method)
    return num(seconds, 2) + (f" ({steps} steps, {num(1e3 * seconds / steps, 2)} ms each)" if steps else "")


def outside_cell(run: dict) -> str:
    """An app-part run's seconds outside both methods' own timings: what lies between and after them (the watched
    pruning signals, the counterfactual prefix rewards, the comparison's JSON)."""
    return num(run["seconds"] - sum(t["total"] for t in run["timings"].values()), 2)


def gpu_check_app(results_dir: Path, folder: tuple[str, ...] = GPU_CHECK) -> str:
    """`gpu-check`'s app part: the page-default comparison through the app's run path, warm, and where its time
    went; then on the graphs with inductor's step under them, where the app built it (benchmarks/gpu_app.py)."""
    d, where = gpu_check_part(results_dir, "app", folder)
    inductor = d.get("inductor") or {}
    runs = [(f"{i + 1}", r) for i, r in enumerate(d["compare"]["runs"])] + \
        [(f"{i + 1}, once the build was adopted", r) for i, r in enumerate(inductor.get("runs", []))]
    faster = any("faster" in r for _, r in runs)  # files since the app builds inductor's step itself
    phases = any("phases" in r for _, r in runs)  # files since the part times the comparison's phases
    rows = [[label, num(r["seconds"], 2), r["weights"], r["decode"]] + ([r.get("faster") or "–"] if faster else [])
            + [f"{r['diverged']} of {r['n']}"]
            + ([decode_cell(r, "speculative"), decode_cell(r, "bon"), outside_cell(r)] if "timings" in r
               else ["–", "–", "–"])
            + ([num(r["phases"]["counterfactual"], 2) if "phases" in r else "–"] if phases else [])
            for label, r in runs]
    captures = d.get("captures") or {}
    build = inductor.get("build")
    built = ""
    if build:
        ms = "; ".join(f"{count} rows {num(m['plain'], 2)} ms plain, {num(m['inductor'], 2)} ms with inductor"
                       for count, m in build["ms"].items())
        built = (f"; the app built inductor's step under its graphs {num(inductor['built_s'])} s after the start "
                 f"(compile and captures {num(build['compile_s'])} s; per replay: {ms}; used for "
                 f"{', '.join(map(str, build['inductor_rows'])) or 'no'} rows)")
    elif inductor:
        built = ("; the app's build of inductor's step under its graphs: "
                 f"{inductor.get('failed') or inductor.get('state')}")
    profile = d.get("profile") or {}
    if profile:
        built += ("; one more comparison under torch's profiler (" + (profile["failed"] if "failed" in profile else
                  f"{num(profile['seconds'], 2)} s), most host time in "
                  + ", ".join(f"{op['name']} {num(op['self_ms'])} ms ({op['calls']} calls)" for op in profile["ops"][:5]))
                  + ")")
    python = d.get("python_profile") or {}
    if python:
        built += ("; one more under Python's profiler (" + (python["failed"] if "failed" in python else
                  f"{num(python['seconds'], 2)} s), most own time in " + ", ".join(
                      f"{f['name']} {num(f['own_ms'])} ms ({f['calls']} calls)"
                      for f in sorted(python["functions"], key=lambda f: -f["own_ms"])[:5])) + ")")
    return (f"{where} {d['models']}; first run on CUDA graphs {num(d['first_run_on_graphs_s'])} s after the part's "
            f"start (the models' load, {num(d['load_s'])} s, included; {captures.get('graphs', 0)} graph captured in "
            f"{num(captures.get('capture_s'), 2)} s){built}.\n\n"
            + markdown_table(["warm run", "seconds", "weights", "decode"] + (["inductor's step"] if faster else [])
                             + ["diverged", "Speculative Rejection's decode s", "Best-of-N's decode s",
                                "outside both methods s"]
                             + (["of which counterfactual prefix rewards s"] if phases else []), rows))


def gpu_check_engine_row(results_dir: Path) -> list[str]:
    """The headline's row for the GPU check's engine part: ours / `generate` at each N, per decode_chunk."""
    d, _ = gpu_check_part(results_dir, "engine")
    env = d["environment"]
    ours = [o for o in d["summary"] if o["engine"] == "ours"]
    cells = "; ".join(f"N = {o['n']}, decode_chunk {o['decode_chunk']}: {times(o['vs_generate'])}" for o in ours)
    path = gpu_check_file(results_dir, "engine")
    return [f"[GPU check](space.md#the-gpu-check-one-command-on-a-bare-gpu-machine) on one {env['gpu']}, "
            f"{env['time'][:10]}, commit {env['git_commit']}, random-weight stand-in ({link(results_dir, path)})",
            "our Best-of-N tokens/s / `model.generate`'s", cells]


def headline(results_dir: Path) -> str:
    """One line per experiment: its main number, with a link to the section of the benchmarks page that has the rest."""
    def summary(*parts):
        return load(results_dir, *parts)["summary"]

    t_budget, t_all = summary("table1", "table1_budget.json"), summary("table1", "table1.json")
    eff = summary("efficiency", "efficiency.json")["sbon"][0]
    ppl = next(r for r in load(results_dir, "perplexity", "perplexity.json")["table2"]
               if r["compute_ratio_at_equal_perplexity"])
    cf = load(results_dir, "counterfactual", "counterfactual.json")
    at32 = next(g for g in cf["grid"] if g["tau"] == 32 and g["alpha"] == 0.5)
    mem, eng = summary("memory", "memory.json"), summary("engine", "engine.json")
    rows = [
        ["[Table 1](benchmarks.md#table1), Best-of-N memory-bound", "wall-time speedup; normalized score",
         f"{mean_median(t_budget['speedup'], 2, times)}; {mean_median(t_budget['sbon_score'])}"],
        ["[Table 1](benchmarks.md#table1), Best-of-N all at once", "wall-time speedup; normalized score",
         f"{mean_median(t_all['speedup'], 2, times)}; {mean_median(t_all['sbon_score'])}"],
        ["[NeurIPS efficiency](benchmarks.md#efficiency)", "Best-of-N compute needed for SR's score",
         f"{times(eff['compute_ratio'])} ({times(eff.get('step_ratio'))} in decode steps)"],
        ["[NeurIPS perplexity](benchmarks.md#perplexity)", "Best-of-N compute needed for SR's perplexity",
         f"{times(ppl['compute_ratio_at_equal_perplexity'])} ({ppl['method']})"],
        ["[counterfactual](benchmarks.md#counterfactual), τ=32, α=0.5", "normalized score at token rate",
         f"{num(at32['normalized_score'])} at {num(at32['token_rate'], 2)}"],
        ["[memory](benchmarks.md#memory)", "SR's score; its time / Best-of-B's",
         f"{mean_median(mem['sbon_score'])}; {mean_median(mem['sbon_time_vs_bo_b'], 2, times)}"],
        ["[engine](benchmarks.md#engine)", "our Best-of-N tokens/s / `model.generate`'s",
         mean_median(eng["tok_per_s_ratio"], 2, times)],
        gpu_check_engine_row(results_dir),
        gpu_engine_row(results_dir),
    ]
    return markdown_table(["experiment", "number", "result (a / b: mean / median over prompts)"], rows)


def class_load(results_dir: Path) -> str:
    """`python -m benchmarks load`: N visitors opening the page, gallery runs and shared links while one generation
    runs, per way of reading (files written before the modes existed: visitors through gradio_client)."""
    rows = []
    for path in sorted((results_dir / MACHINE / "load").glob("*.json")):
        d = json.loads(path.read_text())
        gen = d["settings"]["generation"]
        for r in d["rows"]:
            g, lk, pg = r["gallery"], r["link"], r["page"]
            extra = r.get("server_cpu_s"), d.get("baseline_server_cpu_s")
            rows.append([link(results_dir, path), LOAD_MODES[r.get("mode")], str(r["visitors"]),
                         f"N={gen['n']}, {gen['max_new_tokens']} tokens",
                         f"{num(pg['p50_s'], 2)} / {num(pg['p95_s'], 2)}",
                         f"{num(g['p50_s'], 2)} / {num(g['p95_s'], 2)} ({g['count']})",
                         f"{num(lk['p50_s'], 2)} / {num(lk['p95_s'], 2)} ({lk['count']})", str(r["errors"]),
                         f"{num(r['baseline_s'])} → {num(r['generation_s'])} s ({pct(r['slowdown'])})",
                         num(extra[0] - extra[1], 0) if None not in extra else "–", num(r.get("clients_cpu_s"), 0),
                         num(r["server_peak_rss_mb"], 0), num(r["load_average_before"][0], 1)])
    return markdown_table(["file", "visitors read", "visitors", "generation meanwhile", "page open p50 / p95 (s)",
                           "gallery open p50 / p95 (s) (opens)", "shared-link open p50 / p95 (s) (opens)", "errors",
                           "generation alone → with visitors", "server CPU beyond the generation (s)",
                           "simulated visitors' CPU (s)", "server peak memory (MiB)", "load average"], rows)


LOAD_MODES = {None: "the page (gradio_client, before the static pages)", "app": "the page, as a browser",
              "static": "the static pages"}
# The class's targets on 2 cores: (the most visitors they apply to, what is asked); more visitors ask for the next set.
CLASS_TARGETS = (
    (50, {"page open p95 ≤ 1.5 s": lambda r: (r["page"]["p95_s"] or 0) <= 1.5,
          "gallery and link open p95 ≤ 1 s": lambda r: max(r["gallery"]["p95_s"] or 0, r["link"]["p95_s"] or 0) <= 1,
          "no error": lambda r: r["errors"] == 0 and not r["generation_error"],
          "generation ≤ 1.25× alone": lambda r: r["slowdown"] is not None and r["slowdown"] <= 0.25}),
    (200, {"no error": lambda r: r["errors"] == 0 and not r["generation_error"],
           "gallery open p95 ≤ 2 s": lambda r: (r["gallery"]["p95_s"] or 0) <= 2}),
)
MEMORY_FLAT = 0.10  # the server's peak memory may grow this much from the fewest visitors to the most


def class_holds(results_dir: Path) -> str:
    """What one 2-core Space holds, from the newest load file with both ways of reading (a quiet one first): per way
    of reading and N, the class targets it met, and the server's memory against the fewest visitors."""
    files = [p for p in (results_dir / MACHINE / "load").glob("*.json")
             if "modes" in json.loads(p.read_text())["settings"]]
    if not files:
        return "(no load file with the static pages yet: `python -m benchmarks load`)"
    path = max(files, key=lambda p: ("quiet" in p.name, p.stat().st_mtime))
    d = json.loads(path.read_text())
    rows = []
    for mode in d["settings"]["modes"]:
        mine = [r for r in d["rows"] if r["mode"] == mode]
        least = min(mine, key=lambda r: r["visitors"])["server_peak_rss_mb"]
        for r in mine:
            targets = next((t for most, t in CLASS_TARGETS if r["visitors"] <= most), CLASS_TARGETS[-1][1])
            missed = [name for name, met in targets.items() if not met(r)]
            grew = r["server_peak_rss_mb"] / least - 1
            rows.append([link(results_dir, path), LOAD_MODES[mode], str(r["visitors"]),
                         ("met: " if not missed else "missed: ") + ", ".join(missed or targets),
                         f"{num(r['server_peak_rss_mb'], 0)} ({pct(grew)}{'' if grew <= MEMORY_FLAT else ': missed'})",
                         num(r["load_average_before"][0], 1)])
    asked = "; ".join(f"up to {most} visitors: " + ", ".join(t) for most, t in CLASS_TARGETS)
    return (f"Targets on 2 cores ({asked}; server memory within {pct(MEMORY_FLAT)} of the fewest visitors'):\n\n"
            + markdown_table(["file", "visitors read", "visitors", "the targets for this many visitors",
                              "server peak memory, MiB (against the fewest visitors)", "load average"], rows))


GPU_CHECK_TABLES = {"engine": gpu_check_engine, "paper": gpu_check_paper, "compiled": gpu_check_compiled,
                    "coupling": gpu_check_coupling, "app": gpu_check_app}

TABLES: dict[str, Callable[[Path], str]] = {
    "headline": headline,
    "table1": table1,
    "counterfactual": partial(counterfactual, name="counterfactual.json"),
    "counterfactual-likelihood": partial(counterfactual, name="counterfactual_likelihood.json"),
    "efficiency": efficiency,
    "perplexity": perplexity,
    "memory": memory,
    "engine": engine,
    "signals": partial(signals, name="signals_alpaca20_hh20.json"),
    "signals-likelihood": partial(signals, name="signals_alpaca20_hh20_likelihood.json"),
    "tune": partial(tune, name="tune.json"),
    "tune-likelihood": partial(tune, name="tune_likelihood.json"),
    "app": partial(app_timing, folder="app"),
    "app-latest": partial(app_timing, folder="app", only=("app_auto_default.json", "app_fp32_eager_same_session.json")),
    "step": step,
    "ray": ray,
    "recorded-run": recorded_run,
    "ifeval": ifeval,
    "class-load": class_load,
    "class-holds": class_holds,
    **{f"gpu-check-{part}" + (f"-{key}" if key else ""): partial(GPU_CHECK_TABLES[part], folder=folder)
       for key, (folder, parts) in GPU_CHECKS.items() for part in parts},
    "machines": machines,
    "machines-readme": machines_readme,
    "machines-neighbour": machines_neighbour,
}
