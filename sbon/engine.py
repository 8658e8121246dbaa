"""The generation engine: many candidates for one prompt, over any `transformers` causal LM.

The prompt is prefilled once; its KV cache is copied to one row per candidate. Every candidate
then advances one token per step, so all rows always have the same length: no padding and no
attention mask are needed. Rows leave the cache in place (``DynamicCache.batch_select_indices``)
when their candidate finishes or is pruned, so the cost of a step tracks the live candidates.

Sampling is *coupled*: candidate k takes its random numbers from its own stream, seeded by
(seed, k), one uniform number per token. Its text therefore does not depend on which other
candidates share the batch, and Speculative Rejection's survivors are exactly the Best-of-N
candidates with the same ids.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import weakref
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from .errors import SBoNError

log = logging.getLogger(__name__)

# The keyword a model's forward takes its KV cache by, and the output field it returns it in: transformers 5.24 renamed
# both from `past_key_values` to `cache` (the old name deprecated, to be removed in 5.40); earlier 5.x know only the old.
CACHE_KEYWORD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

# End-of-turn markers used by common chat templates, beside the model's own EOS id(s).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>", "<|endoftext|>")


def _cuda_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    if not torch.cuda.is_available():
        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        return (f"device {device} asked for, but torch {torch.__version__} ({build}) sees no CUDA GPU: use --device cpu, "
                "or run on a machine with an NVIDIA GPU and a CUDA build of torch")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return f"device {device} asked for, but only {torch.cuda.device_count()} CUDA GPU(s) are visible: use cuda:0"
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return (f"{torch.cuda.get_device_name(index)} cannot run bfloat16: use --dtype float16 (or float32)")
    return None


def _mps_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    if not torch.backends.mps.is_available():
        return f"device {device} asked for, but torch sees no Apple GPU (MPS): use --device cpu"
    return None


def _cpu_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    return None  # float32, bfloat16 and float16 all run on a CPU (the last two without the coupling guarantee)


# Device type -> what stops a model of this dtype from running there (None: nothing).
DEVICE_CHECKS = {"cuda": _cuda_problem, "mps": _mps_problem, "cpu": _cpu_problem}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_device(device: str | torch.device, dtype: torch.dtype = torch.float32) -> torch.device:
    """The device, checked before any weights load: a GPU that is not there, or a dtype it cannot run,
    is one SBoNError that says what to change instead of a CUDA stack trace halfway through a load."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise SBoNError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
    if dtype not in DTYPES.values():
        raise SBoNError(f"dtype {dtype} is not supported: use one of {', '.join(DTYPES)}")
    check = DEVICE_CHECKS.get(device.type)
    if check is None:
        raise SBoNError(f"device type {device.type!r} is not supported: use one of {', '.join(DEVICE_CHECKS)}")
    problem = check(device, dtype)
    if problem:
        raise SBoNError(problem)
    return device


@dataclass
class SamplingConfig:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 0  # 0 = off

    def validate(self) -> None:
        if self.temperature < 0:
            raise SBoNError(f"temperature must be at least 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SBoNError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SBoNError(f"top-k must be at least 0 (0 = off), got {self.top_k}")


def check_prompt(prompt: str) -> None:
    """An empty prompt is refused: it needs no model to see, so callers can check before loading one."""
    if not prompt or not prompt.strip():
        raise SBoNError("the prompt is empty: give the model something to answer")


def coupled_uniforms(seed: int, candidate_ids: Sequence[int], length: int) -> torch.Tensor:
    """One row of uniform numbers per candidate, from a stream that depends only on (seed, id)."""
    rows = [np.random.default_rng([seed, k]).random(length) for k in candidate_ids]
    return torch.from_numpy(np.stack(rows)) if rows else torch.empty(0, length, dtype=torch.float64)


# On a CPU top-p looks for the nucleus among this many most likely tokens first, then among more, then in the
# whole sorted vocabulary: sorting the vocabulary every step costs more than the forward pass of a small model
# there, and a top-64 costs an eighth of a top-1024. Each row widens on its own, so a row's token never depends on
# which rows share its batch. A GPU sorts the whole vocabulary at once: the sort takes microseconds there, and
# each widening would wait for the device (a host sync per step).
NUCLEUS_WIDTHS = (64, 1024)


def sample(logits: torch.Tensor, uniforms: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Inverse-CDF sampling of one token per row, using the given uniform number for that row.

    Drawing each token from a single pre-assigned uniform (rather than a shared RNG) is what
    makes a row's token independent of the other rows in the batch. Top-k then top-p, as in
    `transformers`' logits processors.
    """
    if cfg.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)
    uniforms = uniforms.to(probs.device, torch.float64)
    if cfg.top_k:
        top, order = probs.topk(min(cfg.top_k, probs.shape[-1]), dim=-1)
        return _pick(top / top.sum(-1, keepdim=True), order, uniforms, cfg.top_p)
    if cfg.top_p >= 1:
        return _pick(probs, None, uniforms, 1.0)
    if probs.is_cuda:
        return _pick_sorted(probs, uniforms, cfg.top_p)
    picked = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    rows = torch.arange(probs.shape[0], device=probs.device)  # rows whose nucleus is not found yet
    for width in (*(w for w in NUCLEUS_WIDTHS if w < probs.shape[-1]), None):
        sub = probs if len(rows) == probs.shape[0] else probs[rows]  # no copy while every row is in
        top, order = sub.topk(width, dim=-1) if width else sub.sort(dim=-1, descending=True)
        found = top.sum(-1) >= cfg.top_p if width else torch.ones_like(rows, dtype=torch.bool)
        picked[rows[found]] = _pick(top[found], order[found], uniforms[rows[found]], cfg.top_p)
        rows = rows[~found]
        if not len(rows):
            break
    return picked


def _pick_sorted(probs: torch.Tensor, uniforms: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over the whole vocabulary sorted at once (a GPU's way: see NUCLEUS_WIDTHS). A stable sort puts tied
    tokens in id order, so a row's order is its own whatever rows share its batch."""
    top, order = probs.sort(dim=-1, descending=True, stable=True)
    return _pick(top, order, uniforms, top_p)


def _pick(probs: torch.Tensor, order: torch.Tensor | None, uniforms: torch.Tensor, top_p: float) -> torch.Tensor:
    """The token each row's uniform lands on in the CDF of ``probs`` (sorted most likely first where
    ``order`` gives their token ids), the tokens past the top-p nucleus masked out (the most likely stays)."""
    if top_p < 1:
        mass_before = probs.cumsum(-1) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0)
    cdf = probs.double().cumsum(-1)
    targets = (uniforms * cdf[:, -1]).unsqueeze(-1)
    picked = torch.searchsorted(cdf, targets, right=True).clamp_(max=probs.shape[-1] - 1)
    return picked.squeeze(-1) if order is None else order.gather(-1, picked).squeeze(-1)


# -- weight formats ---------------------------------------------------------------------------

def _unchanged(model: torch.nn.Module, gguf: str | None = None) -> torch.nn.Module:
    return model


def _int4(kernel: str) -> Callable[..., torch.nn.Module]:
    """The 4-bit formats' convert: sbon.int4.to_int4 multiplying with ``kernel``."""
    def convert(model: torch.nn.Module, gguf: str | None = None) -> torch.nn.Module:
        from .int4 import to_int4  # reads GGUF files: imported where the format is asked for
        return to_int4(model, gguf, kernel)
    return convert


# The dtypes whose Linear layers oneDNN runs prepacked (prepack_linears).
PREPACKED_DTYPES = (torch.bfloat16, torch.float32)


def prepack_linears(model: torch.nn.Module) -> torch.nn.Module:
    """On a CPU, give every bfloat16 or float32 Linear layer its weight in oneDNN's blocked layout, made once.

    Why: `F.linear` on bfloat16 weights reorders the weight into that layout at every call, which costs
    more than the matmul itself at decoding's few rows; the prepacked call runs the same kernel on the same
    numbers, so the outputs are the same bits (tests/test_step_formats.py). On float32 weights `F.linear` goes
    to a BLAS whose few-row kernels stream the weights at a fraction of the memory bandwidth and whose kernel,
    so a row's last bits, changes with the row count on two threads; oneDNN's prepacked float32 kernel runs
    near the bandwidth and gives a row the same bits at any batch of two rows or more (not the BLAS's bits).
    `python -m benchmarks step` times the decode step with it (benchmarks/results/*/step). The weight itself
    stays (tied embeddings and anything reading ``.weight`` see it unchanged), so the layers' memory doubles.
    Layers whose inputs need gradients keep the plain call; elsewhere, without oneDNN, and for a dtype oneDNN
    cannot prepack on this CPU (bfloat16 without AVX-512 or AVX-NE-CONVERT), nothing changes: the layers run the
    plain call, and the probe (sbon.probe) measures what that costs and whether it is exact."""
    if not torch.backends.mkldnn.is_available():
        return model
    for module in model.modules():
        if (isinstance(module, torch.nn.Linear) and module.weight.dtype in PREPACKED_DTYPES
                and module.weight.device.type == "cpu" and prepackable(module.weight.dtype)):
            module.forward = _prepacked(module, module.forward)
    return model


@functools.cache
def prepackable(dtype: torch.dtype) -> bool:
    """Whether oneDNN prepacks Linear weights of ``dtype`` on this CPU (bfloat16 needs AVX-512 or AVX-NE-CONVERT);
    where it does not, one logged line."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 16)
        return True
    except RuntimeError as e:
        log.warning("%s Linear layers run unpacked on this CPU: %s", str(dtype).removeprefix("torch."),
                    (str(e).strip().splitlines() or [""])[0][:200])
        return False


# Prepacked weights by key: `torch.compile` cannot take oneDNN's opaque tensors as graph inputs, so a compiled
# step calls them through `sbon::packed_linear`, an operator it keeps whole, that finds its weight here. The key
# is the weight's shape, dtype and a hash of its bytes: a compiled graph holds it as a constant, so the same
# weights give the same graph in every process (so inductor's disk cache finds it, which a key such as id(module),
# different in every process, would defeat), and layers with the same weights (a model loaded twice) share one
# prepacked copy, counted in _PACKED_USERS.
_PACKED: dict[str, torch.Tensor] = {}
_PACKED_USERS: dict[str, int] = {}


@torch.library.custom_op("sbon::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, key: str) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the weight prepacked under ``key``: the same call as eagerly."""
    return torch.ops.mkldnn._linear_pointwise(x, _PACKED[key], bias, "none", [], "")


@packed_linear.register_fake
def _(x, weight, bias, key):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def tensor_bytes(t: torch.Tensor):
    """A CPU tensor's bytes, as a buffer a hash can read (what a key of its values is made from); a 0-d tensor (Gemma's
    embedding scale) is one element's."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy()


def weights_digest() -> "hashlib._Hash":
    """The hash that keys weights by their bytes: SHA-256, which most x86 and Arm CPUs of the last years compute in
    hardware (SHA-NI, the Armv8 crypto extensions), several times faster than blake2b; a model's weights are hashed
    at every load."""
    return hashlib.sha256()


def _weight_key(weight: torch.Tensor) -> str:
    h = weights_digest()
    h.update(tensor_bytes(weight))
    return f"{tuple(weight.shape)}:{weight.dtype}:{h.hexdigest()[:24]}"


def _release(key: str) -> None:
    _PACKED_USERS[key] -= 1
    if not _PACKED_USERS[key]:
        del _PACKED[key], _PACKED_USERS[key]


def _prepacked(module: torch.nn.Linear, plain: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    key = _weight_key(module.weight)
    if key not in _PACKED:
        _PACKED[key] = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), 16)  # 16: a typical row count
    _PACKED_USERS[key] = _PACKED_USERS.get(key, 0) + 1
    weakref.finalize(module, _release, key)  # freed with the last layer that uses it

    def prepacked_forward(x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or (torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad)):
            return plain(x)  # moved off the CPU since, or needs a gradient (the prepacked call has none)
        if torch.compiler.is_compiling():
            return packed_linear(x, module.weight, module.bias, key)
        return torch.ops.mkldnn._linear_pointwise(x, _PACKED[key], module.bias, "none", [], "")
    return prepacked_forward


def pad_linear_rows(model: torch.nn.Module, min_rows: int) -> torch.nn.Module:
    """Make every Linear layer of `model` compute at least `min_rows` rows, padding smaller inputs
    with copies of their last row and dropping the copies' outputs.

    Why: a CPU matmul library picks its kernel by the number of rows, and kernels sum in different
    orders, so a row's result can change in its last bits with the batch size, which can flip a rare
    sampled token and break coupled sampling. Padding keeps small batches (the last survivors) on
    the kernels that bigger batches use; each row of a matmul still depends on its own input only.
    Replaces each layer's `forward` on the instance: one Python call more per layer, no hooks."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = _padded(module.forward, min_rows)
    return model


def _padded(forward: Callable[[torch.Tensor], torch.Tensor], min_rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def padded_forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows >= min_rows or rows == 0:
            return forward(x)
        flat = x.reshape(rows, x.shape[-1])
        out = forward(torch.cat([flat, flat[-1:].expand(min_rows - rows, -1)]))
        return out[:rows].reshape(*x.shape[:-1], out.shape[-1])
    return padded_forward


@dataclass(frozen=True)
class WeightFormat:
    """How a generator's weights are stored for decoding."""
    description: str
    dtype: torch.dtype = field(metadata={"help": "dtype the model loads in, before `convert`"})
    # True where a row's logits do not depend on how many rows share its batch (on the CPU, with
    # `min_rows` padding): only then is Speculative Rejection's survivor k exactly Best-of-N's
    # candidate k. `python -m benchmarks step` measures each format's divergence rate.
    batch_invariant: bool = field(default=False, metadata={"help": "coupled sampling stays exact"})
    convert: Callable[..., torch.nn.Module] = field(
        default=_unchanged, metadata={"help": "applied to the loaded model (on its device): convert(model, gguf), "
                                              "gguf the file the model's weights came from, if any"})
    min_rows: int = field(default=1, metadata={"help": "on the CPU, Linear layers compute at least this many "
                                                       "rows (see pad_linear_rows)"})
    prepack: bool = field(default=False, metadata={"help": "on the CPU, Linear weights are prepacked for oneDNN "
                                                           "once (see prepack_linears)"})
    words: str = field(default="", metadata={"help": "the format as the page names it, for a student (default: the "
                                                     "description up to its first aside)"})

    def prepare(self, model: torch.nn.Module, device: torch.device | None = None,
                gguf: str | None = None) -> torch.nn.Module:
        """The loaded model in this format for ``device`` (default: where its weights are); GPU models are left
        unpacked and unpadded (their kernels are not these). The device is the one asked for, since on a ZeroGPU
        Space the weights of a model bound for the GPU stay in CPU memory until a GPU worker takes them.
        ``gguf``: the quantized file the weights were loaded from, if any (a 4-bit format takes its blocks)."""
        model = self.convert(model, gguf)
        on_cpu = (device or next(model.parameters()).device).type == "cpu"
        if on_cpu and self.prepack:
            model = prepack_linears(model)
        return pad_linear_rows(model, self.min_rows) if on_cpu and self.min_rows > 1 else model


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    # float32 through oneDNN's prepacked kernel gives a row the same bits at any batch size of two rows or more,
    # on any thread count (prepack_linears); the plain call's BLAS did so on one thread only.
    "fp32": WeightFormat("float32 weights and activations (the path exact on any CPU without measuring, "
                         "sbon.machine.safe_path)",
                         torch.float32, batch_invariant=True, min_rows=2, prepack=True,
                         words="full-precision numbers"),
    "bf16": WeightFormat("bfloat16 weights and activations (a GPU's path before anything is measured): half the "
                         "weight traffic, and on a CPU that computes bfloat16 natively its matmuls give each row the "
                         "same bits at any batch size of two rows or more",
                         torch.bfloat16, batch_invariant=True, min_rows=2, prepack=True,
                         words="half-precision numbers"),
    # The 4-bit kernel gives a row the same bits at any batch size from one row up; the LM head, in bfloat16,
    # needs bf16's two rows.
    "int4": WeightFormat("4-bit Linear weights in blocks of 32 (the embedded generator's own GGUF blocks; other "
                         "models are quantized at load), bfloat16 activations and LM head (CPU only): a quarter of "
                         "bf16's weight traffic",
                         torch.bfloat16, batch_invariant=True, convert=_int4("aten"), min_rows=2, prepack=True,
                         words="4-bit weights"),
    # The same 4-bit layers for a CPU without bfloat16 matmuls: every other operation and the LM head in float32,
    # which such a CPU computes natively (bf16's LM head is emulated there: slow, and a row's bits change with its
    # batch). The 4-bit kernel still takes bfloat16 in and out (sbon.int4.Int4Linear); its rows stay independent.
    # Its float32 LM head is prepacked as fp32's, exact from two rows up.
    "int4-fp32": WeightFormat("4-bit Linear weights as int4, float32 activations and LM head (CPU only): for CPUs "
                              "without bfloat16 matmuls, where bf16's LM head is emulated",
                              torch.float32, batch_invariant=True, convert=_int4("aten"), min_rows=2, prepack=True,
                              words="4-bit weights with full-precision arithmetic"),
    # int4 with sbon's own matmuls on the CPU's bfloat16 dot products (sbon.int4): the same blocks, sums in another
    # order, and the file's 8-bit LM head where it has one; each row's numbers its own at any row count.
    "int4-bf16dot": WeightFormat("4-bit Linear weights as int4 and the file's 8-bit LM head, multiplied with the "
                                 "CPU's bfloat16 dot products (sbon's kernel, compiled once; CPUs with AVX-512 BF16 "
                                 "only): twice the work per instruction of torch's 4-bit kernel, half the bytes of "
                                 "a bfloat16 LM head",
                                 torch.bfloat16, batch_invariant=True, convert=_int4("bf16dot"), min_rows=2,
                                 prepack=True, words="4-bit weights on the CPU's own half-precision products"),
    # int4-bf16dot's blocks, sums and LM head on the CPU's AMX tile unit (sbon.int4): up to 16 rows per instruction,
    # so a step of many rows costs little more than one of a single row; each row's numbers its own at any row count.
    "int4-amx": WeightFormat("4-bit Linear weights as int4 and the file's 8-bit LM head, multiplied on the CPU's AMX "
                             "tiles (sbon's kernel, compiled once; CPUs with AMX only): up to 16 rows per "
                             "instruction, so more candidates add little to a step",
                             torch.bfloat16, batch_invariant=True, convert=_int4("amx"), min_rows=2, prepack=True,
                             words="4-bit weights on the CPU's matrix unit"),
    # int4-fp32 with sbon's own matmuls on float32 FMAs (sbon.int4): no bfloat16 anywhere, the file's 8-bit LM head
    # where it has one; each row's numbers its own at any row count. The float32 LM head of a file without one is
    # prepacked as fp32's, exact from two rows up.
    "int4-fma": WeightFormat("4-bit Linear weights as int4 and the file's 8-bit LM head, multiplied in float32 with "
                             "the CPU's FMAs (sbon's kernel, compiled once; CPUs with AVX2): for CPUs without bfloat16 "
                             "matmuls, where torch's 4-bit kernel converts every activation to bfloat16 and back",
                             torch.float32, batch_invariant=True, convert=_int4("fma"), min_rows=2, prepack=True,
                             words="4-bit weights on the CPU's full-precision products"),
}
# The format each dtype loads as when only a dtype is given.
DTYPE_FORMATS = {fmt.dtype: name for name, fmt in reversed(WEIGHT_FORMATS.items())}


def weight_format(name: str) -> WeightFormat:
    if name not in WEIGHT_FORMATS:
        raise SBoNError(f"unknown weights '{name}': use one of {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[name]


@dataclass
class Prefix:
    """The prefilled prompt: its cache (batch of one) and the next-token logits."""
    prompt_ids: list[int]
    cache: DynamicCache
    logits: torch.Tensor  # (1, vocab)


# Free token slots a batch's KV rows get beyond their current length, at the least.
KV_MIN_HEADROOM = 64


class GrowableLayer(DynamicLayer):
    """One layer's KV rows in a buffer with room to grow; ``keys``/``values`` are views of it.

    `transformers`' DynamicLayer appends each token with ``torch.cat``, which copies the layer's
    whole cache every step: memory traffic that grows with the length and, on a CPU, rivals the
    weights' by a few hundred tokens. Here the new token is written in place and the buffer is
    reallocated (live rows only) once every max(KV_MIN_HEADROOM, length / 2) tokens. Attention
    reads the same numbers as concatenation would give, so the outputs are bit-identical. Pruned rows
    still leave the buffer, so memory tracks the live candidates.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int, headroom: int = KV_MIN_HEADROOM):
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._len = keys.shape[-2]
        self._k = self._alloc(keys, rows, self._len + headroom)
        self._v = self._alloc(values, rows, self._len + headroom)
        self._view()

    @staticmethod
    def _alloc(src: torch.Tensor, rows: int, capacity: int) -> torch.Tensor:
        _, heads, length, dim = src.shape
        buf = src.new_empty(rows, heads, capacity, dim)
        buf[:, :, :length] = src  # a batch of one broadcasts to every row
        return buf

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]

    def update(self, key_states, value_states, *args, **kwargs):
        q = key_states.shape[-2]
        if self._len + q > self._k.shape[2]:
            capacity = self._len + q + max(KV_MIN_HEADROOM, self._len // 2)
            self._k = self._alloc(self.keys, self.keys.shape[0], capacity)
            self._v = self._alloc(self.values, self.values.shape[0], capacity)
        self._k[:, :, self._len:self._len + q] = key_states
        self._v[:, :, self._len:self._len + q] = value_states
        self._len += q
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k.index_select(0, indices), self._v.index_select(0, indices)
        self._view()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
        self._view()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise SBoNError(f"crop takes minus the number of tokens to remove, got {tokens_to_remove}")
        self._len = max(0, self._len + tokens_to_remove)
        self._view()


def growable_cache(prefix_cache: DynamicCache, rows: int, headroom: int = KV_MIN_HEADROOM) -> DynamicCache:
    """A cache of `rows` copies of the prefix's (batch of one) rows, each layer a GrowableLayer;
    the prefix's own cache is not touched, so it stays reusable for later batches."""
    cache = DynamicCache()
    cache.layers = [GrowableLayer(layer.keys, layer.values, rows, headroom) for layer in prefix_cache.layers]
    return cache


class Batch:
    """The live rows of a generation: one row of KV cache per unfinished candidate."""

    def __init__(self, candidate_ids: list[int], cache: DynamicCache, logits: torch.Tensor,
                 keep_hidden: bool = False):
        self.candidate_ids = candidate_ids
        # The same ids on the device, so that sampling gathers each row's uniform number there.
        self.row_ids = torch.tensor(candidate_ids, dtype=torch.long, device=logits.device)
        self.cache = cache
        self.logits = logits  # (rows, vocab): next-token logits of each row
        self.keep_hidden = keep_hidden  # keep each step's final-layer hidden states (for pruning signals)
        self.hidden: torch.Tensor | None = None  # (rows, d): final-layer state at each row's last token

    def __len__(self) -> int:
        return len(self.candidate_ids)

    @property
    def cache_rows(self) -> int:
        """Rows held in the KV cache (the batch dimension of its tensors)."""
        layer = self.cache.layers[0]
        return int(layer.keys.shape[0]) if layer.is_initialized and layer.keys.numel() else 0

    def keep(self, candidate_ids: Sequence[int]) -> None:
        """Keep only these candidates' rows, dropping the rest from the KV cache in place (one
        ``index_select`` per layer's keys and values, however many rows leave)."""
        keep = set(candidate_ids)
        rows = [i for i, k in enumerate(self.candidate_ids) if k in keep]
        if len(rows) == len(self.candidate_ids):
            return
        self.candidate_ids = [self.candidate_ids[i] for i in rows]
        if not rows:  # nothing left to decode: free the cache
            self.cache, self.logits, self.hidden, self.row_ids = DynamicCache(), self.logits[:0], None, self.row_ids[:0]
            return
        index = torch.tensor(rows, device=self.logits.device)
        self.cache.batch_select_indices(index)
        self.logits = self.logits[index]
        self.row_ids = self.row_ids[index]
        if self.hidden is not None:
            self.hidden = self.hidden[index]


class Generator:
    """A causal LM with its tokenizer, ready to generate many candidates for one prompt."""

    def __init__(self, model, tokenizer, name: str = "model", weights: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.weights = weights  # the WEIGHT_FORMATS entry it was loaded with (None: as given)
        self.device = model.device
        self.stop_ids = self._stop_token_ids()
        self._stop_tensor = torch.tensor(sorted(self.stop_ids), device=self.device)
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None

    def _stop_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if source is not None:
                ids.update(source if isinstance(source, (list, tuple)) else [source])
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
        return ids

    # -- prompts --------------------------------------------------------------------------

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of the prompt as a user turn, with the generation prompt of the chat template."""
        check_prompt(prompt)
        if self.tokenizer.chat_template:
            enc = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                     add_generation_prompt=True)
            return list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc)
        return self.tokenizer.encode(prompt)

    def check_length(self, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        if self.max_context and len(prompt_ids) + max_new_tokens > self.max_context:
            raise SBoNError(f"the prompt has {len(prompt_ids)} tokens; with max new tokens={max_new_tokens} that "
                            f"exceeds the model's context of {self.max_context}: shorten the prompt or lower max new tokens")

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    # -- generation -----------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int]) -> Prefix:
        cache = DynamicCache()
        ids = torch.tensor([list(prompt_ids)], device=self.device)
        out = self.model(input_ids=ids, **{CACHE_KEYWORD: cache}, use_cache=True, logits_to_keep=1)
        return Prefix(list(prompt_ids), out[CACHE_KEYWORD], out.logits[:, -1, :])

    def start(self, prefix: Prefix, candidate_ids: Sequence[int], keep_hidden: bool = False) -> Batch:
        """A batch with one row per candidate, each a copy of the prefilled prompt."""
        cache = growable_cache(prefix.cache, len(candidate_ids))
        return Batch(list(candidate_ids), cache, prefix.logits.expand(len(candidate_ids), -1), keep_hidden)

    def is_stop(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.isin(tokens, self._stop_tensor)

    @torch.inference_mode()
    def forward(self, batch: Batch, tokens: torch.Tensor) -> None:
        """Feed one new token per row; the batch's logits become the next-token logits (and, if the batch
        keeps them, its hidden states the final-layer states of the fed tokens: the same forward pass)."""
        out = self.model(input_ids=tokens.view(-1, 1), **{CACHE_KEYWORD: batch.cache}, use_cache=True,
                         output_hidden_states=batch.keep_hidden)
        batch.cache = out[CACHE_KEYWORD]
        batch.logits = out.logits[:, -1, :]
        if batch.keep_hidden:
            batch.hidden = out.hidden_states[-1][:, -1, :]

    # -- scoring helpers ------------------------------------------------------------------

    def mean_logprob(self, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]]) -> list[float]:
        """Mean log-probability of each response's tokens after the prompt (0.0 for an empty one)."""
        return [float(lp.mean()) if len(lp) else 0.0 for lp in self.token_logprobs(prompt_ids, responses)]

    @torch.inference_mode()
    def token_logprobs(self, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Log-probability of each response token after the prompt, one padded forward pass for all."""
        if not responses:
            return []
        width = len(prompt_ids) + max(len(r) for r in responses)
        ids = torch.zeros(len(responses), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(responses):
            row = list(prompt_ids) + list(r)
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        start = len(prompt_ids) - 1  # logits at position p predict token p + 1
        # Normalise only the response positions of each row, not the prompt and padding ones.
        return [torch.log_softmax(logits[i, start:start + len(r)].float(), -1)
                .gather(-1, torch.tensor(list(r), device=self.device)[:, None]).squeeze(-1).cpu()
                for i, r in enumerate(responses)]

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token of one candidate takes (keys and values, all layers)."""
        cfg = self.model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * heads * head_dim * self.model.dtype.itemsize

    def free_memory_bytes(self) -> int:
        """Memory free on the generator's device now."""
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        import psutil
        return int(psutil.virtual_memory().available)

    def synchronize(self) -> None:
        """Wait for queued device work, so that phase timers measure it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
