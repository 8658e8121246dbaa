"""The compiled decode step over a static KV slab (``RunConfig.decode``, sbon.decoders, sbon.static_cache) on the
real embedded model in every weight format the probe may choose: bf16, int4, int4-fp32, int4-bf16dot, int4-amx and
int4-fma (each test runs with each; int4-bf16dot where the CPU has AVX-512 BF16, int4-amx where it has AMX, int4-fma
where it has AVX2): a row's tokens and logits do not depend on its batch, so Speculative Rejection's
survivor k is Best-of-N's candidate k on the compiled path too; the slab keeps its memory when rows leave; the
CUDA-graph layout (the whole length masked) gives the same tokens, checked here uncompiled;
where compiling is impossible the run says so in one line and decodes eagerly; a tiny Falcon with ALiBi, which the
CUDA-graph layout cannot take, decodes through the CPU's step."""

import logging

import pytest
import torch

from sbon import aot_step
from sbon.algorithms import RunConfig, events, run
from sbon.decoders import CompiledDecoder, EagerDecoder, decoder
from sbon.engine import SamplingConfig, coupled_uniforms, sample
from sbon.errors import SBoNError
from sbon.models import load_generator
from sbon.rewards import CallableReward

# Compiling the step takes minutes on two busy cores with a cold inductor cache ($SBON_CACHE/inductor).
# Deselected from the default suite (pyproject's addopts): `python -m pytest -m compile` runs them.
pytestmark = [pytest.mark.slow, pytest.mark.compile]

PROMPT = "Give three tips for staying healthy."
REWARD = CallableReward(lambda prompt, responses: [float(sum(map(ord, r)) % 101) for r in responses], name="text-sum")


@pytest.fixture(scope="module", params=["bf16", "int4", "int4-fp32", "int4-bf16dot", "int4-amx",
                                                       "int4-fma"])
def gen(request):
    try:
        return load_generator("smollm2-135m", device="cpu", weights=request.param)
    except SBoNError as e:  # a format this CPU cannot run (int4-bf16dot without AVX-512 BF16): the probe skips it too
        pytest.skip(f"{request.param} does not load here: {e}")


@pytest.fixture(scope="module")
def compiled(gen):
    """The decoder runs use: its step loaded from the disk (compiled and saved there first on a new machine)."""
    dec = decoder(gen, "compiled")
    assert isinstance(dec, CompiledDecoder) and dec.compiled and dec.saved
    return dec


def decode(dec, prefix, candidate_ids, tokens, seed=7, prune_at=None):
    """Each candidate's sampled tokens and the logits they were sampled from (one batch; with ``prune_at``,
    the first row leaves the batch after that many tokens and its later entries are left at zero)."""
    batch = dec.start(prefix, list(candidate_ids), False, 32)
    uniforms = coupled_uniforms(seed, candidate_ids, tokens)
    picked = torch.zeros(len(candidate_ids), tokens, dtype=torch.long)
    logits = torch.zeros(len(candidate_ids), tokens, batch.logits.shape[-1], dtype=batch.logits.dtype)
    rows = list(range(len(candidate_ids)))
    for t in range(tokens):
        if t == prune_at:
            rows = rows[1:]
            batch.keep([candidate_ids[r] for r in rows])
        logits[rows, t] = batch.logits
        picked[rows, t] = sample(batch.logits, uniforms[rows, t], SamplingConfig())
        dec.forward(batch, picked[rows, t])
    return picked, logits


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_tokens_and_logits_do_not_depend_on_its_batch(gen, compiled, threads):
    """Candidates 0-5 in one batch, one alone (two rows, one of them padding) and five together, four and two:
    the same tokens and logits, bit for bit, from the one graph for every row count and length."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        prefix = gen.prefill(gen.encode_prompt(PROMPT))
        tokens, logits = decode(compiled, prefix, range(6), 6)
        for split in ([[0], [1, 2, 3, 4, 5]], [[0, 1, 2, 3], [4, 5]]):
            parts = [decode(compiled, prefix, ids, 6) for ids in split]
            assert torch.equal(torch.cat([p[0] for p in parts]), tokens)
            assert torch.equal(torch.cat([p[1] for p in parts]), logits)
        assert compiled.saved_step() is not None  # the step saved for this thread count, loaded, not traced
    finally:
        torch.set_num_threads(before)


def test_the_saved_step_checks_the_length_at_every_step(gen, compiled):
    """Its guards are checked whole at a batch's first step and when its row count changes, and in between only
    those a length can change: a view it was not compiled for (the slab's whole length, contiguous) is refused
    midway as at a batch's start; a batch decoded to its last token never reads one."""
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    new_tokens = 64 - len(prefix.prompt_ids) % 64  # the prompt and the new tokens fill whole blocks of the slab
    batch = compiled.start(prefix, [0, 1], False, new_tokens)
    for t in range(new_tokens):
        compiled.forward(batch, torch.tensor([100 + t, 200 + t]))
    step = compiled.saved_step()
    assert step is not None and batch.cache.get_seq_length() < batch.cache.max_len
    with torch.inference_mode():  # as the decoder makes a step's arguments
        args = compiled.inputs(batch, torch.tensor([1, 2]))
        like = compiled.likeness(args)
        assert step.fits(*args, like=like) and step.checked == like
        batch.cache.prepare(2, batch.cache.max_len)  # the same arguments, read to the slab's whole length
        assert not step.fits(*args, like=like)
        assert not step.fits(*args, like=None)


def test_a_batch_opened_in_inference_mode_runs_the_saved_step(gen, compiled):
    """The probe opens its batches in inference mode; the slab is made of normal tensors all the same, so the saved
    step's guards hold and it runs, not a step traced again in this process (which on a CPU compiled for minutes
    and left the process decoding slower)."""
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    with torch.inference_mode():
        batch = compiled.start(prefix, [0, 1, 2], False, 8)
        assert not batch.cache.layers[0].slab_keys.is_inference()
        compiled.forward(batch, torch.tensor([100, 200, 300]))
    assert compiled.saved_step() is not None


def test_rows_leave_the_slab_in_place(gen, compiled):
    """A row pruned midway: the others go on with the tokens they have in a batch without it, and the slab is
    the same memory throughout (compacted by index, never reallocated)."""
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    batch = compiled.start(prefix, [0, 1, 2], False, 32)
    slab = batch.cache.layers[0].slab_keys
    where, rows = slab.data_ptr(), slab.shape[0]
    pruned, _ = decode(compiled, prefix, [0, 1, 2], 6, prune_at=2)
    alone, _ = decode(compiled, prefix, [1, 2], 6)
    assert torch.equal(pruned[1:], alone)
    compiled.forward(batch, torch.tensor([100, 200, 300]))
    batch.keep([0, 2])
    compiled.forward(batch, torch.tensor([101, 301]))
    layer = batch.cache.layers[0]
    assert layer.slab_keys.data_ptr() == where and layer.slab_keys.shape[0] == rows
    assert layer.keys.shape[0] == 2 and batch.cache.get_seq_length() == len(prefix.prompt_ids) + 2


def test_speculative_rejection_s_survivors_are_best_of_n_s_candidates(gen):
    """The coupling on the compiled path: Best-of-N in batches of 4 and Speculative Rejection from 6 rows down to
    its survivors; every candidate Speculative Rejection finished has Best-of-N's tokens."""
    common = dict(n=6, max_new_tokens=16, seed=3, decode="compiled")
    bon = run(events(gen, REWARD, PROMPT, RunConfig(method="bon", batch_size=4, **common)))
    sr = run(events(gen, REWARD, PROMPT, RunConfig(method="sbon", alpha=0.5, first_decision=4, **common)))
    finished = [c for c in sr.candidates if c.pruned_round is None]
    assert sr.decision_points and len(finished) < 6
    for c in sr.candidates:
        assert c.token_ids == bon.candidates[c.id].token_ids[:len(c.token_ids)]
    assert all(c.token_ids == bon.candidates[c.id].token_ids for c in finished)


def test_chunks_give_the_same_run_on_the_compiled_step(gen):
    """Decoding in chunks (tests/test_decode_chunk.py) on the compiled step: the same events and candidates."""
    runs = []
    for chunk in (1, 4):
        config = RunConfig(method="sbon", alpha=0.2, first_decision=3, n=6, max_new_tokens=12, seed=0,
                           decode_chunk=chunk, decode="compiled")
        runs.append(list(events(gen, REWARD, "Answer with one word: what colour is the sky?", config)))
    assert runs[1][:-1] == runs[0][:-1] and runs[1][-1].result.candidates == runs[0][-1].result.candidates
    assert runs[0][-1].result.decision_points


def test_the_cuda_graph_layout_gives_the_same_tokens(gen):
    """What a GPU replays: rows in power-of-two buckets, the slab's whole length read and its unwritten end masked
    (run eagerly here, on the CPU): the tokens of the slab read to its written length. (Their logits differ in
    rounding, the sums being as long as the slab; tests/test_step_formats.py compares them.)"""
    if gen.weights != "bf16":
        pytest.skip("the layout does not depend on the weight format: checked once, in bf16")
    layout = CompiledDecoder(gen, graphs=True, compile=False)
    assert [layout.rows(n) for n in (1, 2, 3, 5, 16, 17)] == [2, 2, 4, 8, 16, 32]
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    tokens, logits = decode(CompiledDecoder(gen, graphs=False, compile=False), prefix, range(3), 8)
    graph_tokens, graph_logits = decode(layout, prefix, range(3), 8)
    assert torch.equal(graph_tokens, tokens)
    assert torch.equal(graph_logits[:, 0], logits[:, 0])  # the prefill's, before any step


def test_auto_compiles_where_this_machine_s_measured_choice_is_the_compiled_step(gen, monkeypatch):
    """``auto`` on a CPU follows the choice measured on this machine (sbon.machine): the compiled step where it is this
    weight format's compiled step, eager where it is another path or where nothing is measured yet."""
    import sbon.machine
    from sbon.machine import Choice

    monkeypatch.delenv("SBON_DECODE", raising=False)  # the suite's default (tests/conftest.py) would force eager

    def measured(weights, decode):
        choice = Choice("smollm2-135m", {}, [], weights, decode)
        monkeypatch.setattr(sbon.machine, "cached_choice", lambda *args, **kwargs: choice)

    measured(gen.weights, "compiled")
    assert isinstance(decoder(gen, "auto"), CompiledDecoder) and isinstance(decoder(gen, "eager"), EagerDecoder)
    fp32 = load_generator("smollm2-135m", device="cpu", weights="fp32")
    assert isinstance(decoder(fp32, "auto"), EagerDecoder)  # the choice is another format's
    measured(gen.weights, "eager")
    assert isinstance(decoder(gen, "auto"), EagerDecoder)
    monkeypatch.setattr(sbon.machine, "cached_choice", lambda *args, **kwargs: None)
    assert isinstance(decoder(gen, "auto"), EagerDecoder)
    with pytest.raises(SBoNError, match=r"^unknown decode 'jit': use one of auto, eager, compiled$"):
        RunConfig(decode="jit").validate()


def test_without_a_compiler_the_run_decodes_eagerly_with_one_line(gen, monkeypatch, caplog):
    import sbon.decoders
    monkeypatch.setattr(sbon.decoders.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="sbon"):
        dec = decoder(gen, "compiled")
    assert isinstance(dec, EagerDecoder)
    [line] = [r.getMessage() for r in caplog.records if r.name.startswith("sbon")]
    assert line == "decode compiled: no C++ compiler for torch.compile's CPU kernels (install g++); decoding eagerly"


def test_a_later_process_loads_the_saved_step(gen, tmp_path):
    """The first process on a machine compiles the step and saves it beside inductor's caches
    ($SBON_CACHE/inductor); a later one loads it instead of tracing it, also when it loaded another model first
    (the saved step must not hold anything that differs between processes)."""
    import os

    from benchmarks.step import fresh_process_step

    if gen.weights != "int4":
        pytest.skip("one format is enough: saving does not depend on it")
    env = {**os.environ, "SBON_CACHE": str(tmp_path)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    runs = [fresh_process_step("smollm2-135m", "int4", 1, first, env) for first in ((), ("bf16",))]
    assert [r["step"] for r in runs] == ["built", "loaded"]
    # the first lowered the graph to kernels, the second did not: it loaded them
    assert runs[0]["inductor"].get("pattern_matcher_count") and "pattern_matcher_count" not in runs[1]["inductor"]
    assert len(list((tmp_path / "inductor" / "sbon-step").glob("*.pt"))) == 1


def sbon_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("sbon")]


def test_where_the_step_cannot_be_saved_it_is_traced_with_the_same_numbers(gen, compiled, monkeypatch, caplog,
                                                                         tmp_path):
    """A step that cannot be saved (here: a full disk) is traced in the process, as before saving existed, with
    one line saying why; the saved step and the traced one give the same tokens and logits, bit for bit."""
    def full_disk(*args):
        raise OSError("No space left on device")

    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    saved_tokens, saved_logits = decode(compiled, prefix, range(3), 6)
    assert compiled.saved_step() is not None
    monkeypatch.setattr(aot_step, "step_path", lambda *named: tmp_path / "step.pt")
    monkeypatch.setattr(aot_step, "build", full_disk)
    traced = CompiledDecoder(gen)
    with caplog.at_level(logging.WARNING, logger="sbon"):
        tokens, logits = decode(traced, prefix, range(3), 6)
    assert traced.saved_step() is None
    assert sbon_lines(caplog)[-1] == ("decode compiled: the step cannot be saved (OSError: No space left on device); "
                                      "tracing it in this process")
    assert torch.equal(tokens, saved_tokens) and torch.equal(logits, saved_logits)


def test_a_damaged_saved_step_is_compiled_again(gen, compiled, monkeypatch, caplog, tmp_path):
    """A saved step that does not load (a damaged or foreign file under its name) is compiled and saved again,
    with one line saying why, and gives the numbers of the step every run loads."""
    if gen.weights != "int4":
        pytest.skip("one format is enough: loading does not depend on it")
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    loaded = decode(compiled, prefix, range(3), 4)
    path = tmp_path / "step.pt"
    path.write_bytes(b"not a saved step")
    monkeypatch.setattr(aot_step, "step_path", lambda *named: path)
    again = CompiledDecoder(gen)
    with caplog.at_level(logging.WARNING, logger="sbon"):
        tokens, logits = decode(again, prefix, range(3), 4)
    [line] = sbon_lines(caplog)
    assert line.startswith(f"decode compiled: the saved step {path} does not load (") and line.endswith(
        "; compiling it again")
    assert again.saved_step().built and path.stat().st_size > 1000
    assert torch.equal(tokens, loaded[0]) and torch.equal(logits, loaded[1])


def test_falcon_with_alibi_decodes_through_the_cpu_s_compiled_step_with_the_eager_tokens():
    """Falcon with ALiBi builds its position biases over the written tokens: the CUDA-graph layout, whose step reads
    a slab's whole length, cannot take it (tests/test_cuda_graphs.py), but the CPU's step reads the written tokens
    only, so it compiles here and its runs are the eager runs."""
    from test_cuda_graphs import tiny_architecture

    own = tiny_architecture("falcon-alibi")
    for method in ("sbon", "bon"):
        runs = {decode: run(events(own, REWARD, PROMPT, RunConfig(method=method, n=5, alpha=0.5, max_new_tokens=12,
                                                                      decode=decode)))
                for decode in ("eager", "compiled")}
        assert runs["compiled"].decode == "compiled"
        assert [c.token_ids for c in runs["compiled"].candidates] == [c.token_ids for c in runs["eager"].candidates]
