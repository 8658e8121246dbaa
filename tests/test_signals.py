"""Pruning signals see what the decode step computed, without a second forward pass."""

import pytest
import torch

from sbon.algorithms import best_of_n, run, speculative_bon_tau, speculative_rejection
from sbon.config import RunConfig
from sbon.errors import SBoNError
from sbon.results import RunResult
from sbon.signals import SIGNALS, PruningSignal
from sbon.rewards import CallableReward

PROMPT = "Give three tips for staying healthy."
CONSTANT = CallableReward(lambda prompt, responses: [0.0] * len(responses), name="constant")


@pytest.fixture(scope="module")
def gen(gen_fp32):
    """Float32 (tests/conftest.py): these tests hold signals to 1e-4 of a full recomputation, which
    bfloat16's prefill rounds differently from its decode step."""
    return gen_fp32


@pytest.fixture(scope="module")
def likelihood(likelihood_fp32):
    return likelihood_fp32


class LastHidden(PruningSignal):
    """A test signal that keeps each candidate's latest final-layer hidden state."""
    name = "last-hidden"
    needs_hidden = True

    def __init__(self):
        self.hidden = {}

    def observe(self, step):
        for k, h in zip(step.hidden_ids or [], step.hidden if step.hidden is not None else []):
            self.hidden[k] = h.clone()

    def score(self, prompt, candidate_ids, texts):
        return [float(self.hidden[k].norm()) for k in candidate_ids]


@pytest.fixture
def forward_calls(gen, monkeypatch) -> dict:
    """Counts the generator's forward passes: {"n": calls so far}."""
    calls = {"n": 0}
    forward = type(gen.model).forward

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(gen.model), "forward", counting)
    return calls


@pytest.fixture
def last_hidden(monkeypatch):
    signal = LastHidden()
    # SIGNALS holds classes: this one builds the test's instance, so the test can read what it saw.
    monkeypatch.setitem(SIGNALS, "last-hidden", type("LastHiddenHere", (LastHidden,),
                                                     {"build": classmethod(lambda cls, gen, reward: signal)}))
    return signal


def test_logprob_signal_equals_a_full_recomputation(gen):
    """Mean log-probability of each candidate's own tokens, accumulated step by step, equals the
    mean log-probability a full forward pass over prompt + prefix gives."""
    tau = 6
    result = run(speculative_bon_tau(gen, CONSTANT, PROMPT, 4, alpha=0.5, tau=tau, max_new_tokens=12, seed=5,
                                     prune_by="logprob"))
    [point] = result.decision_points
    assert point.signal == "logprob"
    prompt_ids = gen.encode_prompt(PROMPT)
    live = [k for k in point.contenders if k not in point.final]
    full = gen.mean_logprob(prompt_ids, [result.candidates[k].token_ids[:tau] for k in live])
    assert [result.candidates[k].partial_reward_at(1) for k in live] == pytest.approx(full, abs=1e-4)


def test_hidden_states_come_from_the_decode_step(gen, last_hidden, forward_calls):
    """A signal that asks for hidden states gets, at the decision point, the same state a full forward
    pass over prompt + prefix computes; no extra forward pass runs, and the candidates do not change."""
    calls = forward_calls
    tau = 5
    with_hidden = run(speculative_bon_tau(gen, CONSTANT, PROMPT, 4, alpha=0.5, tau=tau, max_new_tokens=10, seed=7,
                                          prune_by="last-hidden"))
    # One prefill, then one forward per step that leaves someone generating: the hidden states rode along.
    assert calls["n"] == max(c.tokens_generated for c in with_hidden.candidates)
    bon = run(best_of_n(gen, CONSTANT, PROMPT, 4, max_new_tokens=10, seed=7))
    assert all(c.token_ids == bon.candidates[c.id].token_ids[:c.tokens_generated] for c in with_hidden.candidates)

    [point] = with_hidden.decision_points
    k = point.pruned[0]  # halted at tau: its last state is the one the decision saw
    ids = torch.tensor([gen.encode_prompt(PROMPT) + with_hidden.candidates[k].token_ids[:tau]])
    with torch.inference_mode():
        full = gen.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
    assert torch.allclose(last_hidden.hidden[k], full, atol=1e-4)


def test_unknown_signal_fails_in_one_line():
    with pytest.raises(SBoNError, match="unknown pruning signal 'nope'"):
        RunConfig(prune_by="nope").validate()
    RunConfig(method="bon", prune_by="nope").validate()  # Best-of-N prunes nothing: no signal to check


# -- the reward-free signals: streaming scores equal a full recomputation -----------------------

from sbon.analysis.signal_matrix import signal_grid, signal_scores  # noqa: E402

TAU = 6


@pytest.fixture(scope="module")
def watched(gen):
    """Best-of-4 (seed 3) with every reward-free signal watching, scored at TAU tokens."""
    config = RunConfig(method="bon", n=4, max_new_tokens=12, seed=3)
    return signal_scores(gen, CONSTANT, PROMPT, config, ["logprob", "deepconf", "self-certainty", "consistency"],
                         [TAU])


def full_pass(gen, bon, k, t):
    """Logits predicting tokens 1..t and final-layer states after tokens 1..t, from one forward pass
    over prompt + prefix."""
    prompt_ids = gen.encode_prompt(PROMPT)
    ids = torch.tensor([prompt_ids + bon.candidates[k].token_ids[:t]])
    with torch.inference_mode():
        out = gen.model(input_ids=ids, output_hidden_states=True)
    p = len(prompt_ids)
    return out.logits[0, p - 1:p - 1 + t].float(), out.hidden_states[-1][0, p:p + t].float()


def live_at(scores, t):
    return [k for k, s in enumerate(scores["logprob"][t]) if s is not None]


def test_deepconf_and_self_certainty_equal_a_full_recomputation(gen, watched):
    bon, scores = watched
    live = live_at(scores, TAU)
    assert len(live) >= 2
    for k in live:
        logits, _ = full_pass(gen, bon, k, TAU)
        logprobs = torch.log_softmax(logits, -1)
        confidence = -logprobs.topk(20, -1).values.mean(-1)  # DeepConf token confidence, k = 20
        # The window (16) is longer than TAU: no full window yet, so the score is the warm-up mean so far.
        assert scores["deepconf"][TAU][k] == pytest.approx(float(confidence.mean()), abs=1e-3)
        kl = (-torch.log(torch.tensor(float(logits.shape[-1]))) - logprobs.mean(-1)).mean()
        assert scores["self-certainty"][TAU][k] == pytest.approx(float(kl), abs=1e-3)
    # Different candidates get different scores: the signal reads each one's own distribution.
    assert len({round(scores["self-certainty"][TAU][k], 4) for k in live}) == len(live)


def test_deepconf_window_slides(gen):
    """The lowest group is the worst mean over FULL windows: the uncertain first token alone (a group
    of one) does not fix the score, as it did when partial windows counted; before the first full
    window the score is the mean so far."""
    from sbon.signals import LowestGroupConfidence, Step

    logits = ([0.0, 0.0, 0.0], [9.0, 0.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    conf = [-torch.log_softmax(torch.tensor(l), -1).topk(2).values.mean().item() for l in logits]
    assert conf[0] < conf[1]  # the flat distribution is the unconfident one
    signal = LowestGroupConfidence(k=2, window=2)
    seen = []
    for logit in logits:
        signal.observe(Step([0], torch.tensor([0]), torch.tensor([logit])))
        seen.append(signal.score("", [0], None)[0])
    assert seen[0] == pytest.approx(conf[0])  # warm-up: mean so far
    windows = [(conf[0] + conf[1]) / 2, (conf[1] + conf[2]) / 2, (conf[2] + conf[3]) / 2]
    assert seen[1:] == pytest.approx([min(windows[:1]), min(windows[:2]), min(windows)])
    assert seen[-1] > conf[0]  # the old partial-window minimum would have been conf[0]


def test_consistency_equals_a_full_recomputation(gen, watched):
    bon, scores = watched
    live = live_at(scores, TAU)
    means = torch.stack([full_pass(gen, bon, k, TAU)[1].mean(0) for k in live])
    unit = torch.nn.functional.normalize(means, dim=-1)
    sim = unit @ unit.T
    expected = ((sim.sum(-1) - sim.diagonal()) / (len(live) - 1)).tolist()
    assert [scores["consistency"][TAU][k] for k in live] == pytest.approx(expected, abs=1e-3)


def test_watching_signals_changes_nothing(gen, watched):
    """Observers see the step, they do not steer it: the candidates are Best-of-N's."""
    bon, _ = watched
    plain = run(best_of_n(gen, CONSTANT, PROMPT, 4, max_new_tokens=12, seed=3))
    assert [c.token_ids for c in bon.candidates] == [c.token_ids for c in plain.candidates]


def test_reward_free_signals_prune_without_an_extra_forward_pass(gen, forward_calls):
    calls = forward_calls
    for name in ("deepconf", "self-certainty", "consistency"):
        calls["n"] = 0
        result = run(speculative_bon_tau(gen, CONSTANT, PROMPT, 4, alpha=0.5, tau=4, max_new_tokens=8, seed=2,
                                         prune_by=name))
        assert result.decision_points[0].signal == name
        assert calls["n"] == max(c.tokens_generated for c in result.candidates)


def test_the_matrix_on_two_prompts(gen):
    """signal x t x alpha on 2 prompts x N = 8 with a real reward: the reward signal is the partial
    reward, winner kept is 0 or 1, alpha = 0 keeps everything (score 100, token rate 1)."""
    from sbon.models import load_reward

    reward = load_reward("likelihood", generator=gen)
    for prompt in (PROMPT, "Name a color."):
        config = RunConfig(method="bon", n=8, max_new_tokens=16, seed=1)
        bon, scores = signal_scores(gen, reward, prompt, config, ["reward", "deepconf"], [4, 8])
        grid = signal_grid(bon, scores, [0.0, 0.5])
        assert set(grid["signal"]) == {"reward", "deepconf"}
        assert set(grid["winner_kept"]) <= {0.0, 1.0}
        keep_all = grid[grid["alpha"] == 0.0]
        assert (keep_all["normalized_score"] == 100).all() and (keep_all["token_rate"] == 1).all()
        half = grid[grid["alpha"] == 0.5]
        assert (half["token_rate"] < 1).all()
        live = [k for k, s in enumerate(scores["reward"][4]) if s is not None]
        prefix = [gen.decode(bon.candidates[k].token_ids[:4]) for k in live]
        assert [scores["reward"][4][k] for k in live] == pytest.approx(reward.score(prompt, prefix), abs=1e-4)


def test_signals_benchmark_and_tune_from_its_raw_file(gen, likelihood, tmp_path):
    """The benchmark's raw records recompute without a model, and tune picks the cheapest (t, alpha)
    that keeps the floor, in a JSON whose run_config names it. An extra final reward is recorded per
    candidate and the matrix can be read against it."""
    import json

    from benchmarks import signals_compared as bench
    from benchmarks.__main__ import main

    prompts = [{"id": 0, "set": "alpaca_eval", "instruction": PROMPT}, {"id": 1, "set": "hh", "instruction": "Name a color."}]
    raw = bench.generate(gen, CONSTANT, prompts, ["logprob", "deepconf"], [4, 8], n=4, max_new_tokens=12, quiet=True,
                         extra_rewards={"likelihood": likelihood})
    for rec, p in zip(raw, prompts):
        texts = [c["text"] for c in rec["bon"]["candidates"]]
        assert rec["final_rewards"]["likelihood"] == pytest.approx(likelihood.score(p["instruction"], texts))
    path = tmp_path / "signals_raw.json"
    path.write_text(json.dumps({"experiment": "signals_raw", "settings": {"n": 4, "k": 1, "hh_k": 1, "offset": 0,
                                                                        "max_new_tokens": 12, "generator": "smollm2-135m",
                                                                        "reward": "constant"},
                                "environment": {}, "raw": raw}))
    assert main(["signals", "--from", str(path), "--out-dir", str(tmp_path), "--no-plot", "--alphas", "0.5"]) == 0
    matrix = json.loads((tmp_path / "signals.json").read_text())["matrix"]
    # A constant final reward: every cut keeps a response as good as Best-of-N's (score 100).
    assert {(r["signal"], r["tau"]) for r in matrix} >= {("logprob", 4), ("deepconf", 8), ("random", 4)}
    assert all(r["normalized_score"] == 100 for r in matrix)
    # Read against the likelihood: its winner is the likelihood's best, and not every cut keeps it.
    per = bench.per_prompt(raw, [0.5], final_reward="likelihood")
    assert per["normalized_score"].between(0, 100).all() and (per["normalized_score"] < 100).any()
    lik = bench.with_final_reward(RunResult.from_dict(raw[0]["bon"]), raw[0]["final_rewards"]["likelihood"])
    assert lik.best_id == max(range(4), key=lambda k: raw[0]["final_rewards"]["likelihood"][k])
    assert main(["tune", "--from", str(path), "--final-reward", "likelihood", "--out", str(tmp_path / "t.json")]) == 0
    assert json.loads((tmp_path / "t.json").read_text())["reward"] == "likelihood"
    assert main(["tune", "--from", str(path), "--out", str(tmp_path / "tune.json")]) == 0
    tuned = json.loads((tmp_path / "tune.json").read_text())
    best = tuned["best"]
    assert best["normalized_score"] >= 98 and best["token_rate"] == min(r["token_rate"] for r in tuned["grid"])
    assert tuned["run_config"]["tau"] == best["tau"] and tuned["run_config"]["prune_by"] == best["signal"]


def test_value_head_signal_equals_the_head_on_a_full_recomputation(gen, likelihood):
    """The value-head signal's partial reward of a pruned candidate, built step by step from the decode
    step's hidden states and log-probabilities, equals the head applied to features recomputed by one full
    forward pass over prompt + prefix."""
    from sbon.value_head import ValueHead, prefix_features

    tau = 6
    result = run(speculative_bon_tau(gen, likelihood, PROMPT, 4, alpha=0.5, tau=tau, max_new_tokens=12, seed=4,
                                     prune_by="value-head"))
    [point] = result.decision_points
    assert point.signal == "value-head" and point.pruned
    head, _ = ValueHead.load("smollm2_value_likelihood")
    prompt_ids = gen.encode_prompt(PROMPT)
    for k in point.pruned:
        ids = torch.tensor([prompt_ids + result.candidates[k].token_ids[:tau]])
        with torch.inference_mode():
            out = gen.model(input_ids=ids, output_hidden_states=True)
        start = len(prompt_ids)
        hidden = out.hidden_states[-1][0, start:start + tau]
        logprobs = torch.log_softmax(out.logits[0, start - 1:start + tau - 1].float(), -1).gather(
            -1, ids[0, start:start + tau].view(-1, 1)).squeeze(-1)
        expected = float(head.score(prefix_features(hidden, logprobs)[None])[0])
        assert result.candidates[k].partial_reward_at(1) == pytest.approx(expected, abs=1e-3)


def test_pruning_by_the_value_head_keeps_coupled_sampling(gen, likelihood):
    """Survivor k of a run pruned by the value head is Best-of-N's candidate k, token for token."""
    result = run(speculative_rejection(gen, likelihood, PROMPT, 6, alpha=0.5, first_decision=4, max_new_tokens=16,
                                       seed=5, prune_by="value-head"))
    bon = run(best_of_n(gen, likelihood, PROMPT, 6, max_new_tokens=16, seed=5))
    assert result.decision_points and all(p.signal == "value-head" for p in result.decision_points)
    for c in result.candidates:
        assert c.token_ids == bon.candidates[c.id].token_ids[:len(c.token_ids)]
    assert result.best.token_ids == bon.candidates[result.best_id].token_ids


WATCHING = [name for name, cls in SIGNALS.items() if cls.observe is not PruningSignal.observe]


@pytest.mark.parametrize("name", WATCHING)
def test_observing_steps_reads_nothing_back_until_a_score_is_asked(name, gen):
    """On a GPU, reading a device tensor on the host is a sync that stalls the decode steps queued behind it: a
    signal that watches every step keeps what it saw on the device and reads it back when it scores. Here the
    steps live on torch's meta device, which holds no numbers: any read fails. The rows change midway, as when
    candidates finish."""
    from sbon.signals import Step, make_signal

    signal = make_signal(name, gen, CONSTANT)
    vocab, width = gen.model.config.vocab_size, gen.model.config.hidden_size
    for ids, hidden_ids in (([0, 1, 2], [0, 1, 2]), ([0, 1, 2], [0, 2]), ([0, 2], [0, 2])):
        signal.observe(Step(ids, torch.zeros(len(ids), dtype=torch.long, device="meta"),
                            torch.empty(len(ids), vocab, device="meta"),
                            torch.empty(len(hidden_ids), width, device="meta"), hidden_ids))
    with pytest.raises((NotImplementedError, RuntimeError)):  # the read it had put off
        signal.score(PROMPT, [0, 2], None)
