"""4-bit weights on a CPU: the ``int4``, ``int4-fp32``, ``int4-bf16dot``, ``int4-amx`` and ``int4-fma`` weight formats
(``sbon.engine.WEIGHT_FORMATS``).

Why: a decode step at a few rows reads every weight once and does little arithmetic with it, so its time follows
the weights' bytes. The embedded generator ships as a GGUF file of 4-bit blocks (Q4_1: each 32 weights along the
input share a scale d and a minimum m, w = d q + m with q in 0..15); bfloat16 reads those weights in four times
their bytes. torch's CPU kernel ``_weight_int4pack_mm_for_cpu`` multiplies by such blocks directly (it computes
(q - 8) scale + zero per group of 32, so Q4_1 is scale = d, zero = m + 8 d). Each row's result is the same bits at
any batch size and position in its batch, and the format pads a single row to two for its bfloat16 LM head (as bf16
does), so coupled sampling stays exact (tests/test_step_formats.py).

Where the file's blocks are the loaded layer's own weights (checked layer by layer, on a sample of rows, against
the bfloat16 copy the model loaded with), they are used as they are; other layers, and models without such a file,
are quantized here to the same form (each group's minimum and range), which changes their outputs. The LM head
stays in the model's dtype (in most small models it is the input embedding too, which a step only gathers from):
bfloat16 for ``int4``, float32 for ``int4-fp32``, the format for CPUs without bfloat16 matmuls, where everything
but the 4-bit kernel runs in float32 (see Int4Linear).

``int4-bf16dot`` is ``int4`` with its own matmul (``sbon/kernels/int4_bf16dot.cpp``) for CPUs with AVX-512 BF16:
torch's 4-bit kernel widens each weight to float32 and spends one FMA per weight and row, which bounds a step of
several rows; this one multiplies with the CPU's bfloat16 dot products, two weights per lane and instruction. The
same blocks, exact products, sums rounded in another order: its texts are its own, and a row's numbers are still its
own at any batch size. Its LM head is the file's 8-bit blocks where the file has them (Int8Head), half a bfloat16
head's bytes. It is compiled once per machine (seconds, beside sbon's other caches) where a C++ compiler
is found; elsewhere the format does not load, with one line saying why.

``int4-amx`` is ``int4-bf16dot`` on the CPU's AMX tile unit (``sbon/kernels/int4_amx.cpp``): the same blocks, layouts,
block sums and 8-bit LM head, each block's products summed by TDPBF16PS for up to 16 rows at once, so the rows of a
step add little to reading its weights. Its texts are its own; a row's numbers are still its own at any batch size.

``int4-fma`` is ``int4-fp32`` with its own matmul (``sbon/kernels/int4_fma.cpp``) for CPUs with AVX2 but no bfloat16
instructions, where torch's 4-bit kernel converts every activation to bfloat16 and back and spends one FMA per
weight and row: it widens each weight once per pass over up to eight rows and multiplies with float32 FMAs, a
float32 matmul with the file's weights; its LM head is the file's 8-bit blocks as ``int4-bf16dot``'s. Built and
refused the same way (KERNELS).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import SBoNError

log = logging.getLogger(__name__)

GROUP = 32  # weights per block along the input (GGUF's Q4_1, and the kernel's group size)
KERNEL_DTYPE = torch.bfloat16  # what torch's vectorized 4-bit CPU kernel computes in (see Int4Linear)
# A file's blocks are taken for a layer where they give its loaded weights on every CHECKED_EVERY-th row: the
# weights of another model, or of another layer, differ on every row, and checking every row takes seconds per load.
CHECKED_EVERY = 16

# The GGUF's Q4_1 Linear tensors by name in a llama-architecture file and the module each becomes in
# `transformers`, which also permutes the rows of q and k for its rotary layout (its GGUF loader).
GGUF_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}


def kernel_problem() -> str | None:
    """Why torch's 4-bit CPU kernel cannot run here (None: it can)."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return f"torch {torch.__version__} has no 4-bit CPU kernel (_weight_int4pack_mm_for_cpu)"
    return None


# sbon's own kernels' schemas, with the shape functions `torch.compile` traces them with; their CPU code is registered
# when a kernel is built and loaded (SbonKernel.problem).
_LIB = torch.library.Library("sbon", "FRAGMENT")


@dataclass(frozen=True)
class SbonKernel:
    """One of sbon's own matmuls for 4-bit blocks and a GGUF file's 8-bit LM head, ``sbon/kernels/int4_{name}.cpp``:
    its operators ``sbon::int4_mm_{name}`` (activations in and out in ``activations``) and ``sbon::int8_mm_{name}``
    (float32 logits out), built with ``flags`` on a machine's first use where this CPU ``has`` what they need. A new
    kernel is its source and an entry of KERNELS."""
    name: str
    weights: str  # the weight format that multiplies with it (sbon.engine.WEIGHT_FORMATS)
    instead: str  # the format a CPU without what it needs uses instead
    needs: str  # what a CPU must have, as the line saying it lacks it names it
    has: Callable[[], bool]
    flags: tuple[str, ...]
    columns: int  # output columns per block of its layouts: a layer's outputs must be a multiple of it
    activations: torch.dtype
    pack4: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    pack8: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

    def __post_init__(self):
        for bits, dtype in ((4, self.activations), (8, torch.float32)):
            op = f"int{bits}_mm_{self.name}"
            _LIB.define(f"{op}(Tensor x, Tensor packed, Tensor scales) -> Tensor")
            torch.library.register_fake(f"sbon::{op}", lib=_LIB)(functools.partial(_fake_mm, self.columns, dtype))

    def mm4(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.sbon, f"int4_mm_{self.name}")(x.to(self.activations).contiguous(), packed, scales)

    def mm8(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.sbon, f"int8_mm_{self.name}")(x.to(self.activations).contiguous(), packed, scales)

    def problem(self) -> str | None:
        """Why the kernel cannot run here (None: it can, and is loaded; sbon.cpp_kernels builds it)."""
        return _problem(self.name)

    def require(self) -> None:
        """Raise the one-line reason where the kernel cannot run here."""
        if problem := self.problem():
            raise SBoNError(f"{self.weights} weights: {problem}; use {self.instead}")


def _fake_mm(columns: int, dtype: torch.dtype, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor):
    return x.new_empty(x.shape[0], packed.shape[0] * columns, dtype=dtype)


@functools.cache
def _problem(name: str) -> str | None:
    kernel = KERNELS[name]
    if not kernel.has():  # (an emulated CPU class without it says so here too)
        return f"this CPU has no {kernel.needs}"
    from .cpp_kernels import build
    problem = build(f"int4_{name}", kernel.flags, kernel.weights)
    return problem and f"its 4-bit kernel {problem}"


def pack_bf16dot(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks (q, d, m) of a weight (out, in) in the int4-bf16dot kernel's layout (int4_bf16dot.cpp): per 16 output
    columns and 4 inputs, 32 bytes whose byte 2c + e holds column c's q at input 4j + e (low nibble) and 4j + 2 + e
    (high); and per 16 columns and block of 32 inputs, the 16 d then the 16 m (float16, as a GGUF file holds them)."""
    n, k = q.shape
    quads = q.reshape(n // 16, 16, k // 4, 2, 2).permute(0, 2, 1, 4, 3)  # (column block, j, c, e, high)
    packed = (quads[..., 0] | (quads[..., 1] << 4)).to(torch.uint8).reshape(n // 16, k * 8).contiguous()
    return packed, _per_block(16, d, m)


def pack_q8_bf16dot(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit blocks (q int8 (out, in), d (out, in / 32)) in the kernel's layout for them (int4_bf16dot.cpp): per 16
    output columns and 2 inputs, 32 bytes whose byte 2c + e is column c's q at input 2p + e; and per 16 columns and
    block of 32 inputs, the 16 d."""
    n, k = q.shape
    packed = q.to(torch.int8).reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).reshape(n // 16, k * 16)
    return packed.contiguous(), _per_block(16, d)


def pack_fma(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks (q, d, m) of a weight (out, in) in the int4-fma kernel's layout (int4_fma.cpp): per 8 output columns
    and input, one int32 whose bits 4c..4c+3 hold column c's q; and per 8 columns and block of 32 inputs, the 8 d
    then the 8 m."""
    n, k = q.shape
    words = (q.to(torch.int64).reshape(n // 8, 8, k).transpose(1, 2) << (4 * torch.arange(8))).sum(-1)
    packed = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)  # the same 32 bits, signed
    return packed.contiguous(), _per_block(8, d, m)


def pack_q8_fma(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit blocks (q int8 (out, in), d (out, in / 32)) in the int4-fma kernel's layout for them: per 8 output
    columns and input, 8 bytes, column c's q in byte c; and per 8 columns and block of 32 inputs, the 8 d."""
    n, k = q.shape
    return q.to(torch.int8).reshape(n // 8, 8, k).transpose(1, 2).reshape(n // 8, k * 8).contiguous(), _per_block(8, d)


def _per_block(columns: int, *per_block: torch.Tensor) -> torch.Tensor:
    """Per ``columns`` output columns and block of 32 inputs, each tensor of ``per_block`` (out, in / 32) for those
    columns in turn, in float16 (as a GGUF file holds them)."""
    n, groups = per_block[0].shape
    parts = [t.half().reshape(n // columns, columns, groups).transpose(1, 2) for t in per_block]
    return torch.stack(parts, 2).reshape(n // columns, -1).contiguous()


KERNELS = {kernel.name: kernel for kernel in (
    # Two weights per lane and instruction on the CPU's bfloat16 dot products (int4_bf16dot.cpp).
    SbonKernel("bf16dot", weights="int4-bf16dot", instead="int4", needs="AVX-512 BF16 dot products",
               has=lambda: torch.cpu._is_avx512_bf16_supported(),
               flags=("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma"), columns=16,
               activations=torch.bfloat16, pack4=pack_bf16dot, pack8=pack_q8_bf16dot),
    # int4-bf16dot's blocks and sums multiplied on the AMX tile unit: up to 16 rows per instruction (int4_amx.cpp).
    SbonKernel("amx", weights="int4-amx", instead="int4", needs="AMX with bfloat16 tiles",
               has=lambda: torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx(),
               flags=("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-mamx-tile",
                      "-mamx-bf16"), columns=16, activations=torch.bfloat16, pack4=pack_bf16dot,
               pack8=pack_q8_bf16dot),
    # Float32 activations times the widened weights, one FMA per weight and row (int4_fma.cpp). torch's own vector
    # code's class says whether the CPU has AVX2 (an emulated class's too).
    SbonKernel("fma", weights="int4-fma", instead="int4-fp32", needs="AVX2 with FMA",
               has=lambda: torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"),
               flags=("-O3", "-mavx2", "-mfma", "-mf16c"), columns=8, activations=torch.float32,
               pack4=pack_fma, pack8=pack_q8_fma),
)}


def gguf_q8_0_head(path: str | Path) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The file's LM head (``output.weight``, else the tied ``token_embd.weight``) where it is in 8-bit blocks
    (Q8_0: w = d q): (q int8 (vocabulary, hidden), d float32 (vocabulary, hidden / 32)); None otherwise. Read from
    the file once per machine (_kept)."""
    def read() -> dict[str, torch.Tensor]:
        import gguf
        import numpy as np

        tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        t = tensors.get("output.weight") or tensors.get("token_embd.weight")
        if t is None or t.tensor_type != gguf.GGMLQuantizationType.Q8_0:
            return {}
        rows = t.data.shape[0]
        blocks = np.ascontiguousarray(t.data).reshape(rows, -1, 2 + GROUP)  # per block: d (float16), 32 int8 q
        d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
        return {"q": torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)), "d": d}

    head = _kept(path, "q8_0-head", "the 8-bit LM head", read)
    return (head["q"], head["d"]) if head else None


def gguf_q4_1(path: str | Path, config) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The file's Q4_1 Linear weights as (q int32 (out, in), d, m float32 (out, in / 32)) by module name, rows in
    `transformers`' order."""
    import gguf
    import numpy as np

    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        parts = t.name.split(".")
        if t.tensor_type != gguf.GGMLQuantizationType.Q4_1 or len(parts) != 4 or parts[2] not in GGUF_LINEARS:
            continue
        rows = t.data.shape[0]
        blocks = np.ascontiguousarray(t.data).reshape(rows, -1, 20)  # per block: d, m (float16), 16 bytes of q
        d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
        m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        qs = torch.from_numpy(blocks[..., 4:].copy()).to(torch.int32)
        q = torch.cat([qs & 15, qs >> 4], -1).reshape(rows, -1)  # low nibbles are a block's first 16 weights
        if parts[2] in ("attn_q", "attn_k"):  # transformers' reverse permutation of the rotary rows
            n = heads if parts[2] == "attn_q" else kv_heads
            order = torch.arange(rows).reshape(n, rows // n // 2, 2).transpose(1, 2).reshape(-1)
            q, d, m = q[order], d[order], m[order]
        out[f"model.layers.{parts[1]}.{GGUF_LINEARS[parts[2]]}"] = q, d, m
    return out


def gguf_blocks(path: str | Path, config) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """gguf_q4_1, read from the file once per machine (_kept; the head counts that order q's and k's rows are part of
    the kept file's name)."""
    def read() -> dict[str, torch.Tensor]:
        return {f"{name}.{k}": t.to(torch.uint8) if k == "q" else t.contiguous()
                for name, (q, d, m) in gguf_q4_1(path, config).items() for k, t in (("q", q), ("d", d), ("m", m))}

    flat = _kept(path, f"{config.num_attention_heads}-{config.num_key_value_heads}", "the 4-bit blocks", read)
    return {name.removesuffix(".q"): (q.to(torch.int32), flat[name[:-2] + ".d"], flat[name[:-2] + ".m"])
            for name, q in flat.items() if name.endswith(".q")}


def _kept(path: str | Path, key: str, what: str, read: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``read()``'s tensors from a GGUF file, kept in sbon's cache (a safetensors file named after the GGUF file, its
    size and time, and ``key``) and read back from there later: parsing the file (its metadata holds the whole
    vocabulary) and unpacking its blocks take many times longer than reading them back."""
    from safetensors.torch import load_file, save_file

    from .cache import cache_dir, one_at_a_time

    st = Path(path).stat()
    kept = cache_dir() / "int4-blocks" / f"{Path(path).stem}-{st.st_size}-{st.st_mtime_ns}-{key}.safetensors"
    if kept.is_file():
        return load_file(kept)
    with one_at_a_time(kept.with_name(f".{kept.name}.lock")):
        if kept.is_file():  # kept by another process meanwhile
            return load_file(kept)
        tensors = read()
        part = kept.with_name(f".{kept.name}.{os.getpid()}.part")  # written whole, then renamed: never read half
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, part)
            os.replace(part, kept)
        except OSError as e:  # a cache that cannot be written costs the next load time, never this one
            part.unlink(missing_ok=True)
            log.warning("int4 weights: %s were not kept in %s (%s)", what, kept.parent, e)
    return tensors


def dequantize(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 weights of blocks (q, d, m): w = d q + m (Q4_1), or w = d q without m (Q8_0); each block's d and m
    broadcast over its 32 weights."""
    w = q.reshape(*d.shape, GROUP) * d[..., None]
    return (w if m is None else w + m[..., None]).reshape(q.shape)


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blocks (q, d, m) for a weight (out, in) without a file's: per group of 32, m the minimum and d a 15th of
    the range (round to nearest)."""
    w = weight.detach().float().reshape(weight.shape[0], -1, GROUP)
    m = w.amin(-1)
    d = (w.amax(-1) - m) / 15
    d = torch.where(d > 0, d, torch.ones_like(d))  # a constant group: q = 0 everywhere
    q = ((w - m[..., None]) / d[..., None]).round().clamp(0, 15).to(torch.int32)
    return q.reshape(weight.shape), d, m


class Int4Linear(torch.nn.Module):
    """A Linear layer with 4-bit weights; activations in ``dtype``. ``kernel``: ``aten`` for torch's 4-bit CPU kernel
    in its layout, else the name of one of sbon's (KERNELS) in that kernel's layout.

    torch's kernel always computes in bfloat16 in and out (accumulating in float32): torch builds its vectorized
    4-bit kernel for bfloat16 activations only, and its float32 one is a scalar loop many times slower. So float32
    activations are rounded to bfloat16 on the way in and widened on the way out; both are elementwise, so a row's
    result still depends on that row only, and no bfloat16 matmul instruction is needed (the conversions are shifts
    and adds where the CPU has no AVX-512 BF16). sbon's kernels take their own activations' dtype (SbonKernel)."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype, kernel: str = "aten"):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.dtype, self.kernel = dtype, kernel
        if kernel != "aten":
            KERNELS[kernel].require()
            packed, scales = KERNELS[kernel].pack4(q, d, m)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
            # (in / 32, out, 2): each group's scale and zero, as the kernel takes them
            scales = torch.stack([d, m + 8 * d], -1).transpose(0, 1).contiguous().to(KERNEL_DTYPE)
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.kernel != "aten":
            out = KERNELS[self.kernel].mm4(flat, self.packed, self.scales).to(x.dtype)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat.to(KERNEL_DTYPE), self.packed, GROUP,
                                                             self.scales).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}, kernel={self.kernel}"


class Int8Head(torch.nn.Module):
    """An LM head in a GGUF file's 8-bit blocks (Q8_0), multiplied by one of sbon's kernels' 8-bit twin (KERNELS): a
    quarter of a float32 head's bytes, half a bfloat16 one's, the file's own weights, float32 logits, and each row's
    numbers its own at any row count."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, kernel: str):
        super().__init__()
        KERNELS[kernel].require()
        self.out_features, self.in_features = q.shape
        self.kernel = kernel
        packed, scales = KERNELS[kernel].pack8(q, d)
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        return KERNELS[self.kernel].mm8(flat, self.packed, self.scales).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}, 8-bit, " \
               f"kernel={self.kernel}"


def _file_head(model: torch.nn.Module, gguf: str | Path, kernel: str) -> Int8Head | None:
    """The model's LM head from the file's 8-bit blocks, where they are its loaded weights (checked on a sample of
    rows, as the 4-bit layers are); None where the file has no such head or it is another model's."""
    head = model.get_output_embeddings()
    blocks = gguf_q8_0_head(gguf)
    if head is None or head.bias is not None or blocks is None or blocks[0].shape != head.weight.shape \
            or head.in_features % GROUP or head.out_features % KERNELS[kernel].columns:
        return None
    q, d = blocks
    rows = slice(None, None, CHECKED_EVERY)
    w = dequantize(q[rows], d[rows])
    return Int8Head(q, d, kernel) if torch.equal(w.to(head.weight.dtype), head.weight.detach()[rows]) else None


def to_int4(model: torch.nn.Module, gguf: str | Path | None = None, kernel: str = "aten") -> torch.nn.Module:
    """Every Linear layer but the LM head as an Int4Linear multiplying with ``kernel`` (``aten``: torch's 4-bit CPU
    kernel; else one of sbon's, KERNELS), from ``gguf``'s blocks where they are the layer's weights, quantized here
    otherwise; with sbon's kernels, the LM head from the file's 8-bit blocks where it has them. The model stays in its
    dtype elsewhere; CPU only."""
    if next(model.parameters()).device.type != "cpu":
        raise SBoNError("int4 weights run on the CPU only (torch's 4-bit CPU kernel): use bf16 on a GPU")
    if problem := kernel_problem():
        raise SBoNError(f"int4 weights: {problem}; use bf16")
    if kernel != "aten":  # before the blocks are read: one line, at once
        KERNELS[kernel].require()
    columns = KERNELS[kernel].columns if kernel != "aten" else 1
    dtype = next(model.parameters()).dtype
    blocks = gguf_blocks(gguf, model.config) if gguf else {}
    head = model.get_output_embeddings()
    from_file = quantized = 0
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear or module is head or module.in_features % GROUP \
                or module.out_features % columns:
            continue
        q, d, m = blocks.get(name) or (None, None, None)
        rows = slice(None, None, CHECKED_EVERY)
        if q is None or q.shape != module.weight.shape or not torch.equal(
                dequantize(q[rows], d[rows], m[rows]).to(module.weight.dtype), module.weight.detach()[rows]):
            q, d, m = quantize(module.weight)
            quantized += 1
        else:
            from_file += 1
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, Int4Linear(q, d, m, module.bias, dtype, kernel))
    if gguf and quantized:
        log.warning("int4 weights: %d layers quantized here, not from %s", quantized, Path(gguf).name)
    model.int4_layers = {"from_file": from_file, "quantized": quantized}
    # sbon's kernels: an 8-bit LM head where the file has one (the embedding keeps the model's own weights).
    if kernel != "aten" and gguf and (file_head := _file_head(model, gguf, kernel)) is not None:
        model.set_output_embeddings(file_head)
        model.int4_layers["head"] = "8-bit, from the file"
    return model
