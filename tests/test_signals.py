"""Pruning signals see what the decode step computed, without a second forward pass."""

import pytest
import torch

from sbon.algorithms import best_of_n, run, speculative_bon_tau
from sbon.config import RunConfig
from sbon.errors import SBoNError
from sbon.signals import SIGNALS, PruningSignal
from sbon.rewards import CallableReward

PROMPT = "Give three tips for staying healthy."
CONSTANT = CallableReward(lambda prompt, responses: [0.0] * len(responses), name="constant")


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
def last_hidden(monkeypatch):
    signal = LastHidden()
    monkeypatch.setitem(SIGNALS, "last-hidden", lambda gen, reward: signal)
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


def test_hidden_states_come_from_the_decode_step(gen, last_hidden, monkeypatch):
    """A signal that asks for hidden states gets, at the decision point, the same state a full forward
    pass over prompt + prefix computes; no extra forward pass runs, and the candidates do not change."""
    calls = {"n": 0}
    forward = type(gen.model).forward

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(gen.model), "forward", counting)
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
