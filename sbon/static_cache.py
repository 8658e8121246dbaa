"""A static KV slab: every layer's keys and values in one buffer allocated once per batch, rows x maximum length.

Why: a compiled decode step (sbon.decoders) and a CUDA graph need the cache's memory to stay where it is,
and `transformers`' growable caches reallocate as rows grow and leave. Here a batch's slab is allocated when the
batch starts (the prompt's KV copied to every row) and never again: a new token is written in place, and when
candidates finish or are pruned the live rows are compacted to the front of the slab by index
(``batch_select_indices``), in the order they keep. The layers expose a view of the slab: the live rows (or more:
padding rows, whose results are dropped) and the written tokens (or, where shapes must not change, as in a CUDA
graph, the whole length, the unwritten end masked by `transformers`' causal mask). The one-query attention
(``sbon_decode``) reads that view in place.

Memory accounting does not change: the algorithms count prompt + generated tokens of live candidates, which is
what the view holds; the slab itself is sized for the batch's first rows and the run's maximum length.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer


class SlabLayer(StaticLayer):
    """One layer's slab (capacity rows, kv heads, max_len, head dim) and the view the model reads."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int, max_len: int):
        super().__init__(max_len)
        _, heads, length, dim = keys.shape
        self.device, self.dtype = keys.device, keys.dtype
        self.batch_size, self.num_heads, self.k_head_dim, self.v_head_dim = capacity, heads, dim, values.shape[-1]
        # Normal tensors, also where a batch is opened in inference mode: a saved compiled step's guards hold the
        # kind of tensor it was compiled with, and an inference tensor would fail them (the step traced again).
        with torch.inference_mode(False):
            self.slab_keys = keys.new_zeros(capacity, heads, max_len, dim)
            self.slab_values = values.new_zeros(capacity, heads, max_len, values.shape[-1])
            self.cumulative_length = torch.tensor(length, device=keys.device)
        if self.device.type == "cuda":  # one tensor for the slab's life: marked once (see view)
            torch._dynamo.mark_static_address(self.cumulative_length, guard=False)
        self.is_initialized = True
        self.load(keys, values)

    def load(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Start again from a prefix of one row, copied to every row (what lies beyond it stays, masked)."""
        length = keys.shape[-2]
        self.slab_keys[:, :, :length] = keys  # a prefix of one row broadcasts to every row
        self.slab_values[:, :, :length] = values
        self.cumulative_length.fill_(length)
        self.length, self.rows = length, self.slab_keys.shape[0]
        self.view(self.rows, length)

    def view(self, rows: int, length: int) -> None:
        """What the model reads: the first ``rows`` rows, ``length`` tokens (written ones, and the next)."""
        self.keys, self.values = self.slab_keys[:rows, :, :length], self.slab_values[:rows, :, :length]
        if self.device.type == "cuda":
            # A CUDA graph may write only into inputs it knows stay where they are; unguarded, so that a new view
            # of the same slab is no reason to compile again.
            for t in (self.keys, self.values):
                torch._dynamo.mark_static_address(t, guard=False)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2], 0

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep these rows, in this order, at the front of the slab (no reallocation of the slab)."""
        rows = len(indices)
        self.slab_keys[:rows] = self.slab_keys.index_select(0, indices)
        self.slab_values[:rows] = self.slab_values.index_select(0, indices)
        self.rows = rows
        self.view(rows, self.length)

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a KV slab has a fixed number of rows")

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a KV slab is not cropped")


class SlabCache(Cache):
    """The KV slabs of every layer of one batch (see the module's docstring)."""

    def __init__(self, prefix: Cache, capacity: int, max_len: int):
        super().__init__(layers=[SlabLayer(layer.keys, layer.values, capacity, max_len) for layer in prefix.layers])

    def load(self, prefix: Cache) -> None:
        """Start a new batch in the same slab (a CUDA graph's addresses stay): the prefix copied to every row."""
        for layer, source in zip(self.layers, prefix.layers):
            layer.load(source.keys, source.values)

    @property
    def capacity(self) -> int:
        return self.layers[0].slab_keys.shape[0]

    @property
    def max_len(self) -> int:
        return self.layers[0].slab_keys.shape[2]

    @property
    def rows(self) -> int:
        return self.layers[0].rows

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].length

    def get_query_offset(self, layer_idx: int = 0) -> torch.Tensor:
        # a tensor, as in `transformers`' StaticCache: a compiled step is not specialised to one length
        return self.layers[layer_idx].cumulative_length

    def prepare(self, rows: int, length: int | None = None) -> None:
        """Before a step: the model reads ``rows`` rows (live ones first) and ``length`` tokens (default: the
        written ones and the one the step writes); the step writes at the current length."""
        for layer in self.layers:
            layer.cumulative_length.fill_(layer.length)
            layer.view(rows, length or layer.length + 1)

    def advance(self, tokens: int = 1, views: bool = True) -> None:
        """After a step: ``tokens`` more are written in every live row; the view goes back to the live rows
        (``views=False``: not yet; a CUDA graph reads the slab itself, and whatever reads the views next makes them)."""
        for layer in self.layers:
            layer.length += tokens
            if views:
                layer.view(layer.rows, layer.length)
