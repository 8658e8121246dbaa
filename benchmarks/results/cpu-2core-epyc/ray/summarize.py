"""scaling.json from this folder's table1_*.json and runs.jsonl (written by run_sweep.sh):
per run, the sweep's wall seconds (prompts on the workers, without starting them), the workers'
start-up, the whole command's seconds and the load average; then k=2 against k=1 per round.
Run from the repository root: python benchmarks/results/cpu-2core-epyc/ray/summarize.py"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMING = {"bon_time", "sbon_time", "speedup", "bon_tok_per_s", "sbon_tok_per_s", "bon_timings", "sbon_timings",
          "sbon_reward_share", "bom_score"}  # bom_score: Best-of-M's M comes from the measured speedups


def results(tag: str) -> list[dict]:
    """A run's rows without their timings: what must not depend on where the prompts ran."""
    rows = json.loads((HERE / f"table1_{tag}.json").read_text())["rows"]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def run_record(tag: str, outer: dict) -> dict:
    r = json.loads((HERE / f"table1_{tag}.json").read_text())
    d = r["environment"].get("distributed")
    per_prompt = sum(row["bon_time"] + row["sbon_time"] for row in r["rows"])
    return {"tag": tag, "command": outer["command"], "workers": d["workers"] if d else 0,
            "prompts": len(r["rows"]), "sweep_s": d["sweeps"][0]["wall_s"] if d else per_prompt,
            "sweep_s_measure": "Ray: first prompt sent to last result in" if d else
                               "single process: sum of the prompts' Best-of-N + Speculative Rejection seconds",
            "startup_s": d["startup_s"] if d else None, "end_to_end_s": outer["end_to_end_s"],
            "per_prompt_run_s": per_prompt, "retried": d["retried"] if d else None,
            "load_average_before": outer["loadavg_before"], "load_average_after": outer["loadavg_after"],
            "load_average_in_file": r["environment"]["load_average"]}


def main() -> None:
    outer = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = [run_record(o["tag"], o) for o in outer if o["rc"] == 0]
    by_tag = {r["tag"]: r for r in runs}
    single = next(r["tag"] for r in runs if r["tag"].startswith("single"))
    for r in runs:
        r["rows_equal_single_process_but_timings"] = results(r["tag"]) == results(single)
    ratios = []
    for r in runs:
        if r["tag"].startswith("ray_k1_") and (k2 := by_tag.get("ray_k2_" + r["tag"][len("ray_k1_"):])):
            ratios.append({"round": r["tag"][len("ray_k1_"):], "sweep_k1_over_k2": r["sweep_s"] / k2["sweep_s"],
                           "end_to_end_k1_over_k2": r["end_to_end_s"] / k2["end_to_end_s"]})
    env = json.loads((HERE / f"table1_{runs[0]['tag']}.json").read_text())["environment"]
    (HERE / "scaling.json").write_text(json.dumps({
        "what": "table1 sweep (8 prompts, N=4, 32 new tokens, --no-best-of-m) on 1 and 2 Ray CPU workers of one "
                "thread each, and in one process of one thread; timings on 2 shared cores (other sessions' jobs "
                "were running: see the load averages)",
        "environment": env, "runs": runs, "speedup_k2_over_k1": ratios}, indent=1))
    for r in runs:
        print(f"{r['tag']:>14}: sweep {r['sweep_s']:7.1f} s, start-up {r['startup_s'] or 0:5.1f} s, "
              f"end to end {r['end_to_end_s']:7.1f} s, load {r['load_average_before']}, "
              f"same results as one process: {r['rows_equal_single_process_but_timings']}")
    for q in ratios:
        print(f"round {q['round']}: k=1/k=2 sweep {q['sweep_k1_over_k2']:.2f}x, end to end {q['end_to_end_k1_over_k2']:.2f}x")


if __name__ == "__main__":
    main()
