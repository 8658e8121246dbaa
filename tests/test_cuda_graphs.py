"""The CUDA-graph decoder (sbon.cuda_graphs) without CUDA: its slabs, row buckets and buffers are the same on a CPU,
where a "graph" runs the step eagerly at each replay; what a capture would record is checked on the op stream; a
capture that fails is simulated. Then the app's side (components.decode_paths): captures at model load, one per
task on the torch thread, a run asked for meanwhile, the fallback, and ZeroGPU's worker."""

from __future__ import annotations

import copy
import logging
import pickle
import threading
import time

import pytest
import torch
import transformers
from packaging.version import Version

from benchmarks import gpu_stand_ins
from components import decode_paths
from components.decode_paths import DecodePaths
from components.torch_thread import TORCH_THREAD
from sbon import algorithms, cuda_graphs
from sbon.config import RunConfig
from sbon.cuda_graphs import (GRAPH_MIN_ROWS, LENGTH_CHECKED, GraphDecoder, graph_rows, length_frozen, plan,
                              slab_length, step_operations)
from sbon.decoders import _step, decoder, graphs
from sbon.engine import CACHE_KEYWORD, Generator
from sbon.rewards import CallableReward

NAME = "smollm2-135m"
PROMPT = "Give three tips for staying healthy."
ZERO = CallableReward(lambda prompt, responses: [float(len(r)) for r in responses])


def fresh(gen: Generator, dtype: torch.dtype | None = None) -> Generator:
    """The same model as another Generator (a decoder hangs on its generator: the fixture's stays untouched); in
    another dtype, a copy."""
    model = gen.model if dtype is None else copy.deepcopy(gen.model).to(dtype)
    return Generator(model, gen.tokenizer, name=gen.name, weights=gen.weights)


@pytest.fixture(scope="module")
def tiny() -> Generator:
    """A tiny random Llama with SmolLM2's tokenizer and SDPA attention, the attention a CUDA device runs."""
    torch.manual_seed(0)
    model = gpu_stand_ins.random_llama(gpu_stand_ins.smollm2_tokenizer(), torch.device("cpu"), torch.float32,
                                   {**gpu_stand_ins.SMOLLM2_135M, **gpu_stand_ins.TINY_ARCH})
    assert model.config._attn_implementation == "sdpa"
    return Generator(model, gpu_stand_ins.smollm2_tokenizer(), name=NAME)


def run(gen: Generator, method: str, decode: str, n: int = 5, tokens: int = 8, reward=ZERO):
    config = RunConfig(method=method, n=n, alpha=0.5, max_new_tokens=tokens, prune_by="reward", decode=decode)
    return algorithms.run(algorithms.events(gen, reward, PROMPT, config))


# -- buckets --------------------------------------------------------------------------------------------

def test_every_run_of_up_to_sixteen_candidates_decodes_through_one_shape():
    assert GRAPH_MIN_ROWS == 16
    assert [graph_rows(n) for n in (1, 2, 7, 16, 17, 33, 128)] == [16, 16, 16, 16, 32, 64, 128]
    assert [slab_length(t) for t in (10, 256, 257, 1000)] == [256, 256, 512, 1024]
    assert plan(16, 40, 128) == [(16, 256)]  # the page default: one graph
    assert plan(64, 300, 128) == [(64, 512), (32, 512), (16, 512)]


# -- the decoder -----------------------------------------------------------------------------------------

def test_graphs_decode_the_eager_tokens_and_later_batches_reuse_the_slab_and_its_graph(tiny):
    """In float32: Speculative Rejection (pruning compacts the slab's rows) and Best-of-N in
    batches through the graph decoder give the eager decoder's tokens; every batch of the same length takes the
    same slab, and one graph serves both methods."""
    own = fresh(tiny)
    dec = graphs(own)
    assert decoder(own, "compiled") is dec and dec.name == "compiled"
    for method in ("sbon", "bon"):
        eager, graph = run(own, method, "eager"), run(own, method, "compiled")
        assert graph.decode == "compiled"
        assert [c.token_ids for c in graph.candidates] == [c.token_ids for c in eager.candidates]
        assert any(c.pruned_round for c in graph.candidates) or method == "bon"
    assert len(dec.slabs) == 1 and list(dec.slabs[0].graphs) == [16]


def test_a_survivor_s_logits_are_its_best_of_n_twin_s_bits_in_bfloat16(tiny):
    """bfloat16, where a batch's rounding may depend on its rows: a candidate's row gives the same bits whichever
    rows share its 16-row step and wherever it sits in it, so Speculative Rejection's survivors are their Best-of-N
    twins token for token."""
    own = fresh(tiny, torch.bfloat16)
    dec = graphs(own)
    prefix = own.prefill(own.encode_prompt(PROMPT))
    many = dec.start(prefix, [0, 1, 2, 3, 4, 5, 6], False, 8)
    dec.forward(many, torch.tensor([3, 1, 4, 1, 5, 9, 2]) + 200)
    two = dec.start(prefix, [4, 0], False, 8)  # the same candidates' tokens, other neighbours and places
    dec.forward(two, torch.tensor([5, 3]) + 200)
    assert torch.equal(two.logits[0], many.logits[4]) and torch.equal(two.logits[1], many.logits[0])
    sbon, bon = run(own, "sbon", "compiled", n=8, tokens=12), run(own, "bon", "compiled", n=8, tokens=12)
    twins = {c.id: c.token_ids for c in bon.candidates}
    assert sum(c.pruned_round is None for c in sbon.candidates) >= 2
    assert all(c.token_ids == twins[c.id] for c in sbon.candidates if c.pruned_round is None)
    assert all(c.token_ids == twins[c.id][:len(c.token_ids)] for c in sbon.candidates)


def same_kernels_at_every_length(gen: Generator) -> list:
    """The operations of the graphs' step at three successive lengths of one slab, checked equal, with none that
    reads a value back to Python: what a graph captured at one length replays at every other (a Python number taken
    from the length inside the step would be frozen at its capture's value). Returns them."""
    traces = step_operations(gen, _step)
    assert length_frozen(traces) is None and len(traces[0]) > 50
    return traces[0]


def test_the_captured_step_is_the_same_kernels_at_every_length_and_never_waits_for_the_host(tiny):
    """A graph replays what it recorded: the step must launch the same operations with the same arguments at every
    length of the slab (the length reaches it only as a tensor), and none that reads a value back to Python (a
    capture refuses those). Its attention is the one-query matmuls."""
    ops = [op for op, *_ in same_kernels_at_every_length(tiny)]
    # The slab is read by the one-query matmuls (sbon.attention), not by SDPA, whose masked kernel was not exact on a
    # GPU; the model itself stays on SDPA for everything else.
    assert not [op for op in ops if "scaled_dot_product" in op]
    assert [op for op in ops if op.startswith("aten.masked_fill")]
    assert tiny.model.config._attn_implementation == "sdpa"


def test_a_step_that_takes_a_number_from_the_length_decodes_eagerly_where_its_model_type_is_unchecked(tiny, monkeypatch,
                                                                                                    caplog):
    """A model type outside LENGTH_CHECKED is checked once, before its first capture: one whose step takes a Python
    number from the cache's length (here a hook that raises one logit chosen by it; a graph would raise the same one
    at every step) decodes eagerly over the slab, said in one line, with the eager decoder's tokens; the same model
    without the hook passes the check and decodes on its graphs."""
    monkeypatch.setattr(cuda_graphs, "LENGTH_CHECKED", frozenset())
    own = fresh(tiny)
    graphs(own)  # its compiled decoder is the graphs' (off CUDA: the step run eagerly over the slab)
    clean = run(own, "sbon", "compiled")
    assert clean.decode == "compiled" and graphs(own).length_checked and not graphs(own).failed

    written = []  # the cache's length as the step starts (each cache counts its new token in at its own time)

    def by_length(module, args, kwargs, output):
        output.logits[..., written.pop() % 7] += 3.0
    hooked = fresh(tiny)
    graphs(hooked)
    handles = [tiny.model.register_forward_pre_hook(
        lambda module, args, kwargs: written.append(kwargs[CACHE_KEYWORD].get_seq_length()), with_kwargs=True),
        tiny.model.register_forward_hook(by_length, with_kwargs=True)]
    try:
        eager = run(hooked, "sbon", "eager")
        with caplog.at_level(logging.WARNING, logger="sbon.cuda_graphs"):
            result = run(hooked, "sbon", "compiled")
            again = run(hooked, "bon", "compiled")
    finally:
        for handle in handles:
            handle.remove()
    assert result.decode == again.decode == "eager"
    assert [c.token_ids for c in result.candidates] == [c.token_ids for c in eager.candidates]
    assert [c.token_ids for c in eager.candidates] != [c.token_ids for c in clean.candidates]  # the hook counts
    lines = [r.getMessage() for r in caplog.records if r.name == "sbon.cuda_graphs"]
    assert len(lines) == 1 and lines[0].startswith("decode compiled: its step takes numbers from the KV cache's length")
    assert "aten." in lines[0] and lines[0].endswith("; decoding eagerly over the same slab")


def test_the_model_types_whose_check_is_skipped_are_the_ones_this_file_checks():
    """LENGTH_CHECKED skips the run-time check for the model types whose step this file checks at every length:
    the embedded model's and each of ARCHITECTURES."""
    assert LENGTH_CHECKED == {"llama"} | {getattr(transformers, name).model_type for name, _ in ARCHITECTURES.values()}


def test_a_run_captures_the_graphs_it_will_replay_before_its_timers_start(tiny):
    """A process's first run on graphs captures them before its timers start, so that its decode time counts
    decoding (captured in its first steps, they made the first of a comparison's two runs the slower), over the
    slab it then decodes in: a later run of the same shape captures nothing."""
    capture_s, captured = 3.0, []  # longer than the tiny model's whole decode beside another test worker

    def slow(body, pool):
        captured.append(body)
        time.sleep(capture_s)
        return body
    own = fresh(tiny)
    own._graph_decoder = GraphDecoder(own, _step, capture=slow)
    first = run(own, "sbon", "compiled", n=20, tokens=8)  # 32 rows, then 16 once half of them are pruned
    assert first.decode == "compiled" and len(first.decision_points) == 1 and len(captured) == 2
    assert first.timings["decode"] < capture_s, first.timings
    later = run(own, "bon", "compiled", n=20, tokens=8)
    assert later.decode == "compiled" and len(captured) == 2 and len(own._graph_decoder.slabs) == 1


def test_a_graph_captured_midway_through_a_run_leaves_the_rows_kv_as_it_was(tiny, monkeypatch):
    """A capture's warm-up steps run over the batch's own slab where a graph is first needed midway through a run
    (here nothing is captured ahead): they compute the step the replay then computes, this step's tokens at this
    step's position, so the rows' KV stays theirs even where pruning has moved them to other rows meanwhile."""
    def warmed(body, pool):  # as capture_cuda: warm-up steps over the same buffers, then the "graph"
        for _ in range(2):
            body()
        return body
    own = fresh(tiny)
    own._graph_decoder = dec = GraphDecoder(own, _step, capture=warmed)
    monkeypatch.setattr(dec, "ready", lambda *args, **kwargs: None)
    eager = run(own, "sbon", "eager", n=20, tokens=8)
    graph = run(own, "sbon", "compiled", n=20, tokens=8)  # 32 rows, then 16 once half of them are pruned
    assert graph.decode == "compiled" and sorted(dec.slabs[0].graphs) == [16, 32]
    assert [c.token_ids for c in graph.candidates] == [c.token_ids for c in eager.candidates]


def test_a_slab_the_free_memory_cannot_hold_decodes_eagerly_under_auto_and_stops_compiled_in_one_line(
        tiny, monkeypatch, caplog):
    """A static slab holds every row's whole length at once, where eager's cache grows with the tokens (and a KV
    budget bounds it): where the slab would not fit, auto decodes eagerly and says so; compiled says what to change."""
    import sbon.decoders
    from sbon.errors import SBoNError

    own = fresh(tiny)
    own._graph_decoder = GraphDecoder(own, _step)
    monkeypatch.setattr(sbon.decoders, "auto_compiles", lambda gen: True)  # auto's path here: the graphs
    slab = GRAPH_MIN_ROWS * slab_length(len(own.encode_prompt(PROMPT)) + 8 + 1) * own.kv_bytes_per_token()
    monkeypatch.setattr(own, "free_memory_bytes", lambda: slab)  # its 80 % cannot hold the slab
    with caplog.at_level(logging.WARNING, logger="sbon"):
        assert run(own, "sbon", "auto").decode == "eager" and not own._graph_decoder.slabs
    [line] = [r.getMessage() for r in caplog.records if r.name.startswith("sbon")]
    assert line.startswith("decode auto: its static KV cache for 5 candidates of up to ") and "eagerly" in line
    with pytest.raises(SBoNError, match=r"^decode compiled: .* GiB, more than 80% of the free memory .*: decode "
                                        r"eagerly, or run fewer candidates or new tokens$"):
        run(own, "sbon", "compiled")
    monkeypatch.setattr(own, "free_memory_bytes", lambda: 2 * slab)
    assert run(own, "sbon", "auto").decode == "compiled"


def test_a_capture_that_fails_is_one_logged_line_and_the_run_goes_on_eagerly(tiny, caplog):
    own = fresh(tiny)
    eager = run(own, "sbon", "eager")

    def broken(body, pool):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
    own._graph_decoder = GraphDecoder(own, _step, capture=broken)
    with caplog.at_level(logging.WARNING, logger="sbon.cuda_graphs"):
        result = run(own, "sbon", "compiled")
    assert [c.token_ids for c in result.candidates] == [c.token_ids for c in eager.candidates]
    assert result.decode == "eager"  # the run says the path it really took
    lines = [r.getMessage() for r in caplog.records if r.name == "sbon.cuda_graphs"]
    assert len(lines) == 1 and "RuntimeError: operation not permitted when stream is capturing" in lines[0]
    steps = DecodePaths()  # the app learns it at the next run's start, and the page says why
    assert steps._gpu_decode(NAME, own) == "eager" and "could not be captured" in steps.status(NAME)


# Other architectures a researcher may name, tiny and random (wide enough weights that the greedy tokens vary): the
# config class and its sizes. Falcon calls SDPA itself (its attention is not switchable to the one-query function);
# with ALiBi its step cannot read a slab at all; BLOOM's ALiBi reads one exactly; StableLM and GPT-2 have their own
# attention code, Qwen3 normalizes its queries and keys; Mistral attends within a sliding window (a mask over the
# slab's keys, narrower than the prompt: it changes the greedy tokens), Gemma 2 soft-caps its scores and alternates
# windowed layers with whole ones.
ARCHITECTURES = {
    "falcon": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)),
    "falcon-new": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        new_decoder_architecture=True, num_kv_heads=2)),
    "falcon-alibi": ("FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True)),
    "bloom": ("BloomConfig", dict(hidden_size=64, n_layer=2, n_head=4)),
    "stablelm": ("StableLmConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4)),
    "qwen3": ("Qwen3Config", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16)),
    "mistral": ("MistralConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, sliding_window=8)),
    "gemma2": ("Gemma2Config", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, sliding_window=8)),
}


def tiny_architecture(arch: str) -> Generator:
    """A tiny random model of one of ARCHITECTURES with SmolLM2's tokenizer, SDPA's attention where it has it."""
    from transformers import AutoModelForCausalLM

    tokenizer = gpu_stand_ins.smollm2_tokenizer()
    name, sizes = ARCHITECTURES[arch]
    config = getattr(transformers, name)(**sizes, vocab_size=len(tokenizer), initializer_range=0.3,
                                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except ValueError:  # an architecture without SDPA (BLOOM)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return Generator(model.eval(), tokenizer, name=arch)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_other_architectures_decode_transformers_own_greedy_tokens_through_the_graphs_or_say_why_not(arch):
    """The graphs' step over a slab gives each row the eager step's logits (to float32's rounding) from the first
    step, a greedy run through them gives `generate`'s tokens, and the step is the same kernels at every length (what
    a CUDA graph captured at one length needs); a model whose step cannot read a slab (Falcon with ALiBi) decodes
    eagerly instead, and its run says so (the next test: how)."""
    from sbon.attention import switchable
    from sbon.decoders import EagerDecoder, compile_problem

    own = tiny_architecture(arch)
    model, tokenizer = own.model, own.tokenizer
    # switched to the one-query function where its attention is looked up in transformers' interface (Gemma 2's is
    # SDPA in some transformers releases, 5.17's, and eager in others, 5.24's; Falcon calls SDPA itself up to 5.24,
    # and looks it up in the interface from 5.25 on, ALiBi added to the mask it passes)
    falcon_looks_up = Version(transformers.__version__).release >= (5, 25)
    assert switchable(model) is (arch in ("stablelm", "gpt2", "qwen3", "mistral")
                                 or (arch == "gemma2" and model.config._attn_implementation == "sdpa")
                                 or (arch.startswith("falcon") and falcon_looks_up))
    graphs(own)  # its compiled decoder is the graphs' (off CUDA: the step run eagerly over the slab)
    ids = own.encode_prompt(PROMPT)
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=16, min_new_tokens=16)
    expected = expected[0, len(ids):].tolist()
    greedy = RunConfig(method="bon", n=2, max_new_tokens=16, top_k=1, decode="compiled")
    result = algorithms.run(algorithms.events(own, ZERO, PROMPT, greedy))
    assert [c.token_ids for c in result.candidates] == [expected, expected]
    assert compile_problem(own) is None  # no architecture is named: a step that fails over a slab shows it
    # Falcon with ALiBi builds its position biases over the written tokens, not a slab's keys; so does BLOOM in some
    # transformers releases (5.17's), not in others (5.24's reads the slab)
    if arch == "falcon-alibi" or (arch == "bloom" and graphs(own).slab_fails):
        assert result.decode == "eager" and graphs(own).slab_fails
        return
    assert result.decode == "compiled"
    steps = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        decoders = [EagerDecoder(own), graphs(own)]
        batches = [dec.start(own.prefill(ids), [0, 1], False, 8) for dec in decoders]
        for _ in range(4):
            tokens = torch.randint(0, len(tokenizer), (2,), generator=steps)
            for dec, batch in zip(decoders, batches):
                dec.forward(batch, tokens)
            eager, graph = (b.logits.float() for b in batches)
            assert (graph - eager).abs().max() < 1e-4 * eager.abs().max()
    same_kernels_at_every_length(own)  # and a graph captured at one length replays the step at the others


def test_a_model_whose_step_fails_over_a_slab_decodes_with_a_growable_cache_in_one_logged_line(caplog):
    """A model whose step fails over a slab (Falcon with ALiBi builds its position biases over the written tokens,
    not over a slab's keys): the capture before the run fails, the step tried alone over that slab fails too, and
    the run goes on with transformers' forward over a growable cache, the eager decoder's tokens, said in one
    line; the next run does the same without trying again."""
    own = tiny_architecture("falcon-alibi")
    eager = run(own, "sbon", "eager")
    graphs(own)
    with caplog.at_level(logging.WARNING, logger="sbon.cuda_graphs"):
        result = run(own, "sbon", "compiled")
        again = run(own, "bon", "compiled")
    assert result.decode == again.decode == "eager"
    assert [c.token_ids for c in result.candidates] == [c.token_ids for c in eager.candidates]
    assert [c.token_ids for c in again.candidates] == [c.token_ids for c in run(own, "bon", "eager").candidates]
    lines = [r.getMessage() for r in caplog.records if r.name == "sbon.cuda_graphs"]
    assert len(lines) == 1 and lines[0].startswith("decode compiled: the step cannot run over a static KV slab (")
    assert graphs(own).slab_fails and not graphs(own).slabs
    assert graphs(own).slab_tokens(16, 100, 100) == 0  # nothing of the free memory is asked for a slab


# -- inductor under the graphs -------------------------------------------------------------------------------

def wait_for(condition, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


# A sleep longer than the tiny model's step itself (about 10 ms for 16 rows on 2 cores): the timing of the two
# graphs must tell them apart beside another test worker on the same cores, where a few milliseconds were not enough.
SLOWER_S = 0.02


def slowed(step, seconds: float, calls: dict, name: str):
    """``step`` that counts its calls in ``calls[name]`` and sleeps ``seconds`` first."""
    def counted(*args):
        calls[name] += 1
        time.sleep(seconds)
        return step(*args)
    return counted


@pytest.mark.parametrize("slow", ["plain", "inductor"])
def test_a_faster_build_keeps_for_each_row_count_the_graph_measured_faster_and_runs_replay_it_once_adopted(
        tiny, slow):
    """build_faster captures the plain step and the compiled one side by side over a slab of its own, times them and
    keeps the faster (here the other one sleeps at every step; the compiler is not run: the plumbing, not
    inductor). Until ``adopt`` the runs replay the graphs they had; after it, the kept one, with the same tokens,
    in the slab that replaced theirs."""
    own, calls = fresh(tiny), {"plain": 0, "inductor": 0}
    plain = slowed(_step, SLOWER_S if slow == "plain" else 0, calls, "plain")
    own._graph_decoder = dec = GraphDecoder(own, plain)
    eager = run(own, "sbon", "eager")
    assert run(own, "sbon", "compiled").decode == "compiled" and calls["plain"] and not calls["inductor"]
    compiled = slowed(_step, SLOWER_S if slow == "inductor" else 0, calls, "inductor")
    built = dec.build_faster(plan(5, len(own.encode_prompt(PROMPT)), 8), compiler=lambda step: compiled)
    assert list(built.ms) == [16] and built.ms[16][slow] == max(built.ms[16].values())  # the sleeping one
    assert built.inductor_rows == ([16] if slow == "plain" else [])
    assert built.summary()["inductor_rows"] == built.inductor_rows and built.summary()["ms"]["16"] == built.ms[16]
    calls.update(plain=0, inductor=0)
    run(own, "sbon", "compiled")  # built, not adopted: the runs' graphs as they were
    assert calls["plain"] and not calls["inductor"] and dec.faster is None
    dec.adopt(built)
    calls.update(plain=0, inductor=0)
    after = run(own, "sbon", "compiled")
    assert [c.token_ids for c in after.candidates] == [c.token_ids for c in eager.candidates]
    kept = "inductor" if slow == "plain" else "plain"
    assert calls[kept] and not calls[slow] and dec.faster is built
    assert dec.slabs == [built.slab]  # the slab it replaced is dropped, with its graphs
    other = GraphDecoder(fresh(tiny), _step)  # a model loaded again since: the build's graphs read the old one
    other.adopt(built)
    assert other.faster is None and not other.slabs


def test_a_build_waits_at_its_next_step_of_tracing_while_a_run_generates(tiny):
    """Compiling is mostly Python: a build beside a generating run would make the run's thread wait for the
    interpreter at each of its torch calls. So a build asked for while a run generates starts once it ends, and one
    that a run starts beside holds still at its next step of tracing (here an FX graph run node by node, one of the
    compiler's loops) until that run ends."""
    from sbon import cuda_graphs

    class Runs:  # sbon.machine_load.RunGate's counts, without its file
        generating_now, started = 1, 0
        probe_waits = staticmethod(lambda since: None)

        @classmethod
        def token(cls):
            return None if cls.generating_now else cls.started
    own, traced, out, compiling = fresh(tiny), threading.Event(), {}, threading.Event()

    def compiler(step):
        compiling.set()
        Runs.generating_now = 1  # a run starts as the compile begins
        torch.fx.Interpreter(torch.fx.symbolic_trace(lambda x: x + 1)).run(torch.ones(1))
        traced.set()
        return step
    dec = GraphDecoder(own, _step)
    cuda_graphs.pause_points()  # the compiler's modules imported now, so that only a wait holds it
    thread = threading.Thread(target=lambda: out.setdefault("built", dec.build_faster(
        plan(5, len(own.encode_prompt(PROMPT)), 8), Runs, compiler)))
    thread.start()
    try:
        assert not compiling.wait(0.5)  # asked for during a run: not started
        Runs.generating_now = 0
        assert compiling.wait(30)
        assert not traced.wait(0.5)  # a run began beside it: held at the trace's first node
    finally:
        Runs.generating_now = 0
        thread.join(30)
    assert traced.is_set() and list(out["built"].ms) == [16]


def test_the_pause_points_are_wrapped_while_a_build_runs_and_hold_only_its_thread():
    """The build's thread waits at the pause points through wrappers of the methods themselves: while a run
    generates, the build's thread holds at them and another thread's tracing goes on; afterwards the classes hold
    their own methods again."""
    from sbon import cuda_graphs

    own = torch.fx.Interpreter.__dict__["run_node"]

    class Runs:
        generating_now = 1

    def trace() -> None:
        torch.fx.Interpreter(torch.fx.symbolic_trace(lambda x: x + 1)).run(torch.ones(1))
    entered, held = threading.Event(), threading.Event()

    def build() -> None:
        with cuda_graphs._paused_while_generating(Runs):
            entered.set()
            trace()  # holds at its first node while the run generates
            held.set()
    thread = threading.Thread(target=build)
    thread.start()
    try:
        assert entered.wait(30)
        assert torch.fx.Interpreter.run_node is not own and torch.fx.Interpreter.run_node.__wrapped__ is own
        trace()  # another thread (this one) traces through the wrapped methods without waiting
        assert not held.wait(0.5)
    finally:
        Runs.generating_now = 0
        thread.join(30)
    assert held.is_set() and torch.fx.Interpreter.__dict__["run_node"] is own


def test_a_round_of_timings_taken_beside_a_run_is_taken_again():
    """The faster graph is chosen by timings where no run generated: a round begun while one generates waits, a
    round during which one started is thrown away."""
    from sbon import cuda_graphs

    counts = {"a": 0, "b": 0}

    def replay(name):
        def go():
            counts[name] += 1
            time.sleep(0.0002 if name == "b" else 0)
        return go
    class Runs:  # what sbon.machine_load.RunGate's token says: generating; a run started; then quiet
        tokens = iter([None, 0, 1] + [1] * 2 * cuda_graphs.FASTER_ROUNDS)
        probe_waits = staticmethod(lambda since: None)

        @classmethod
        def token(cls):
            return next(cls.tokens)
    ms = cuda_graphs._time_replays({"a": replay("a"), "b": replay("b")}, Runs, lambda: None)
    assert counts == {"a": (1 + cuda_graphs.FASTER_ROUNDS) * cuda_graphs.FASTER_REPLAYS} | {
        "b": (1 + cuda_graphs.FASTER_ROUNDS) * cuda_graphs.FASTER_REPLAYS}
    assert ms["a"] < ms["b"]


def test_the_one_query_attention_holds_until_the_last_thread_inside_leaves(tiny):
    """A graph's step reads its slab through the one-query attention (sbon.attention.one_query_steps) while a thread
    building faster graphs may be inside the same switch: the first to leave must not switch the model back to SDPA
    under the other."""
    from sbon.attention import NAME as ONE_QUERY, one_query_steps

    config = tiny.model.config
    inside, leave = threading.Event(), threading.Event()

    def other():
        with one_query_steps(tiny.model):
            inside.set()
            leave.wait(10)
    thread = threading.Thread(target=other)
    with one_query_steps(tiny.model):
        thread.start()
        assert inside.wait(10)
    assert config._attn_implementation == ONE_QUERY  # this one left; the other is still inside
    leave.set()
    thread.join(10)
    assert config._attn_implementation == "sdpa"


# -- the app's side -----------------------------------------------------------------------------------------

def test_captures_at_load_go_one_per_task_and_a_run_asked_for_meanwhile_goes_between(
        tiny, machine_without_choice, monkeypatch):
    """The page-default graphs are captured on the torch thread one per task: a run asked for while they are
    captured waits for one capture at most; it decodes on graphs (capturing what it needs itself), and so does
    the first run after them."""
    order = []

    def slow(body, pool):
        order.append("capture")
        time.sleep(0.05)
        return body
    own = fresh(tiny)
    own._graph_decoder = GraphDecoder(own, _step, capture=slow)
    prompt_tokens = len(own.encode_prompt(PROMPT))
    monkeypatch.setattr(decode_paths, "gpu_graphs", lambda gen: plan(64, prompt_tokens, 12))
    steps = DecodePaths()
    assert steps._gpu_decode(NAME, own) == "compiled"  # at load: graphs from the first run on
    TORCH_THREAD.submit(order.append, "run").result()
    assert order.index("run") == 1
    deadline = time.monotonic() + 20
    while NAME not in steps._gpu_ready and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(order) == 4 and NAME in steps._gpu_ready and "decodes with CUDA graphs" in steps.status(NAME)
    slab = own._graph_decoder.slabs[0]
    assert (slab.capacity, sorted(slab.graphs)) == (64, [16, 32, 64])
    result = TORCH_THREAD.submit(run, own, "sbon", steps._gpu_decode(NAME, own), 6, 12).result()
    assert result.decode == "compiled" and len(order) == 4  # the run found its graph captured


def test_zerogpu_s_worker_decodes_eagerly_and_only_plain_data_crosses(tiny, monkeypatch):
    """A ZeroGPU worker lives for one call: nothing is captured there, and what it yields is plain data."""
    monkeypatch.setattr(decode_paths, "on_zerogpu", lambda: True)
    steps = DecodePaths()
    own = fresh(tiny)
    assert steps._gpu_decode(NAME, own) == "eager" and NAME not in steps._started
    assert getattr(own, "_graph_decoder", None) is None
    decode = steps._gpu_decode(NAME, own)
    events = [e for method in ("sbon", "bon") for e in algorithms.events(own, ZERO, PROMPT, RunConfig(
        method=method, n=4, alpha=0.5, max_new_tokens=6, prune_by="reward", decode=decode))]
    for event in events:  # a tensor would pickle with torch's rebuild functions named in it
        assert b"torch" not in pickle.dumps(event)
    assert events[-1].result.decode == "eager"


def test_the_faster_step_is_built_beside_the_runs_and_adopted_at_the_next_run_s_start(
        tiny, machine_without_choice, monkeypatch):
    """Once the page-default graphs are captured, the app builds inductor's step under them on a thread of its own:
    a run asked for while it compiles does not wait for it, the model line says what goes on, and the build is
    adopted at the start of the next run, never within one (both methods of a comparison replay one graph)."""
    from sbon import cuda_graphs

    compiling, go_on, calls = threading.Event(), threading.Event(), {"plain": 0, "inductor": 0}

    def compiler(step):
        compiling.set()
        assert go_on.wait(30)
        return slowed(_step, 0, calls, "inductor")
    monkeypatch.setattr(cuda_graphs, "inductor_step", compiler)
    own = fresh(tiny)
    own._graph_decoder = dec = GraphDecoder(own, slowed(_step, SLOWER_S, calls, "plain"))
    monkeypatch.setattr(decode_paths, "gpu_graphs", lambda gen: plan(6, len(own.encode_prompt(PROMPT)), 8))
    steps = DecodePaths(inductor=True)
    assert steps._gpu_decode(NAME, own) == "compiled" and steps.faster(NAME) is None
    assert compiling.wait(30) and steps.faster(NAME)["state"] == "building"
    assert "decodes with CUDA graphs; compiling a faster step for them in the background" in steps.status(NAME)
    during = TORCH_THREAD.submit(run, own, "sbon", steps._gpu_decode(NAME, own), 6, 8).result()
    assert during.decode == "compiled" and not calls["inductor"]  # it did not wait for the compiler
    go_on.set()
    wait_for(lambda: steps.faster(NAME)["state"] == "built")
    assert dec.faster is None and "a faster step for them is ready for the next run" in steps.status(NAME)
    calls.update(plain=0, inductor=0)
    after = TORCH_THREAD.submit(run, own, "bon", steps._gpu_decode(NAME, own), 6, 8).result()
    assert steps.faster(NAME)["state"] == "adopted" and dec.faster is not None and dec.faster.inductor_rows == [16]
    assert calls["inductor"] and not calls["plain"] and after.decode == "compiled"
    assert steps.status(NAME).endswith("decodes with CUDA graphs, each step compiled into fewer, faster GPU kernels.")


def test_a_faster_step_that_does_not_build_is_one_logged_line_and_runs_keep_their_graphs(
        tiny, machine_without_choice, monkeypatch, caplog):
    from sbon import cuda_graphs

    def broken(step):
        raise RuntimeError("inductor: no Triton for this GPU\nmore detail")
    monkeypatch.setattr(cuda_graphs, "inductor_step", broken)
    own = fresh(tiny)
    monkeypatch.setattr(decode_paths, "gpu_graphs", lambda gen: plan(6, len(own.encode_prompt(PROMPT)), 8))
    steps = DecodePaths(inductor=True)
    with caplog.at_level(logging.WARNING, logger="components.decode_paths"):
        steps._gpu_decode(NAME, own)
        wait_for(lambda: (steps.faster(NAME) or {}).get("state") == "failed")
    [line] = [r.getMessage() for r in caplog.records if r.name == "components.decode_paths"]
    assert "was not built (RuntimeError: inductor: no Triton for this GPU)" in line
    assert steps.status(NAME).endswith("decodes with CUDA graphs.")
    assert TORCH_THREAD.submit(run, own, "sbon", steps._gpu_decode(NAME, own), 6, 8).result().decode == "compiled"
