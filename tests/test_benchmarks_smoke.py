"""Smoke tests of the benchmark scripts: every experiment on 2 prompts with tiny settings.

They check that the scripts run end to end and write sane result files, not the numbers
(timings on a shared CI machine mean nothing); the real runs are `python -m benchmarks ...`.
"""

import json
import os
import statistics
import time
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import common, counterfactual, efficiency, engine_vs_generate, memory, perplexity, table1
from benchmarks.__main__ import build_parser, main
from sbon.metrics import compute_at_score

N, TOKENS = 4, 12


@pytest.fixture(scope="module")
def prompts():
    """The first two benchmark prompts, from the prompt set shipped in benchmarks/data."""
    return common.load_prompts(2)


@pytest.fixture(scope="module")
def short(prompts):
    """The first benchmark prompt with a short instruction, for the benchmarks that need more new tokens than the
    prompt has tokens (at batch size 1 the steps are many and slow, one per token)."""
    return [{**prompts[0], "instruction": "Name a colour."}]


def test_parser_knows_every_experiment():
    parser = build_parser()
    for name in ("table1", "counterfactual", "memory", "engine"):
        args = parser.parse_args([name])
        assert args.experiment == name and args.n == 32 and args.max_new_tokens == 256
        assert args.protocol == "workshop"
    assert parser.parse_args(["table1"]).k == 20
    args = parser.parse_args(["efficiency"])
    assert (args.protocol, args.n, args.b, args.max_new_tokens, args.k, args.alphas) == ("neurips", 8, 4, 128, 20, [0.5])
    args = parser.parse_args(["perplexity"])
    assert (args.protocol, args.n, args.b, args.max_new_tokens, args.k, args.alphas) == ("neurips", 4, 2, 96, 8, [0.5, 0.75])
    assert parser.parse_args(["perplexity"]).reward == "neg-perplexity"


def parsed(argv):
    args = build_parser().parse_args(argv)
    common.apply_protocol(args)
    return args


def test_protocol_sets_sampling_and_prompt_order_and_is_recorded(gen, prompts):
    workshop = parsed(["table1"])
    assert (workshop.temperature, workshop.top_p, workshop.top_k, workshop.prompt_order) == (0.8, 0.95, 0, "first")
    neurips = parsed(["table1", "--protocol", "neurips"])
    assert (neurips.temperature, neurips.top_p, neurips.top_k, neurips.prompt_order) == (1.0, 1.0, 50, "random")
    record = common.base_settings(neurips, gen, None, prompts)["protocol"]
    assert record["name"] == "neurips" and record["top_k"] == 50 and record["overridden"] == {}
    # an explicit option wins over the protocol, and the result file says so
    mixed = parsed(["efficiency", "--temperature", "0.7", "--prompt-order", "first"])
    assert mixed.temperature == 0.7 and mixed.top_k == 50 and mixed.prompt_order == "first"
    settings = common.base_settings(mixed, gen, None, prompts)
    assert settings["protocol"]["overridden"] == {"temperature": 0.7, "prompt_order": "first"}
    assert settings["temperature"] == 0.7 and settings["prompt_ids"] == [0, 1]


def test_random_prompt_order_is_a_seeded_draw(tmp_path):
    rows = [{"id": i, "dataset": "t", "instruction": f"prompt {i}"} for i in range(50)]
    (tmp_path / common.PROMPTS_FILE).write_text("\n".join(json.dumps(r) for r in rows))
    first = common.load_prompts(5, tmp_path)
    assert [p["id"] for p in first] == [0, 1, 2, 3, 4]
    drawn = [p["id"] for p in common.load_prompts(5, tmp_path, order="random", seed=0)]
    assert drawn == [p["id"] for p in common.load_prompts(5, tmp_path, order="random", seed=0)]
    assert drawn != [0, 1, 2, 3, 4] and len(set(drawn)) == 5
    assert drawn != [p["id"] for p in common.load_prompts(5, tmp_path, order="random", seed=1)]
    # the offset continues the same draw
    assert [p["id"] for p in common.load_prompts(3, tmp_path, order="random", seed=0, offset=2)] == drawn[2:5]


def test_table1(gen, likelihood, prompts, tmp_path):
    result = table1.run_table1(gen, likelihood, prompts, n=N, max_new_tokens=TOKENS, first_decision=4, quiet=True)
    rows, s = result["rows"], result["summary"]
    assert len(rows) == 2
    for r in rows:
        assert r["decision_points"] >= 1, "a budget of 4 tokens per candidate must force a decision"
        # Coupled sampling: SR returns one of Best-of-N's candidates, so it scores 100 exactly when it kept
        # Best-of-N's best reward; Best-of-M's candidates are Best-of-N's first M, never above its best.
        assert (r["sbon_score"] == 100) == (abs(r["sbon_best"] - r["bon_best"]) <= 1e-4 * max(1.0, abs(r["bon_best"])))
        assert r["bom_score"] <= 100
        assert r["sbon_tokens"] < r["bon_tokens"] and r["bon_time"] > 0 and r["bom_time"] > 0
        assert r["bom_run_agrees"], "coupled sampling: a real Best-of-M run writes Best-of-N's first M texts"
    assert 1 <= s["best_of_m"] <= N and set(result["targets"])
    # the speedup is Best-of-N's time over SR's, not the other way round
    assert s["speedup"]["median"] == pytest.approx(statistics.median(r["bon_time"] / r["sbon_time"] for r in rows))
    assert len(table1.methods_table(result, N)) == 3 and len(table1.prompts_table(result)) == 2
    path = common.write_json({"environment": common.environment(gen), **result}, tmp_path / "t.json")
    saved = json.loads(path.read_text())
    assert saved["environment"]["torch_threads"] >= 1 and saved["environment"]["cpu_model"]
    assert common.write_plot(table1.plot(result, N), tmp_path / "t.html").stat().st_size > 0


def test_table1_memory_bound_best_of_n_batch(gen, prompts):
    from sbon.algorithms import FIRST_DECISION_TOKENS

    text = prompts[0]["instruction"]
    p = len(gen.encode_prompt(text))
    kw = dict(method="sbon", first_decision=None, kv_budget=None, max_new_tokens=256)
    assert table1.bon_batch_size(gen, text, 32, "all", **kw) == 32
    assert table1.bon_batch_size(gen, text, 32, "budget", **kw) == 32 * (p + FIRST_DECISION_TOKENS) // (p + 256)
    assert table1.bon_batch_size(gen, text, 32, "budget", **{**kw, "kv_budget": 32 * (p + 256)}) == 32
    assert table1.bon_batch_size(gen, text, 32, "budget", **{**kw, "first_decision": 128}) == 32 * (p + 128) // (p + 256)


def test_counterfactual_and_recompute_from_file(gen, likelihood, prompts, tmp_path):
    raw = counterfactual.generate(gen, likelihood, prompts, n=N, max_new_tokens=TOKENS, taus=[4, 8], quiet=True)
    assert len(raw) == 2 and set(raw[0]["partials"]) == {"4", "8"}
    result = counterfactual.analyze(raw, alphas=[0.5, 0.75], bootstrap=3)
    grid = pd.DataFrame(result["grid"])
    assert len(grid) == 4 and grid["normalized_score"].between(0, 100).all()
    assert (grid["token_rate"] <= 1 + 1e-9).all() and "normalized_score_boot_lo" in grid
    assert common.write_plot(counterfactual.plot(result, N), tmp_path / "c.html").stat().st_size > 0
    # --from recomputes the grid from the saved raw candidates, without a model
    saved = tmp_path / "counterfactual_raw.json"
    common.write_json({"settings": {"n": N}, "environment": {}, "raw": raw}, saved)
    assert main(["counterfactual", "--from", str(saved), "--alphas", "0.5", "0.9", "--bootstrap", "2",
                 "--out-dir", str(tmp_path), "--tag", "re", "--no-plot"]) == 0
    again = json.loads((tmp_path / "counterfactual_re.json").read_text())
    assert len(again["grid"]) == 4 and again["settings"]["alphas"] == [0.5, 0.9]


def test_memory(gen, likelihood, short, tmp_path):
    # 2B candidates must fit in B x (prompt + new tokens) at their first token: new tokens > prompt
    tokens = len(gen.encode_prompt(short[0]["instruction"])) + 4
    result = memory.run_memory(gen, likelihood, short, b=1, factor=2, max_new_tokens=tokens, quiet=True)
    assert result["sizes"] == [1, 2] and not result["summary"]["skipped_prompts"]
    for r in result["rows"]:
        assert r["bo1_time"] <= r["bo2_time"] and r["bo1_reward"] <= r["bo2_reward"]
        assert 1 <= r["equivalent_n"] <= 2 and r["sbon_time"] > 0 and r["sbon_decision_points"] >= 1
    assert len(memory.curve_table(result, 1, 2)) == 3
    assert common.write_plot(memory.plot(result, 1, 2), tmp_path / "m.html").stat().st_size > 0


@pytest.fixture(scope="module")
def neg_perplexity(gen):
    from sbon.models import load_reward
    return load_reward("neg-perplexity", generator=gen)


@pytest.fixture(scope="module")
def small_efficiency(gen, neg_perplexity, short):
    """Best-of-1 and Best-of-2 on two accelerators vs Speculative Rejection from 2 in the budget of 1
    complete candidate, scored by the perplexity benchmark's reward: one run serves both benchmarks' tests (the
    efficiency one holds for any reward)."""
    tokens = len(gen.encode_prompt(short[0]["instruction"])) + 4  # 2 (p + 1) <= 1 (p + tokens)
    return efficiency.run_efficiency(gen, neg_perplexity, short, b=1, n=2, alphas=[0.5], max_new_tokens=tokens,
                                     quiet=True)


def test_efficiency(gen, neg_perplexity, small_efficiency, short, tmp_path):
    result = small_efficiency
    (row,) = result["rows"]
    s = result["summary"]
    assert len(row["batch_s"]) == 2 and all(t > 0 for t in row["batch_s"]) and not result["skipped_prompts"]
    bo1, bo2 = s["bon"]
    assert bo1["score"] == 100 and bo1["relative_compute"] == 1 and bo2["score"] >= 100
    assert bo2["relative_compute"] >= 2, "two accelerators, each held for the slower batch"
    (sb,) = s["sbon"]
    assert sb["score"] <= bo2["score"], "coupled: Speculative Rejection's candidates are Best-of-2's"
    assert sb["relative_compute"] == pytest.approx(row["sbon"][0.5]["wall_s"] / row["batch_s"][0])
    assert sb["compute_ratio"] == pytest.approx(sb["bon_compute_at_equal_score"] / sb["relative_compute"])
    assert len(row["batch_steps"]) == 2 and bo1["relative_steps"] == 1 and bo2["relative_steps"] >= 2
    assert sb["step_ratio"] == pytest.approx(compute_at_score([1, bo2["relative_steps"]], [100, bo2["score"]],
                                                              sb["score"])[0] / sb["relative_steps"])
    assert result["complete"] and len(efficiency.curve_table(result)) == 3
    assert common.write_plot(efficiency.plot(result, 1), tmp_path / "f.html").stat().st_size > 0
    assert efficiency.longest_prompt(4, 16, 160) == 52 and efficiency.longest_prompt(4, 32, 128) == 17
    # --bon-from: Best-of-N's numbers come back from the file, Speculative Rejection runs again, same candidates
    path = common.write_json({"settings": {}, **result}, tmp_path / "efficiency.json")
    _, saved = efficiency.saved_rows(str(path))
    tokens = row["kv_budget"] - row["prompt_tokens"]
    again = efficiency.run_efficiency(gen, neg_perplexity, short, b=1, n=2, alphas=[0.5], max_new_tokens=tokens,
                                      quiet=True, saved=saved)
    assert again["summary"]["bon"] == s["bon"] and again["rows"][0]["batch_s"] == row["batch_s"]
    assert again["rows"][0]["sbon"][0.5]["best"] == row["sbon"][0.5]["best"]


def test_perplexity(small_efficiency):
    table = perplexity.perplexity_table(small_efficiency).set_index("method")
    assert (table["perplexity"] >= 1).all()
    assert table.loc["Best-of-2", "perplexity"] <= table.loc["Best-of-1", "perplexity"]
    assert len(table) == 3 and table["compute_ratio_at_equal_perplexity"].iloc[2] > 0


def test_engine(gen, likelihood, prompts, tmp_path):
    result = engine_vs_generate.run_engine(gen, likelihood, prompts[:1], n=N, max_new_tokens=TOKENS, quiet=True)
    assert len(result["rows"]) == 1
    s = result["summary"]
    for r in result["rows"]:
        assert 0 < r["ours_tokens"] <= N * TOKENS and 0 < r["hf_tokens"] <= N * TOKENS
        assert 0 <= r["sbon_reward_share"] < 1
    assert s["ours_tok_per_s"] > 0 and s["hf_tok_per_s"] > 0 and len(result["targets"]) == 2
    assert common.write_plot(engine_vs_generate.plot(result), tmp_path / "e.html").stat().st_size > 0


def test_the_engine_comparison_times_our_run_as_it_times_generate(gen, monkeypatch):
    """Our run is timed from its start to its result, as generate is: the garbage collection a timed run starts
    with (a fifth of a second in a process that holds a model) is not counted against the engine."""
    import gc

    from sbon.engine import SamplingConfig

    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: (time.sleep(2), collect(*args))[1])
    m = engine_vs_generate.ours(gen, "Say hello.", 2, 4, SamplingConfig(), seed=0)
    assert 0 < m["time"] < 2 and m["tokens"] > 0, m


def test_peak_rss_sees_torch_allocations():
    # In a fresh process: after the model-heavy tests above, the allocator may hand back pages
    # that are already resident, and then RSS rightly does not grow (CI saw exactly that).
    import subprocess
    import sys

    code = (
        "import time, torch\n"
        "from benchmarks import common\n"
        "with common.PeakRSS() as mem:\n"
        "    x = torch.ones(64 * 2**20 // 4)  # 64 MiB\n"
        "    time.sleep(0.3)  # hold it for many sampling intervals: busy cores delay the sampler\n"
        "    del x\n"
        "print(mem.growth)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert int(out.stdout.split()[-1]) >= 32 * 2**20


def test_ifeval_runs_every_method_and_checks_each_answer(tmp_path):
    """`python -m benchmarks ifeval` on one evaluation prompt: every method's answer is checked by the prompt's
    instructions, the rounds run took its decision point where the budget filled, and the file says so."""
    assert main(["ifeval", "--k", "1", "--n", "4", "--max-new-tokens", "12", "--tau", "4", "--threads", "1",
                 "--out-dir", str(tmp_path), "--quiet"]) == 0
    saved = json.loads((tmp_path / "ifeval.json").read_text())
    (row,) = saved["rows"]
    assert row["key"] % 2 == 0  # the evaluation split
    methods = ("one sample", "Best-of-N", "SR rounds", "SR tau", "Best-of-M (equal time)")
    for method in methods:
        assert 0 <= row[method]["instruction_accuracy"] <= 1 and 0 < row[method]["token_rate"] <= 1
    assert row["Best-of-N"]["token_rate"] == 1 and row["SR tau"]["decision_tokens"] in ([4], [])
    assert set(row["by_type"]) <= set(row["instructions"])
    if row["SR rounds"]["decision_points"]:  # the reward's cut lies within what any cut there could spend
        cut = row["SR rounds"]["one_cut_token_rate"]
        assert cut["lowest"] - 1e-9 <= cut["reward"] <= cut["highest"] + 1e-9 <= 1 + 2e-9
        pairs, alike = row["SR rounds"]["settled_alike_pairs_first"]
        assert 0 <= alike <= pairs
    (summary,) = saved["summary"].values()
    assert summary["prompts"] == 1 and tuple(summary["methods"]) == methods


def test_ifeval_refuses_another_reward():
    assert main(["ifeval", "--reward", "likelihood", "--k", "1"]) == 2


def test_step_times_every_format_with_both_attentions_and_reports_the_ratios(tmp_path):
    """`python -m benchmarks step`, tiny: every (format, attention) column is timed, the ratios name the
    fp32 + SDPA baseline, the int4 format's Linear time counts its 4-bit layers, and the divergence check finds the
    padded formats exact."""
    from benchmarks import step

    argv = ["step", "--rows", "1", "3", "--formats", "fp32", "int4", "--attentions", "sbon_decode", "sdpa",
            "--compiled", "--steps", "1", "--warm-steps", "1",
            "--repeats", "1", "--threads", "1", "--no-llama-cpp", "--divergence-n", "4", "--divergence-split", "3",
            "--divergence-tokens", "6", "--divergence-prompts", "1", "--matmul-size", "256", "--out-dir", str(tmp_path),
            "--quiet"]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "step.json").read_text())
    # the command this call ran, not the test runner's own arguments (sys.argv)
    assert saved["command"].endswith("python -m benchmarks " + " ".join(argv))
    columns = {(r["format"], r["rows"]) for r in saved["table"]}
    assert columns == {(f"{fmt} {attn}", rows) for fmt in ("fp32", "int4") for attn in ("decode-attn", "sdpa")
                       for rows in (1, 3)}
    assert all(r["ms_per_step"] > 0 and r["linear_ms"] > 0 for r in saved["table"])
    assert {name: d["rate"] for name, d in saved["divergence"].items()} == {"fp32": 0.0, "int4": 0.0}
    # a quarter of the bytes: 4-bit weights and their scales, the LM head in bf16 (counted once with the embedding)
    mb = {r["format"].split()[0]: r["weights_mb"] for r in saved["table"]}
    assert 0.2 < mb["int4"] / mb["fp32"] < 0.35
    lines = step.speedups(saved["table"], rows=3)
    assert len(lines) == 4 and all(step.BASELINE in line for line in lines)


def test_the_app_benchmark_reads_the_decode_path_from_the_status_line_s_own_words():
    from benchmarks.app_timing import decoded_with
    from components import runs
    from sbon.results import RunResult

    for weights in ("fp32", "int4-bf16dot", None):
        for path in ("compiled", "eager"):
            run = RunResult(method="sbon", prompt="Hi", generator="smollm2-135m", reward="minilm-pref", settings={},
                            prompt_tokens=1, candidates=[], weights=weights, decode=path)
            words = runs.decoded(run)
            assert decoded_with(f"Done in 11.2 s from the click; first decision point drawn after 1.4 s; {words}; "
                                "every view ready after 12.8 s") == path, words
    assert decoded_with("Done in 11.2 s from the click") is None
