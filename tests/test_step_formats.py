"""The decode step's weight formats and KV rows: what they change and what they must not.

Coupled sampling (survivor k of Speculative Rejection = Best-of-N's candidate k) needs a row's
logits not to depend on how many rows share its batch; these tests check it bit for bit.
"""

import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from sbon.engine import (CACHE_KEYWORD, WEIGHT_FORMATS, SamplingConfig, _pick_sorted, coupled_uniforms,
                         growable_cache, pad_linear_rows, sample)
from sbon.errors import SBoNError
from sbon.models import load_generator

PROMPT = "Give three tips for staying healthy."


@pytest.fixture(scope="module")
def gen(gen_fp32):
    """Float32 (tests/conftest.py): the reference every format here is compared with, and the
    format of the float32 copy the GGUF file's blocks are read against."""
    return gen_fp32


def loaded_here(weights: str):
    """The generator in this format, or the test skipped where the format does not load on this CPU (the probe
    leaves it out of the choice there: sbon.probe)."""
    try:
        return load_generator("smollm2-135m", device="cpu", weights=weights)
    except Exception as e:  # noqa: BLE001 - e.g. bfloat16's prepacked layout needs AVX-512 or AVX-NE-CONVERT
        pytest.skip(f"{weights} does not load on this CPU: {type(e).__name__}: {str(e)[:200]}")


@pytest.fixture(scope="module")
def gen_bf16():
    return loaded_here("bf16")


@pytest.fixture(scope="module")
def gen_int4():
    return loaded_here("int4")


@pytest.fixture(scope="module")
def gen_int4_bf16dot():
    return loaded_here("int4-bf16dot")


@pytest.fixture(scope="module")
def gen_int4_amx():
    return loaded_here("int4-amx")


@pytest.fixture(scope="module")
def gen_int4_fma():
    return loaded_here("int4-fma")


@pytest.fixture(scope="module")
def gen_int4_fp32():
    return load_generator("smollm2-135m", device="cpu", weights="int4-fp32")


def decode(gen, prefix, candidate_ids, tokens, seed=7):
    """Each candidate's sampled tokens and the logits they were sampled from, all in one batch."""
    batch = gen.start(prefix, list(candidate_ids))
    uniforms = coupled_uniforms(seed, candidate_ids, tokens)
    picked, logits = [], []
    for t in range(tokens):
        logits.append(batch.logits.clone())
        picked.append(sample(batch.logits, uniforms[:, t], SamplingConfig()))
        gen.forward(batch, picked[-1])
    return torch.stack(picked, 1), torch.stack(logits, 1)


def three_rows_pruned_midway(forward, batch, steps: int, prune_at: int) -> list:
    """The logits of ``steps`` decode steps of three rows (fixed tokens), the middle row pruned at ``prune_at``."""
    out, tokens = [], torch.tensor([100, 200, 300])
    for t in range(steps):
        if t == prune_at:
            batch.keep([0, 2])
            tokens = tokens[[0, 2]]
        forward(batch, tokens + t)
        out.append(batch.logits.clone())
    return out


def test_bad_weights_are_refused_before_loading():
    with pytest.raises(SBoNError, match="unknown weights 'int2'"):
        load_generator("smollm2-135m", device="cpu", weights="int2")
    with pytest.raises(SBoNError, match="give weights or dtype, not both"):
        load_generator("smollm2-135m", device="cpu", weights="bf16", dtype=torch.float32)


def test_the_default_format_is_recorded(gen, gen_bf16):
    assert gen.weights == "fp32" and gen.model.dtype == torch.float32
    assert gen_bf16.weights == "bf16" and gen_bf16.model.dtype == torch.bfloat16


def test_padding_keeps_small_batches_on_the_big_batches_kernel():
    torch.manual_seed(0)
    layer = torch.nn.Linear(576, 1536, bias=False)
    x = torch.randn(8, 576)
    plain = layer(x[:1])
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # float32 rows are batch-independent on one thread (see WEIGHT_FORMATS)
    try:
        pad_linear_rows(layer, 4)
        assert layer(x[:1]).shape == (1, 1536) and layer(x[:1, None]).shape == (1, 1, 1536)
        assert torch.equal(layer(x[:1])[0], layer(x)[0])
    finally:
        torch.set_num_threads(before)
    assert torch.allclose(layer(x[:1]), plain, atol=1e-5)  # the same numbers up to rounding


def test_the_engine_hands_transformers_the_cache_by_the_name_it_takes(gen):
    """transformers renamed a forward's past_key_values to cache, warning on every call with the old name until a
    later release drops it: the engine's prefill and step use whichever name the installed one takes."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        prefix = gen.prefill(gen.encode_prompt(PROMPT))
        batch = gen.start(prefix, [0, 1])
        gen.forward(batch, prefix.logits.argmax(-1).expand(2))
    assert batch.cache.get_seq_length() == len(prefix.prompt_ids) + 1


def test_growable_rows_give_the_logits_of_concatenated_ones(gen):
    """GrowableLayer (in place, reallocated when full) against transformers' DynamicCache, with a
    row pruned midway: the same logits, bit for bit."""
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    plain = copy.deepcopy(prefix.cache)
    plain.batch_repeat_interleave(3)
    caches = {"dynamic": plain, "growable": growable_cache(prefix.cache, 3, headroom=2)}
    logits = {}
    for name, cache in caches.items():
        tokens = torch.tensor([100, 200, 300])
        out = []
        for t in range(5):  # past the headroom: at least one reallocation
            if t == 2:
                cache.batch_select_indices(torch.tensor([0, 2]))
                tokens = tokens[[0, 2]]
            step = gen.model(input_ids=tokens.view(-1, 1) + t, **{CACHE_KEYWORD: cache}, use_cache=True)
            out.append(step.logits[:, -1])
        logits[name] = out
    assert caches["growable"].get_seq_length() == caches["dynamic"].get_seq_length()
    assert all(torch.equal(a, b) for a, b in zip(logits["dynamic"], logits["growable"]))
    assert caches["growable"].layers[0].keys.shape[0] == 2


def test_prefix_stays_reusable_after_a_batch(gen):
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    length = prefix.cache.get_seq_length()
    first, _ = decode(gen, prefix, range(2), 4)
    again, _ = decode(gen, prefix, range(2), 4)
    assert prefix.cache.get_seq_length() == length and torch.equal(first, again)


def excluded_where_not_exact(name: str, gen) -> bool:
    """Whether the probe (sbon.probe.exactness, at the thread count in use) measures ``name`` exact on this CPU; where
    it does not, assert that the choice excludes it however fast it is (bfloat16 emulated on a CPU without
    bfloat16 matmuls is not exact)."""
    from sbon.decoders import EagerDecoder
    from sbon.machine import Measured, choose, fingerprint
    from sbon.probe import exactness

    exact, divergence = exactness(gen, EagerDecoder(gen))
    if not exact:
        fast = Measured(name, "eager", ms={7: 1.0}, exact=False, divergence=divergence)
        slow = Measured("fp32" if name != "fp32" else "int4", "eager", ms={7: 100.0}, exact=True)
        assert choose("smollm2-135m", fingerprint("cpu"), [fast, slow]).weights == slow.weights
    return exact


@pytest.mark.parametrize("name, threads", [("fp32", 1), ("fp32", 2), ("bf16", 1), ("bf16", 2), ("int4", 2),
                                           ("int4-fp32", 1), ("int4-fp32", 2), ("int4-bf16dot", 2),
                                           ("int4-amx", 1), ("int4-amx", 2), ("int4-fma", 1), ("int4-fma", 2)])
def test_a_rows_logits_do_not_depend_on_its_batch(name, threads, gen, gen_bf16, gen_int4, gen_int4_fp32, request):
    """Candidates 0-5 in one batch, one and five, four and two (the probe, along coupled sampling), and on one
    thread one at a time: the same tokens and logits, bit for bit. Formats with float32 activations (fp32 and int4-fp32,
    prepacked for oneDNN, and int4-fma) are so on any CPU at any thread count; bf16 and int4 where the CPU computes
    bfloat16 natively (WEIGHT_FORMATS); where the probe measures a format not exact, the choice excludes it."""
    g = {"fp32": gen, "bf16": gen_bf16, "int4": gen_int4, "int4-fp32": gen_int4_fp32}.get(name) \
        or request.getfixturevalue(f"gen_{name.replace('-', '_')}")  # skipped on a CPU without the kernel's vectors
    assert WEIGHT_FORMATS[name].batch_invariant
    assert WEIGHT_FORMATS[name].min_rows > 1
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # The probe decodes these candidates by coupled sampling in one batch, one and five, four and two
        # (sbon.probe.EXACT_SPLITS): float32 activations keep a row's bits on every CPU, bfloat16 where it is native.
        exact = excluded_where_not_exact(name, g)
        assert exact or WEIGHT_FORMATS[name].dtype == torch.bfloat16
        if not exact or threads != 1:
            return
        # On one thread, also one row at a time: where bf16's kernels differ unpadded.
        prefix = g.prefill(g.encode_prompt(PROMPT))
        tokens, logits = decode(g, prefix, range(6), 6)
        parts = [decode(g, prefix, [k], 6) for k in range(6)]
        assert torch.equal(torch.cat([p[0] for p in parts]), tokens)
        assert torch.equal(torch.cat([p[1] for p in parts]), logits)
    finally:
        torch.set_num_threads(before)


def test_the_default_weights_are_the_measured_choice_else_float32(monkeypatch, tmp_path):
    """Before anything is measured a CPU loads float32 (exact on one thread without measuring), a GPU bfloat16; once
    measured, the choice's format; SBON_WEIGHTS forces one."""
    from sbon.machine import Measured, choose, fingerprint, save_choice
    from sbon.models import default_weights
    monkeypatch.setenv("SBON_CACHE", str(tmp_path))
    monkeypatch.delenv("SBON_WEIGHTS", raising=False)
    cpu = torch.device("cpu")
    assert default_weights(cpu, "smollm2-135m") == "fp32" and default_weights(cpu) == "fp32"
    assert default_weights(torch.device("cuda"), "smollm2-135m") == "bf16"
    save_choice(choose("smollm2-135m", fingerprint("cpu"), [Measured("int4", "eager", ms={7: 20.0}, exact=True)]))
    assert default_weights(cpu, "smollm2-135m") == "int4" and default_weights(cpu, "gpt2") == "fp32"
    monkeypatch.setenv("SBON_WEIGHTS", "fp32")  # a server's own choice for its page
    assert default_weights(cpu, "smollm2-135m") == "fp32"
    monkeypatch.setenv("SBON_WEIGHTS", "int2")
    with pytest.raises(SBoNError, match="unknown weights 'int2'"):
        default_weights(cpu)


def test_int4_runs_the_file_s_own_blocks_close_to_bf16(gen_int4, gen_bf16):
    """Every Linear layer but the LM head takes its 4-bit blocks from the GGUF file (each checked against the
    weights the model loaded), and the model's next-token distributions stay those of bf16 (the same weights,
    rounded otherwise) along a bf16 greedy answer."""
    from sbon.int4 import Int4Linear
    layers = gen_int4.model.config.num_hidden_layers
    assert gen_int4.model.int4_layers == {"from_file": 7 * layers, "quantized": 0}
    assert sum(isinstance(m, Int4Linear) for m in gen_int4.model.modules()) == 7 * layers
    assert type(gen_int4.model.get_output_embeddings()) is torch.nn.Linear
    ids = gen_bf16.encode_prompt(PROMPT)
    with torch.inference_mode():
        seq = gen_bf16.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        ref = gen_bf16.model(seq).logits[0].float().log_softmax(-1)
        got = gen_int4.model(seq).logits[0].float().log_softmax(-1)
    kl = (ref.exp() * (ref - got)).sum(-1)
    assert kl.mean() < 0.01 and (ref.argmax(-1) == got.argmax(-1)).float().mean() > 0.95


def test_int4_quantizes_a_model_without_blocks_to_nearest():
    """A weight without a file's blocks: each group of 32 between its minimum and maximum in 15 steps, every
    weight within half a step of its own; a constant group is exact."""
    from sbon.int4 import GROUP, Int4Linear, dequantize, quantize
    torch.manual_seed(0)
    w = torch.randn(64, 4 * GROUP)
    w[3, :GROUP] = 0.25
    q, d, m = quantize(w)
    err = (dequantize(q, d, m) - w).abs()
    assert int(q.min()) == 0 and int(q.max()) == 15
    assert (err <= d.repeat_interleave(GROUP, 1) / 2 + 1e-6).all() and err[3, :GROUP].max() == 0
    layer = Int4Linear(q, d, m, None, torch.bfloat16)
    x = torch.randn(40, 4 * GROUP, dtype=torch.bfloat16)
    full = layer(x)
    assert torch.allclose(full.float(), x.float() @ dequantize(q, d, m).t(), rtol=0.02, atol=0.05)
    # the kernel gives a row the same bits at any batch size (what makes the format batch invariant)
    assert all(torch.equal(layer(x[:rows]), full[:rows]) for rows in range(1, 40))


def test_decode_attention_matches_sdpa_and_leaves_the_prefill_to_it(gen):
    """The CPU's one-query attention (sbon.attention) against torch's SDPA on the same float32 model:
    the prefill goes to SDPA itself (bit for bit), every decode step agrees up to rounding, rows pruned
    midway included (SmolLM2 shares each KV head between three query heads)."""
    from sbon.attention import NAME
    assert gen.model.config._attn_implementation == NAME  # what load_generator sets on a CPU
    logits = {}
    for impl in (NAME, "sdpa"):
        gen.model.set_attn_implementation(impl)
        try:
            prefix = gen.prefill(gen.encode_prompt(PROMPT))
            batch = gen.start(prefix, [0, 1, 2])
            logits[impl] = [prefix.logits, *three_rows_pruned_midway(gen.forward, batch, steps=6, prune_at=3)]
        finally:
            gen.model.set_attn_implementation(NAME)
    assert torch.equal(logits[NAME][0], logits["sdpa"][0])
    for ours, theirs in zip(logits[NAME][1:], logits["sdpa"][1:]):
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-3, rtol=0)


def test_a_kernel_build_killed_midway_does_not_hang_the_next_load():
    """A measuring child killed while it built the attention kernel (the app stopped during its first minute) leaves
    torch's lock file in the kernel's folder: the next process loads the kernel anyway, instead of waiting forever."""
    import subprocess
    import sys

    from sbon.attention import load_kernel
    from sbon.cache import cache_dir

    assert load_kernel() is None  # built (once per machine) and loaded here
    folders = [f for f in (cache_dir() / "kernels").glob("decode_attention-*") if any(f.glob("*.so"))]
    stale = max(folders, key=lambda f: f.stat().st_mtime) / "lock"
    stale.touch()  # what a builder killed midway leaves
    try:
        done = subprocess.run([sys.executable, "-c", "from sbon.attention import load_kernel; print(load_kernel())"],
                              capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    finally:
        stale.unlink(missing_ok=True)  # never left for the suite's other tests
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-1000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_step_s_attention_kernel_reads_the_slab_in_place_and_keeps_each_row_to_itself(gen, dtype):
    """The compiled step's attention kernel (sbon/kernels/decode_attention.cpp) on the real model's cached keys and
    values, read through a view of a longer slab as the compiled step reads them: the eager step's attention up to
    rounding; masked keys (the slab's unwritten end, here NaN) never read; a row's result the same bits alone and
    in a batch, at one thread and at two."""
    from sbon.attention import decode_attention, load_kernel

    assert load_kernel() is None  # a machine with a C++ compiler builds it
    prefix = gen.prefill(gen.encode_prompt(PROMPT))
    layer = prefix.cache.layers[3]
    length = layer.keys.shape[2]
    rows, dim, heads = 5, layer.keys.shape[-1], gen.model.config.num_attention_heads
    slab_k = torch.full((rows, layer.keys.shape[1], length + 40, dim), float("nan"), dtype=dtype)
    slab_v = slab_k.clone()
    g = torch.Generator().manual_seed(0)
    for r in range(rows):  # each row its own keys and values: the prompt's, shuffled
        order = torch.randperm(length, generator=g)
        slab_k[r, :, :length], slab_v[r, :, :length] = layer.keys[0][:, order], layer.values[0][:, order]
    query = (torch.randn(rows, heads, 1, dim, generator=g) * 3).to(dtype)
    mask = (torch.arange(length + 20) < length).view(1, 1, 1, -1)
    keys, values = slab_k[:, :, :length + 20], slab_v[:, :, :length + 20]  # views: the slab's rows are longer
    kernel = torch.ops.sbon.decode_attention
    out = kernel(query.view(rows, heads, dim), keys, values, mask[:, 0, 0], dim ** -0.5)
    eager, _ = decode_attention(None, query, torch.nan_to_num(keys), torch.nan_to_num(values), mask)
    assert out.isfinite().all()
    assert torch.allclose(out.float(), eager.view(rows, heads, dim).float(), atol=2e-2 if dtype == torch.bfloat16 else 1e-5)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for r in range(rows):
                alone = kernel(query[r:r + 1].view(1, heads, dim), keys[r:r + 1], values[r:r + 1], mask[:, 0, 0],
                               dim ** -0.5)
                assert torch.equal(alone[0], out[r])
    finally:
        torch.set_num_threads(threads)


def test_the_attention_kernel_s_weights_are_as_close_to_exact_as_torch_s_float32_softmax():
    """Values one-hot per key make the kernel's output its softmax weights: against float64, over keys at many scales,
    its largest relative error (its own exp, its sums) is no larger than torch's float32 matmul and softmax give.
    (Weights below float32's normal range, under e^-87, the kernel makes 0: those are left out.)"""
    from sbon.attention import load_kernel

    assert load_kernel() is None
    g = torch.Generator().manual_seed(0)
    worst = {"kernel": 0.0, "torch": 0.0}
    for scale in torch.linspace(0.1, 6, 60).tolist():
        keys = torch.randn(1, 1, 64, 64, generator=g) * scale
        query = torch.randn(1, 1, 64, generator=g) * 3
        exact = torch.softmax(keys[0, 0].double() @ query[0, 0].double() * 0.125, 0)
        ours = torch.ops.sbon.decode_attention(query, keys, torch.eye(64).view(1, 1, 64, 64), None, 0.125)[0, 0]
        theirs = torch.softmax(keys[0, 0] @ query[0, 0] * 0.125, 0)
        for name, w in (("kernel", ours), ("torch", theirs)):
            normal = exact > 1e-30
            worst[name] = max(worst[name], ((w.double() - exact).abs() / exact)[normal].max().item())
    assert worst["kernel"] <= 1.5 * worst["torch"], worst


def test_where_the_attention_kernel_does_not_build_the_compiled_step_says_so_in_one_line(gen, monkeypatch, caplog):
    import logging

    import sbon.attention
    import sbon.cpp_kernels
    from sbon.decoders import CompiledDecoder

    monkeypatch.setattr(sbon.cpp_kernels, "build", lambda *args: "does not build here (RuntimeError: no ninja)")
    sbon.attention.load_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="sbon"):
            CompiledDecoder(gen)
        assert not sbon.attention._KERNEL["loaded"]  # what a step traced now reads: it uses the matmuls
        assert [r.getMessage() for r in caplog.records if r.name.startswith("sbon")] == [
            "decode compiled: the attention kernel does not build here (RuntimeError: no ninja); the step's attention "
            "uses matmuls"]
    finally:
        monkeypatch.undo()
        sbon.attention.load_kernel.cache_clear()
        assert sbon.attention.load_kernel() is None and sbon.attention._KERNEL["loaded"]


def test_prepacked_bf16_layers_give_the_plain_layers_bits(gen_bf16):
    """bf16 Linear layers on a CPU run with their weight prepacked once where oneDNN can (sbon.engine.prepack_linears,
    prepackable), the plain call elsewhere. Where the probe measures bf16 exact on this CPU, every layer gives a row
    the same bits at any row count from two (its padding) up; where the CPU computes bfloat16 natively, that is also
    the same kernel on the same numbers as `F.linear` (where bfloat16 is emulated, the plain call takes another
    route). Where the probe does not, the choice excludes bf16."""
    import torch.nn.functional as F

    from sbon.machine import cpu_isa

    from sbon.engine import prepackable

    linears = [m for m in gen_bf16.model.modules() if isinstance(m, torch.nn.Linear)]
    def inner(m):  # the forward the padding wraps
        cells = dict(zip(m.forward.__code__.co_freevars, (c.cell_contents for c in m.forward.__closure__)))
        return cells["forward"]
    if not prepackable(torch.bfloat16):  # oneDNN cannot prepack bfloat16 on this CPU: the plain call, everywhere
        assert linears and not any(inner(m).__name__ == "prepacked_forward" for m in linears)
        return
    assert linears and all(inner(m).__name__ == "prepacked_forward" for m in linears)
    if not excluded_where_not_exact("bf16", gen_bf16):
        return
    native = cpu_isa().endswith("with BF16")
    torch.manual_seed(0)
    with torch.inference_mode():
        for m in (linears[0], linears[5], linears[-1]):  # attention, MLP and the LM head
            x = torch.randn(16, 1, m.in_features, dtype=torch.bfloat16)
            whole = m(x)
            for rows in (1, 2, 5, 16):
                assert torch.equal(m(x[:rows]), whole[:rows])
                assert not native or torch.equal(m(x[:rows]), F.linear(x[:rows], m.weight))


def test_layers_with_the_same_weights_share_one_prepacked_copy_until_the_last_goes():
    """Prepacked weights are keyed by their bytes (a compiled graph holds the key, so it must be the same in every
    process): a model loaded twice shares them, and they are freed with the last layer that uses them (float32
    layers, which every CPU prepacks)."""
    import gc

    from sbon.engine import _PACKED, prepack_linears

    torch.manual_seed(0)
    first = torch.nn.Linear(64, 32, bias=False)
    second = torch.nn.Linear(64, 32, bias=False)
    second.weight.data.copy_(first.weight.data)
    other = torch.nn.Linear(64, 32, bias=False)
    before = len(_PACKED)
    prepack_linears(first)
    prepack_linears(second)
    prepack_linears(other)
    assert len(_PACKED) == before + 2
    x = torch.randn(3, 64)
    assert torch.equal(first(x), second(x)) and not torch.equal(first(x), other(x))
    del first
    gc.collect()
    assert len(_PACKED) == before + 2 and torch.equal(second(x), x @ second.weight.t())
    del second, other
    gc.collect()
    assert len(_PACKED) == before


def test_the_nucleus_widens_row_by_row_and_matches_a_full_sort():
    """Top-p looks among the 64, then 1024 most likely tokens, then the sorted vocabulary (NUCLEUS_WIDTHS),
    each row on its own: the token is the one a full sort gives, and a flat row next to peaked ones gets
    the token it gets alone."""
    from sbon.engine import NUCLEUS_WIDTHS

    def full_sort(logits, uniforms, cfg):
        probs, order = torch.softmax(logits.float() / cfg.temperature, -1).sort(-1, descending=True)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= cfg.top_p, 0)
        cdf = probs.double().cumsum(-1)
        picked = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True)
        return order.gather(-1, picked).squeeze(-1)

    torch.manual_seed(0)
    cfg = SamplingConfig(temperature=0.8, top_p=0.95)
    scales = torch.tensor([20.0, 3.5, 1.0, 0.05])  # nucleus in the top 64, in the top 1024, wider, near-uniform
    logits = torch.randn(4, 49152) * scales[:, None]
    uniforms = torch.rand(4, dtype=torch.float64)
    probs = torch.softmax(logits / cfg.temperature, -1).sort(-1, descending=True).values.cumsum(-1)
    widths = (probs < cfg.top_p).sum(-1) + 1  # tokens in each row's nucleus
    assert widths[0] <= NUCLEUS_WIDTHS[0] < widths[1] <= NUCLEUS_WIDTHS[1] < widths[2]
    picked = sample(logits, uniforms, cfg)
    assert torch.equal(picked, full_sort(logits, uniforms, cfg))
    for i in range(4):
        assert torch.equal(sample(logits[i:i + 1], uniforms[i:i + 1], cfg), picked[i:i + 1])
    # A GPU's way, the whole vocabulary sorted at once: the same tokens
    probs = torch.softmax(logits / cfg.temperature, -1)
    assert torch.equal(_pick_sorted(probs, uniforms, cfg.top_p), picked)


def test_the_gpu_s_full_sort_gives_a_row_its_own_token_among_ties_whatever_its_batch():
    """bfloat16 logits tie often; the GPU's top-p (one stable sort of the vocabulary) orders tied tokens by id, so a
    row's token does not depend on the rows beside it or on its place among them."""
    torch.manual_seed(1)
    logits = (torch.randn(6, 49152) * 0.5).to(torch.bfloat16)  # flat rows, thousands of ties each
    probs = torch.softmax(logits.float() / 0.8, -1)
    assert probs[0].unique().numel() < probs.shape[-1] // 4
    uniforms = torch.rand(6, dtype=torch.float64)
    together = _pick_sorted(probs, uniforms, 0.95)
    reversed_ = _pick_sorted(probs.flip(0), uniforms.flip(0), 0.95).flip(0)
    alone = torch.cat([_pick_sorted(probs[i:i + 1], uniforms[i:i + 1], 0.95) for i in range(6)])
    assert torch.equal(together, alone) and torch.equal(together, reversed_)
    # tied tokens in id order: the token of numpy's stable argsort
    for i in range(6):
        p = probs[i].double().numpy()
        order = np.argsort(-p, kind="stable")
        kept = p[order] * ((np.cumsum(p[order]) - p[order]) < 0.95)
        cdf = np.cumsum(kept)
        assert together[i] == order[min(np.searchsorted(cdf, uniforms[i].item() * cdf[-1], side="right"), len(p) - 1)]


def test_a_model_bound_for_a_gpu_is_neither_prepacked_nor_given_the_cpu_attention():
    """On a ZeroGPU Space the weights of a model bound for the GPU stay in CPU memory at load time: what the
    format does follows the device asked for, not where the weights are now."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from sbon.attention import NAME, use_decode_attention

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    config._attn_implementation = "sdpa"
    for device, packed in ((torch.device("cuda"), False), (torch.device("cpu"), True)):
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        model = use_decode_attention(WEIGHT_FORMATS["bf16"].prepare(model, device), device)
        layer = model.model.layers[0].self_attn.q_proj
        assert ("forward" in vars(layer)) == packed  # the instance's own forward: prepacked and padded
        assert (model.config._attn_implementation == NAME) == packed


def test_a_static_kv_slab_gives_the_growable_cache_s_logits(gen_bf16):
    """The compiled step's cache (sbon.static_cache), run eagerly: three rows (in the CUDA-graph layout a
    power-of-two bucket, padding rows dropped), a row pruned midway (compacted in place, the slab never reallocated), the view read to the written
    length: the growable cache's logits bit for bit. Read to the slab's whole length with its end masked (the
    CUDA-graph layout): the same up to rounding."""
    from sbon.decoders import CompiledDecoder, EagerDecoder

    prefix = gen_bf16.prefill(gen_bf16.encode_prompt(PROMPT))
    logits = {}
    for name, dec in (("eager", EagerDecoder(gen_bf16)), ("slab", CompiledDecoder(gen_bf16, graphs=False, compile=False)),
                      ("graph", CompiledDecoder(gen_bf16, graphs=True, compile=False))):
        batch = dec.start(prefix, [0, 1, 2], False, 8)
        slab = batch.cache.layers[0].slab_keys if name != "eager" else None
        out = three_rows_pruned_midway(dec.forward, batch, steps=5, prune_at=2)
        if slab is not None:
            layer = batch.cache.layers[0]
            # three rows: on the CPU three, in the CUDA-graph layout a bucket of four
            assert layer.slab_keys is slab and slab.shape[0] == (4 if name == "graph" else 3) and layer.keys.shape[0] == 2
        logits[name] = out
    assert all(torch.equal(a, b) for a, b in zip(logits["eager"], logits["slab"]))
    assert all(torch.allclose(a.float(), b.float(), atol=0.1, rtol=0) for a, b in zip(logits["eager"], logits["graph"]))


def test_a_slab_takes_the_kv_tokens_the_run_s_memory_check_counts(gen_bf16):
    """sbon.algorithms.fitting counts a static slab's KV tokens before the run (decoder.slab_tokens): the slab a
    batch then takes holds that many, on a CPU and in the CUDA-graph layout."""
    from sbon.cuda_graphs import GraphDecoder
    from sbon.decoders import CompiledDecoder, _step

    prefix = gen_bf16.prefill(gen_bf16.encode_prompt(PROMPT))
    for dec in (CompiledDecoder(gen_bf16, graphs=False, compile=False), GraphDecoder(gen_bf16, _step)):
        for rows, new in ((3, 8), (20, 100)):
            counted = dec.slab_tokens(rows, len(prefix.prompt_ids), new)
            layer = dec.start(prefix, list(range(rows)), False, new).cache.layers[0]
            assert counted == layer.slab_keys.shape[0] * layer.slab_keys.shape[2]


def test_int4_blocks_are_the_float32_copy_s_weights(gen):
    """The GGUF file's Q4_1 blocks as sbon.int4 reads them (rows in `transformers`' order; from the file the first
    time on a machine, then from sbon's cache), dequantized: the float32 copy's weights bit for bit, every row of
    every Linear layer but the LM head (a load checks a sample of rows)."""
    from sbon.cache import cache_dir
    from sbon.int4 import dequantize, gguf_blocks
    from sbon.models import GENERATORS, _package_dir

    preset = GENERATORS["smollm2-135m"]
    blocks = gguf_blocks(_package_dir(preset.package) / preset.gguf_file, gen.model.config)
    assert list((cache_dir() / "int4-blocks").glob(f"{Path(preset.gguf_file).stem}-*.safetensors"))
    modules = dict(gen.model.named_modules())
    assert len(blocks) == 7 * gen.model.config.num_hidden_layers
    assert all(b[0].dtype == torch.int32 for b in blocks.values())
    assert all(torch.equal(dequantize(*b), modules[name].weight.cpu()) for name, b in blocks.items())


def test_two_loads_at_once_read_a_gguf_file_s_blocks_once(tmp_path, monkeypatch):
    """The app and a command line started together on a fresh machine: the second load waits for the blocks the
    first reads from the GGUF file and keeps in sbon's cache, instead of reading them too on the same cores."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from sbon.int4 import _kept

    monkeypatch.setenv("SBON_CACHE", str(tmp_path))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    reads, both = [], threading.Barrier(2)

    def read():
        reads.append(threading.get_ident())
        time.sleep(0.5)  # the other load asks meanwhile
        return {"w": torch.arange(6.0)}

    def load(_):
        both.wait()
        return _kept(path, "blocks", "the blocks", read)

    with ThreadPoolExecutor(2) as pool:
        loaded = list(pool.map(load, range(2)))
    assert len(reads) == 1 and all(torch.equal(one["w"], torch.arange(6.0)) for one in loaded)


def test_the_file_s_8_bit_head_is_the_float32_copy_s_lm_head_and_is_read_from_the_file_once(gen, monkeypatch):
    """The GGUF file's Q8_0 LM head as sbon.int4 reads it, dequantized: the float32 copy's LM head bit for bit; once
    read, later loads take it from sbon's cache without parsing the file again (seconds each, for its vocabulary)."""
    import gguf

    from sbon.int4 import dequantize, gguf_q8_0_head
    from sbon.models import GENERATORS, _package_dir

    preset = GENERATORS["smollm2-135m"]
    path = _package_dir(preset.package) / preset.gguf_file
    q, d = gguf_q8_0_head(path)
    assert q.dtype == torch.int8
    assert torch.equal(dequantize(q, d), gen.model.get_output_embeddings().weight.detach().cpu())

    def unread(*args, **kwargs):
        raise AssertionError("the GGUF file was parsed again")
    monkeypatch.setattr(gguf, "GGUFReader", unread)
    again = gguf_q8_0_head(path)
    assert torch.equal(again[0], q) and torch.equal(again[1], d)


def test_a_run_records_the_weight_format_and_decode_step_its_texts_came_from(gen_int4):
    from sbon.algorithms import RunConfig, events, run
    from sbon.results import RunResult
    from sbon.rewards import CallableReward

    result = run(events(gen_int4, CallableReward(lambda prompt, responses: [0.0] * len(responses)), PROMPT,
                        RunConfig(method="bon", n=2, max_new_tokens=4)))
    assert (result.weights, result.decode) == ("int4", "eager")
    again = RunResult.from_dict(json.loads(result.to_json()))
    assert (again.weights, again.decode) == ("int4", "eager")


def test_every_batch_invariant_format_is_checked_bit_for_bit():
    checked = {name for name, _ in test_a_rows_logits_do_not_depend_on_its_batch.pytestmark[0].args[1]}
    assert checked == {name for name, fmt in WEIGHT_FORMATS.items() if fmt.batch_invariant}


def test_int4_fp32_runs_the_int4_layers_in_float32_around_the_4_bit_kernel(gen_int4_fp32, gen_int4):
    """The format for CPUs without bfloat16 matmuls: the same 4-bit blocks as int4, everything else (the LM head
    included) in float32, prepacked; its logits close to int4's."""
    from sbon.int4 import KERNEL_DTYPE, Int4Linear

    model = gen_int4_fp32.model
    int4 = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert model.int4_layers == gen_int4.model.int4_layers and model.int4_layers["quantized"] == 0
    assert all(m.scales.dtype == KERNEL_DTYPE for m in int4) and model.dtype == torch.float32
    assert model.get_output_embeddings().weight.dtype == torch.float32
    prefix = gen_int4_fp32.prefill(gen_int4_fp32.encode_prompt(PROMPT))
    _, logits = decode(gen_int4_fp32, prefix, range(2), 3)
    assert logits.dtype == torch.float32
    _, reference = decode(gen_int4, gen_int4.prefill(gen_int4.encode_prompt(PROMPT)), range(2), 3)
    assert (logits[:, 0].argmax(-1) == reference[:, 0].float().argmax(-1)).all()


@pytest.mark.parametrize("kernel", ["bf16dot", "amx", "fma"])
def test_sbon_s_4_bit_kernel_gives_each_row_its_own_bits_close_to_the_exact_product(kernel):
    """sbon's 4-bit kernels (int4-bf16dot's, int4-amx's, int4-fma's) on blocks quantized here: within their activations' rounding
    of the float32 product with the dequantized weights, at least as close as torch's 4-bit kernel; their 8-bit twins
    (the formats' LM heads) within float32 rounding; and for both a row's bits the same at every row count (across
    tiles of up to 8 or 16 rows and 1 to 4 column blocks), on one thread and on two. Where the CPU lacks the kernel's
    vectors, the layer is refused in one line that says so and names the format to use instead."""
    from sbon.int4 import GROUP, KERNELS, Int4Linear, Int8Head, dequantize, quantize
    spec = KERNELS[kernel]
    dtype = spec.activations
    torch.manual_seed(0)
    # 80 columns (torch's kernel takes multiples of 16): 5 or 10 of the kernel's column blocks, every tile width on one
    # thread and on two
    w = torch.randn(80, 3 * GROUP) * 0.05
    q, d, m = quantize(w)
    if spec.problem():
        assert not spec.has() or "does not build" in spec.problem()
        with pytest.raises(SBoNError, match=f"{spec.weights} weights: .*; use {spec.instead}$"):
            Int4Linear(q, d, m, None, dtype, kernel=kernel)
        return
    layer = Int4Linear(q, d, m, None, dtype, kernel=kernel)
    aten = Int4Linear(q, d, m, None, dtype)
    x = torch.randn(20, 3 * GROUP, dtype=dtype)
    dequantized = dequantize(q, d.half().float(), m.half().float()).double()
    exact = x.double() @ dequantized.t()
    magnitude = x.double().abs() @ dequantized.abs().t()  # each sum's absolute products: what its rounding scales with
    full = layer(x)
    assert full.dtype == dtype and full.shape == (20, 80)
    err, aten_err = (full.double() - exact).abs(), (aten(x).double() - exact).abs()
    assert (err <= 4 * torch.finfo(dtype).eps * magnitude).all() and err.max() <= aten_err.max() * 1.5
    # Its 8-bit twin (the format's LM head, Q8_0 blocks): float32 out, within float32 rounding of the exact product.
    q8 = torch.randint(-128, 128, (80, 3 * GROUP), dtype=torch.int8)
    d8 = torch.rand(80, 3) / 100
    head = Int8Head(q8, d8, kernel)
    w8 = (q8.double().reshape(-1, 3, GROUP) * d8.half().double()[..., None]).reshape(q8.shape)
    logits = head(x)
    assert logits.dtype == torch.float32 and torch.allclose(logits.double(), x.double() @ w8.t(), rtol=1e-5, atol=1e-4)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for op, out in ((layer, full), (head, logits)):
                assert all(torch.equal(op(x[:rows]), out[:rows]) for rows in range(1, 21))
                assert all(torch.equal(op(x[r:r + 1])[0], out[r]) for r in range(20))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("weights, reference, kl_at_most", [("int4-bf16dot", "int4", 0.01), ("int4-amx", "int4", 0.01),
                                                             ("int4-fma", "fp32", 1e-4)])
def test_sbon_s_kernels_take_the_file_s_blocks_and_stay_close_to_their_reference(weights, reference, kl_at_most,
                                                                                   request):
    """The same 4-bit blocks from the GGUF file and its 8-bit LM head (Q8_0, checked against the weights the model
    loaded), multiplied by sbon's kernels; the next-token distributions along a greedy answer those of the reference
    format: int4's for int4-bf16dot and int4-amx (the same weights, summed in another order), the float32 model's for int4-fma (the
    file's weights widened to float32, as fp32 loads them, and float32 products)."""
    from sbon.int4 import Int4Linear, Int8Head
    fmt, ref_gen = loaded_here(weights), loaded_here(reference)
    model = fmt.model
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert model.int4_layers == {"from_file": len(layers), "quantized": 0, "head": "8-bit, from the file"}
    assert layers and all(m.kernel == layers[0].kernel != "aten" for m in layers)
    assert isinstance(model.get_output_embeddings(), Int8Head)
    assert model.get_input_embeddings().weight.dtype == WEIGHT_FORMATS[weights].dtype
    ids = ref_gen.encode_prompt(PROMPT)
    with torch.inference_mode():
        seq = ref_gen.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        ref = ref_gen.model(seq).logits[0].float().log_softmax(-1)
        got = model(seq).logits[0].float().log_softmax(-1)
    kl = (ref.exp() * (ref - got)).sum(-1)
    assert kl.mean() < kl_at_most and (ref.argmax(-1) == got.argmax(-1)).float().mean() > 0.95


def test_a_gemma_model_s_saved_step_can_be_named():
    """Gemma's embedding scale is a 0-d buffer: the weights' hash (part of the saved step's name) reads its value too,
    instead of failing and leaving every Gemma generator to trace its step in each process."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    from sbon.aot_step import weights_hash

    config = Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, vocab_size=128)
    hashes = []
    for scale in (1.0, 2.0):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        scales = [t for t in model.buffers() if t.dim() == 0]
        assert scales  # the case under test: a 0-d buffer
        for t in scales:
            t.fill_(scale)
        hashes.append(weights_hash(model))
    assert hashes[0] != hashes[1]
