"""Other CPU classes on this one: the instruction sets torch, oneDNN and inductor may use, limited by environment
variables, and a check that each limit holds.

A CPU with AVX-512 BF16 emulates the others by keeping its libraries off the instructions they lack:

- ``ATEN_CPU_CAPABILITY`` caps torch's own vectorized kernels (``default``, ``avx2``, ``avx512``), and inductor's
  choice of vector ISA for the compiled step follows it;
- ``ONEDNN_MAX_CPU_ISA`` caps oneDNN (``AVX2``; ``AVX512_CORE_VNNI`` is AVX-512 without its BF16 and AMX
  extensions): every bf16 and fp32 matmul of the Linear layers goes there;
- torch's own kernels built for AVX-512 (the 4-bit kernel among them) use no AVX-512 BF16 instruction: the build
  compiles them without ``-mavx512bf16`` and converts bfloat16 with shifts. What still looks at the CPU itself is
  ``torch.cpu._is_avx512_bf16_supported()`` / ``_is_amx_tile_supported()`` (cpuinfo): inductor adds
  ``-mavx512bf16`` to its compiler flags where they say yes, and the project's choice of weights asks them. A
  class without BF16 sets ``SBON_EMULATED_CPU``, and ``benchmarks/emulate/sitecustomize.py`` (on ``PYTHONPATH``)
  makes them say no in every Python process of the run, children included.

:func:`isa_check` measures what a process can use (torch's capability, the bf16 and fp32 matmul rates, inductor's
vector ISA and flags); :func:`limit_problems` says where a class's limit does not hold. `python -m benchmarks
machines` runs each class in a child process with its variables and records both.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

EMULATE_DIR = Path(__file__).resolve().parent / "emulate"  # its sitecustomize.py hides BF16 from torch.cpu's checks


@dataclass(frozen=True)
class CpuClass:
    """A kind of CPU the app may start on, and how this machine emulates it."""
    title: str = field(metadata={"help": "its human name (tables, the README)"})
    env: dict[str, str] = field(default_factory=dict, metadata={"help": "the variables that limit this machine to it"})
    capability: str | None = field(default=None, metadata={
        "help": "torch.backends.cpu.get_cpu_capability() expected under the limit (None: whatever this CPU has)"})
    bf16: bool = field(default=True, metadata={"help": "whether its bfloat16 matmuls are native (not emulated)"})

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with the class's limits."""
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        if "SBON_EMULATED_CPU" in self.env:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EMULATE_DIR), env.get("PYTHONPATH")) if p)
        return env


CPU_CLASSES: dict[str, CpuClass] = {
    "avx512-bf16": CpuClass("AVX-512 with BF16", {}, "AVX512", bf16=True),
    "avx512": CpuClass("AVX-512 without BF16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI",
                                                "SBON_EMULATED_CPU": "avx512"}, "AVX512", bf16=False),
    "avx2": CpuClass("AVX2 only", {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                   "SBON_EMULATED_CPU": "avx2"}, "AVX2", bf16=False),
}


def own_class(flags: Sequence[str]) -> str | None:
    """The class of a CPU with ``flags`` (sbon.machine.cpu_flags, read from /proc/cpuinfo, which no limit hides):
    the highest of CPU_CLASSES it has the instructions of; None below AVX2."""
    from sbon.machine import BF16_FLAGS  # imported when asked: this module loads without torch

    have = set(flags)
    if "avx512f" in have:
        return "avx512-bf16" if have & BF16_FLAGS else "avx512"
    return "avx2" if "avx2" in have else None


def native(name: str, environment: dict[str, Any]) -> bool:
    """Whether a result of the class ``name`` was measured on a CPU of that class, not emulated on a higher one:
    from the CPU's flags where the result recorded them (``environment["cpu_flags"]``), else only the class that
    sets no limit is."""
    if "cpu_flags" in environment:
        return own_class(environment["cpu_flags"]) == name
    return not CPU_CLASSES[name].env


def hide_cpu_features(emulated: str | None = None) -> None:
    """Make torch.cpu's feature checks say what the emulated class ``emulated`` (default: $SBON_EMULATED_CPU) lacks;
    nothing without one. Called by benchmarks/emulate/sitecustomize.py at every Python start of an emulated run."""
    emulated = emulated if emulated is not None else os.environ.get("SBON_EMULATED_CPU")
    if not emulated:
        return
    import torch.cpu

    def no() -> bool:
        return False

    torch.cpu._is_avx512_bf16_supported = no
    torch.cpu._is_amx_tile_supported = no
    torch.cpu._is_amx_fp16_supported = no
    if emulated == "avx2":
        torch.cpu._is_avx512_supported = no
        torch.cpu._is_avx512_vnni_supported = no


def matmul_gflops(dtype, size: int = 512, reps: int = 7) -> float:
    """GFLOP/s of a square matmul in ``dtype`` (its fastest of ``reps``: other load only slows a rep down): where
    bfloat16 is emulated it falls below float32's."""
    import torch
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # first call: kernel selection (oneDNN's JIT)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9


def isa_check(inductor: bool = True) -> dict[str, Any]:
    """What this process may use: torch's vector capability, what torch.cpu says of BF16 and AMX, oneDNN's limit,
    the bf16 and fp32 matmul rates, and (``inductor``) the vector ISA and compiler flags of the compiled step."""
    import torch
    out: dict[str, Any] = {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch_cpu_avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
        "torch_cpu_amx": torch.cpu._is_amx_tile_supported(),
        "limits": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "SBON_EMULATED_CPU")},
        "matmul_fp32_gflops": matmul_gflops(torch.float32),
        "matmul_bf16_gflops": matmul_gflops(torch.bfloat16),
    }
    if inductor:
        try:
            from torch._inductor.cpu_vec_isa import pick_vec_isa
            isa = pick_vec_isa()
            out["inductor_isa"] = str(isa) or None
            out["inductor_flags"] = isa.build_arch_flags() if isa else ""
        except Exception as e:  # noqa: BLE001 - no compiler: the compiled step is not built here anyway
            out["inductor_isa"], out["inductor_flags"] = None, f"unknown ({type(e).__name__}: {e})"
    return out


def limit_problems(cls: CpuClass, check: dict[str, Any]) -> list[str]:
    """Where a process under ``cls``'s limits can still use what the class lacks (empty: every limit holds)."""
    problems = []
    if cls.capability and check["capability"] != cls.capability:
        problems.append(f"torch's capability is {check['capability']}, not {cls.capability}")
    faster = check["matmul_bf16_gflops"] > check["matmul_fp32_gflops"]
    if faster != cls.bf16:
        problems.append(f"bf16 matmuls run at {check['matmul_bf16_gflops']:.0f} GFLOP/s against fp32's "
                        f"{check['matmul_fp32_gflops']:.0f}: {'not ' if cls.bf16 else ''}native")
    if not cls.bf16 and (check["torch_cpu_avx512_bf16"] or check["torch_cpu_amx"]):
        problems.append("torch.cpu still reports AVX-512 BF16 or AMX")
    if not cls.bf16 and "bf16" in (check.get("inductor_flags") or ""):
        problems.append(f"inductor still compiles with {check['inductor_flags']}")
    return problems
