"""Attention for the decode step on a CPU, and for the steps a CUDA graph records: one query token per row, read
straight from the KV cache.

Why: in a decode step each row attends with a single query to its own cached keys. torch's SDPA
kernel for the CPU is built for long queries; at one query and a few hundred keys its set-up costs
more than the arithmetic (`python -m benchmarks step` times the step with each attention:
benchmarks/results/*/step). Two batched matmuls and a softmax do the same work, and
grouped-query heads are folded into the query instead of repeating the keys, so no KV copy is made. The compiled
step calls a kernel of its own instead (``sbon::decode_attention``, sbon/kernels/decode_attention.cpp, built once per
machine by :func:`load_kernel`): inductor compiles the matmuls into copies of every layer's keys and values out of
the KV slab at every step, where the kernel reads them in place.

Registered with `transformers`' AttentionInterface as ``sbon_decode``; anything that is not a plain
one-query step (a prefill, a mask, a sliding window, a soft cap, attention weights asked for) goes to
`transformers`' own SDPA function, so a model gives the same results there as with ``sdpa``.
Each row's result depends only on that row (batched matmuls over rows), which keeps the coupled
sampling exact: tests/test_step_formats.py checks it bit for bit.

On a GPU the model keeps SDPA, whose kernels are exact for a growable cache, and only the step a CUDA graph records
reads through this function (``one_query_steps``): over a masked static slab SDPA cannot take its flash kernel, and
the kernel it took instead gave one row different bits from one run to the next on an H200, so that Best-of-N's
candidate and its Speculative Rejection twin drifted apart (benchmarks/results/gpu-h200/NOTE.md).
"""

from __future__ import annotations

import functools
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

import torch

NAME = "sbon_decode"

# Keyword arguments whose presence means the model needs more than plain softmax attention.
_NEEDS_SDPA = ("sliding_window", "softcap", "s_aux", "position_bias")

# The kernel's schema, with the shape function `torch.compile` traces it with; its CPU code is registered when the
# kernel is built and loaded (load_kernel).
_LIB = torch.library.Library("sbon", "FRAGMENT")
# flexible_layout: the kernel reads any strides, so inductor passes the cache's views of the slab as they are (by
# default it copies them to the strides they had when traced).
_LIB.define("decode_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale) -> Tensor",
            tags=(torch.Tag.flexible_layout,))


@torch.library.register_fake("sbon::decode_attention", lib=_LIB)
def _(query, key, value, mask, scale):
    return query.new_empty(query.shape)


# The shapes sbon/kernels/decode_attention.cpp is built for (the head sizes its dispatch takes, its MAX_GROUP); others
# use the matmuls.
KERNEL_HEAD_SIZES = (32, 64, 128)
KERNEL_MAX_GROUP = 8

# Where load_kernel found the kernel ready: steps compiled after it call it (read while a step is traced).
_KERNEL = {"loaded": False}


@functools.cache
def load_kernel() -> str | None:
    """Build (once per machine) and load the compiled step's attention kernel: None, or the one-line reason it does
    not build here (the compiled step then uses the eager step's matmuls). Its vector instructions are those torch's
    own CPU kernels use here (an emulated CPU class's included)."""
    from .cpp_kernels import build
    vectors = {"AVX512": ("-mavx512f", "-mavx2", "-mfma", "-mf16c"), "AVX2": ("-mavx2", "-mfma", "-mf16c")}
    problem = build("decode_attention", ("-O3", *vectors.get(torch.backends.cpu.get_cpu_capability(), ())),
                    "the compiled step's attention")
    _KERNEL["loaded"] = problem is None
    return problem


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """query (rows, heads, 1, d), key/value (rows, kv_heads, length, d) -> (rows, 1, heads, d)."""
    rows, heads, q_len, dim = query.shape
    slab = attention_mask is not None and attention_mask.dtype == torch.bool and attention_mask.shape[-2] == 1
    if (q_len != 1 or (attention_mask is not None and not slab) or dropout or kwargs.get("output_attentions")
            or any(kwargs.get(name) is not None for name in _NEEDS_SDPA)):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kv_heads = key.shape[1]
    scale = dim ** -0.5 if scaling is None else scaling
    if (_KERNEL["loaded"] and torch.compiler.is_compiling() and dim in KERNEL_HEAD_SIZES
            and heads // kv_heads <= KERNEL_MAX_GROUP and query.dtype == key.dtype == value.dtype
            and query.dtype in (torch.float32, torch.bfloat16)):
        out = torch.ops.sbon.decode_attention(query.reshape(rows, heads, dim), key, value,
                                              attention_mask[:, 0, 0, :] if slab else None, scale)
        return out.view(rows, 1, heads, dim), None
    grouped = query.view(rows, kv_heads, heads // kv_heads, dim)  # query heads that share one KV head
    # keys @ query^T, transposed: the same numbers as query @ keys^T, but the cache's rows (a view into a
    # longer buffer) are read in place, where the other order copies them first
    scores = torch.matmul(key, grouped.transpose(-1, -2)).transpose(-1, -2) * scale
    if slab:  # a static KV slab (sbon.static_cache): its rows are read to their full length, the unwritten end masked
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(weights, value)  # (rows, kv_heads, group, d)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2), None


@functools.cache
def register() -> None:
    """Register :func:`decode_attention` with `transformers` as NAME, once, when a model is first switched to it:
    importing this module (and the command line, whose help needs it) does not import `transformers`' model stack,
    seconds of imports."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # masks are built as for sdpa (None for a plain step)


def switchable(model: torch.nn.Module) -> bool:
    """Whether the model's attention is SDPA reached through `transformers`' AttentionInterface, so that naming
    :func:`decode_attention` in its config makes it read through it: where the class says so
    (``_supports_attention_backend``), or where its modeling module looks its attention up there (StableLM's does,
    without the flag). A model that calls SDPA itself (Falcon up to transformers 5.24) reads its config's name only to
    choose between its own code paths: named ``sbon_decode`` it takes its eager path, which adds the boolean mask
    built for SDPA to its scores as numbers, so that a step over a static slab attends to the slab's unwritten end,
    and its logits drift from the first step."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != "sdpa":
        return False
    module = sys.modules.get(type(model).__module__)
    return bool(getattr(model, "_supports_attention_backend", False)) or hasattr(module, "ALL_ATTENTION_FUNCTIONS")


def use_decode_attention(model: torch.nn.Module, device: torch.device | None = None) -> torch.nn.Module:
    """Switch a model bound for the CPU (``device``, default: where its weights are) from SDPA to
    :func:`decode_attention` where it can be (``switchable``); other devices and models (eager-only architectures,
    flash attention, SDPA called by the model's own code) are left as they are."""
    register()
    on_cpu = (device or next(model.parameters()).device).type == "cpu"
    if on_cpu and switchable(model):
        model.set_attn_implementation(NAME)
    return model


# Models switched by one_query_steps now: id(config) -> blocks inside (two threads may be: the runs' and one that
# builds graphs beside them), so that the first to leave does not switch the model back under the other.
_SWITCHED: dict[int, int] = {}
_SWITCHING = threading.Lock()


@contextmanager
def one_query_steps(model: torch.nn.Module) -> Iterator[None]:
    """For the block, a model whose attention is SDPA reads its plain one-query steps through
    :func:`decode_attention` (anything else still goes to SDPA from there) where it can (``switchable``); other
    models as they are. What a CUDA graph records its step under (see the module's docstring). Blocks on several
    threads at once may nest: the model reads SDPA again when the last one ends."""
    config = getattr(model, "config", None)
    register()
    with _SWITCHING:
        switched = id(config) in _SWITCHED or switchable(model)
        if switched:
            config._attn_implementation = NAME  # read at every call; sub-configs follow
            _SWITCHED[id(config)] = _SWITCHED.get(id(config), 0) + 1
    try:
        yield
    finally:
        if switched:
            with _SWITCHING:
                _SWITCHED[id(config)] -= 1
                if not _SWITCHED[id(config)]:
                    del _SWITCHED[id(config)]
                    config._attn_implementation = "sdpa"
