"""Decoding in chunks (``RunConfig.decode_chunk``) on the real embedded model: the tokens of a chunk stay on the
device and finished candidates leave once per chunk, yet every method gives the same candidates, the same
decision points, the same events and shows its signals the same steps as a decode that checks after every
token; the uniforms gathered on the device give today's tokens (the compiled step in chunks: tests/test_compiled_step.py).
(The scripted traces of tests/test_cut.py check the decision tokens against the official rule with chunks.)

The suite's generator (``gen``, tests/conftest.py) is exact on one thread: a row's logits do not depend on its batch,
which is what makes a chunked run -- finished rows stay in the batch until the chunk ends -- the same run."""

import pytest
import torch

from sbon.algorithms import CandidateFinished, DecisionTaken, Done, RunConfig, events
from sbon.analysis.signal_matrix import signal_scores
from sbon.cli import build_parser, run_config
from sbon.engine import coupled_uniforms, sample
from sbon.errors import SBoNError
from sbon.machine import on_threads
from sbon.rewards import CallableReward
from sbon.signals import PruningSignal

PROMPT = "Answer with one word: what colour is the sky?"  # some candidates stop early, at different lengths
N, TOKENS, SEEDS, CHUNKS = 6, 12, (0, 1), (1, 4, 7)
# A reward that needs no model: deterministic, and different for different texts.
REWARD = CallableReward(lambda prompt, responses: [float(sum(map(ord, r)) % 101) for r in responses], name="text-sum")
METHODS = {
    "bon": dict(method="bon"),
    # alpha 0.2 prunes one candidate per round: decision points at several lengths, a chunk stopped before each
    "sbon": dict(method="sbon", alpha=0.2, first_decision=3, prune_by="consistency"),
    "sbon-tau": dict(method="sbon-tau", alpha=0.5, tau=5),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """This module's runs on one thread, on which the suite's generator is exact, whether or not pytest-xdist gives
    each process one."""
    with on_threads(1):
        yield


class Recorder(PruningSignal):
    """Watches every decode step and keeps what it saw (hidden states included)."""
    needs_hidden = True

    def __init__(self):
        self.steps = []

    def observe(self, step):
        self.steps.append(step)

    def score(self, prompt, candidate_ids, texts):
        return [0.0] * len(candidate_ids)


@pytest.fixture(scope="module")
def trace(gen):
    """trace(method, seed, chunk) -> (events, observed Steps), each run once."""
    runs = {}

    def get(method, seed, chunk):
        if (method, seed, chunk) not in runs:
            recorder = Recorder()
            config = RunConfig(**METHODS[method], n=N, max_new_tokens=TOKENS, seed=seed, decode_chunk=chunk)
            runs[method, seed, chunk] = list(events(gen, REWARD, PROMPT, config, observers=[recorder])), recorder.steps
        return runs[method, seed, chunk]
    return get


def same_steps(a, b) -> bool:
    fields = ("candidate_ids", "tokens", "logits", "hidden", "hidden_ids")
    return len(a) == len(b) and all(_same(getattr(x, f), getattr(y, f)) for x, y in zip(a, b) for f in fields)


def _same(x, y) -> bool:
    return torch.equal(x, y) if torch.is_tensor(x) and torch.is_tensor(y) else x == y


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("seed", SEEDS)
def test_chunks_give_the_same_run(trace, method, seed):
    """Chunks of 4 and 7 tokens: the same events step by step (tokens, finishes, scores, decision points), the
    same candidates (tokens, stop reasons, rounds pruned in), and the same Steps seen by the signals."""
    plain, seen = trace(method, seed, 1)
    result = plain[-1].result
    for chunk in CHUNKS[1:]:
        chunked, chunk_seen = trace(method, seed, chunk)
        assert chunked[:-1] == plain[:-1]
        assert isinstance(chunked[-1], Done) and chunked[-1].result.candidates == result.candidates
        assert chunked[-1].result.decision_points == result.decision_points
        assert same_steps(chunk_seen, seen)
    if method == "sbon":
        assert len(result.decision_points) >= 2, "the budget should force decision points in several rounds"


def test_candidates_finish_inside_chunks(trace):
    """The comparison above covers candidates that stop in the middle of a chunk (their row is fed on,
    its extra tokens dropped), and decision points that cut a chunk short."""
    assert CHUNKS[1:]  # chunked decoding is traced
    for chunk in CHUNKS[1:]:
        finishes = [e.tokens for seed in SEEDS for e in trace("bon", seed, chunk)[0] if isinstance(e, CandidateFinished)]
        assert any(tokens % chunk and tokens < TOKENS for tokens in finishes)
        decided = [e.decision.tokens for seed in SEEDS for e in trace("sbon", seed, chunk)[0]
                   if isinstance(e, DecisionTaken)]
        assert any(tokens % chunk for tokens in decided)


def test_device_gathered_uniforms_give_the_tokens_of_the_list_indexed_sampler(gen, trace):
    """Today's decode loop, written out: uniforms kept on the host and indexed by a list of candidate ids, a
    device-to-host copy after every token. Its tokens are Best-of-N's, token by token, with and without chunks."""
    config = RunConfig(**METHODS["bon"], n=N, max_new_tokens=TOKENS, seed=SEEDS[0])
    uniforms = coupled_uniforms(config.seed, range(N), TOKENS)
    batch = gen.start(gen.prefill(gen.encode_prompt(PROMPT)), range(N))
    tokens, t = [[] for _ in range(N)], 0
    while len(batch):
        ids = list(batch.candidate_ids)
        sampled = sample(batch.logits, uniforms[ids, t], config.sampling)
        going = []
        for row, (k, token, stop) in enumerate(zip(ids, sampled.tolist(), gen.is_stop(sampled).tolist())):
            tokens[k].append(token)
            if not stop and t + 1 < TOKENS:
                going.append(row)
        batch.keep([ids[row] for row in going])
        if going:
            gen.forward(batch, sampled[going])
        t += 1
    for chunk in CHUNKS:
        assert [c.token_ids for c in trace("bon", SEEDS[0], chunk)[0][-1].result.candidates] == tokens
    # The sampler itself: the same numbers gathered by a device tensor of ids or by a list.
    row_ids = torch.tensor([5, 2, 0])
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample(logits, uniforms.to(gen.device)[row_ids, 3], config.sampling),
                       sample(logits, uniforms[[5, 2, 0], 3], config.sampling))


def test_signals_watching_best_of_n_score_the_same_with_chunks(gen):
    """The analysis queries its observers when the events reach a decision token: each step is observed
    just before its events come out, so a chunk cannot run the signals ahead of the events."""
    config = RunConfig(method="bon", n=N, max_new_tokens=TOKENS, seed=SEEDS[1])
    signals, taus = ["logprob", "deepconf", "consistency"], [3, 5, 6, 9]
    plain = signal_scores(gen, REWARD, PROMPT, config, signals, taus)
    chunked = signal_scores(gen, REWARD, PROMPT, config.replace(decode_chunk=4), signals, taus)
    assert chunked[1] == plain[1] and chunked[0].candidates == plain[0].candidates
    assert any(s is not None for by_t in plain[1].values() for s in by_t[9])


def test_the_settings_reach_the_command_line_and_bad_ones_are_one_line():
    args = build_parser().parse_args(["run", "--decode-chunk", "8", "--decode", "eager"])
    config = run_config(args)
    assert config.decode_chunk == 8 and config.decode == "eager"
    assert not {"decode_chunk", "decode"} & set(config.settings())  # how the run decodes, not what it gives
    with pytest.raises(SBoNError, match=r"^the decode chunk must be at least 1 token .*got 0$"):
        RunConfig(decode_chunk=0).validate()
    # unset: chunks on a GPU, where each check is a sync; one token per check on a CPU; a set one everywhere
    default = run_config(build_parser().parse_args(["run"]))
    assert default.chunk_on(torch.device("cuda")) > 1 and default.chunk_on(torch.device("cpu")) == 1
    assert config.chunk_on(torch.device("cpu")) == config.chunk_on(torch.device("cuda")) == 8
