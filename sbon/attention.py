"""Attention for the decode step on a CPU: one query token per row, read straight from the KV cache.

Why: in a decode step each row attends with a single query to its own cached keys. torch's SDPA
kernel for the CPU is built for long queries; at one query and a few hundred keys its set-up costs
more than the arithmetic (`python -m benchmarks step` times the step with each attention:
benchmarks/results/*/step). Two batched matmuls and a softmax do the same work (in the compiled step, products and
sums that inductor fuses into loops over the cache), and grouped-query heads are folded into the query instead of
repeating the keys, so no KV copy is made.

Registered with `transformers`' AttentionInterface as ``sbon_decode``; anything that is not a plain
one-query step (a prefill, a mask, a sliding window, a soft cap, attention weights asked for) goes to
`transformers`' own SDPA function, so a model gives the same results there as with ``sdpa``.
Each row's result depends only on that row (batched matmuls over rows), which keeps the coupled
sampling exact: tests/test_step_formats.py checks it bit for bit.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "sbon_decode"

# Keyword arguments whose presence means the model needs more than plain softmax attention.
_NEEDS_SDPA = ("sliding_window", "softcap", "s_aux", "position_bias")


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """query (rows, heads, 1, d), key/value (rows, kv_heads, length, d) -> (rows, 1, heads, d)."""
    rows, heads, q_len, dim = query.shape
    slab = attention_mask is not None and attention_mask.dtype == torch.bool and attention_mask.shape[-2] == 1
    if (q_len != 1 or (attention_mask is not None and not slab) or dropout or kwargs.get("output_attentions")
            or any(kwargs.get(name) is not None for name in _NEEDS_SDPA)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kv_heads = key.shape[1]
    scale = dim ** -0.5 if scaling is None else scaling
    if torch.compiler.is_compiling():
        # Compiled (sbon.decoders): products and sums, which inductor fuses into loops that read the cache's view of
        # the slab in place (its matmuls copied every layer's keys and values out of the slab at every step, a cost
        # that grew with the length), rounded where the matmuls below round. Each row's sums are its own, in one
        # order at any row count.
        grouped = query.view(rows, kv_heads, heads // kv_heads, 1, dim).float()
        scores = (key.unsqueeze(2).float() * grouped).sum(-1).to(query.dtype) * scale  # (rows, kv_heads, group, length)
        if slab:  # a static KV slab: its rows are read to their full length, the unwritten end masked
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        out = (weights.unsqueeze(-1).float() * value.unsqueeze(2).float()).sum(-2).to(value.dtype)  # (rows, kv_heads, group, d)
        return out.reshape(rows, heads, 1, dim).transpose(1, 2), None
    grouped = query.view(rows, kv_heads, heads // kv_heads, dim)  # query heads that share one KV head
    # keys @ query^T, transposed: the same numbers as query @ keys^T, but the cache's rows (a view into a
    # longer buffer) are read in place, where the other order copies them first
    scores = torch.matmul(key, grouped.transpose(-1, -2)).transpose(-1, -2) * scale
    if slab:  # a static KV slab (sbon.static_cache): its rows are read to their full length, the unwritten end masked
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(weights, value)  # (rows, kv_heads, group, d)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2), None


AttentionInterface.register(NAME, decode_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # masks are built as for sdpa (None for a plain step)


class RotaryTable(torch.nn.Module):
    """A model's rotary embedding (``default`` type) read from a table of its own cos and sin, one row per position.

    Why: in the compiled step inductor computes the query's rotation inside the attention's loop over the cached
    keys, once per key; from a table that is two loads, where the model's own module computes a cosine and a sine.
    The table holds what that module computes (position times its frequencies, the cosine and sine, its scaling), for
    every position it was built for, so a step gets the same numbers either way."""

    def __init__(self, rotary: torch.nn.Module, positions: int):
        super().__init__()
        with torch.no_grad():
            cos, sin = rotary(rotary.inv_freq.new_zeros((), dtype=torch.float32),
                              torch.arange(positions, device=rotary.inv_freq.device)[None])
        self.register_buffer("cos", cos[0], persistent=False)
        self.register_buffer("sin", sin[0], persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[position_ids].to(x.dtype), self.sin[position_ids].to(x.dtype)


def use_decode_attention(model: torch.nn.Module, device: torch.device | None = None) -> torch.nn.Module:
    """Switch a model bound for the CPU (``device``, default: where its weights are) from SDPA to
    :func:`decode_attention`, and its rotary embedding, where it is of the ``default`` type, to a
    :class:`RotaryTable` of it; other devices and models whose attention is not SDPA (eager-only
    architectures, flash attention) are left as they are."""
    config = getattr(model, "config", None)
    on_cpu = (device or next(model.parameters()).device).type == "cpu"
    if on_cpu and getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
        base = getattr(model, "model", None)
        rotary = getattr(base, "rotary_emb", None)
        positions = getattr(config, "max_position_embeddings", None)
        if getattr(rotary, "rope_type", None) == "default" and isinstance(positions, int) and hasattr(rotary, "inv_freq"):
            base.rotary_emb = RotaryTable(rotary, positions)
    return model
