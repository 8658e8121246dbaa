"""The class of machine a run ran on, as each result records it (``RunResult.machine``): a GPU by its name, a CPU by
its model and the instruction set torch's kernels use on it. Two runs with the same seed and settings give the same
candidates on the same class of machine with the same weight format and decode path; another class may round
differently (bfloat16 emulated or native, AVX2 or AVX-512 kernels), so a page can say whether Run here would
reproduce a recorded run, and whose wall times it shows."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"


def cpu_isa() -> str:
    """The instruction set torch's CPU kernels run with here (ATEN_CPU_CAPABILITY may lower it, as it emulates
    another class of CPU), and whether bfloat16 is native (AVX-512 BF16 or AMX, unless ONEDNN_MAX_CPU_ISA rules it
    out)."""
    capability = torch.backends.cpu.get_cpu_capability()
    words = {"AVX512": "AVX-512", "AVX2": "AVX2", "DEFAULT": "no vector extensions"}.get(capability, capability)
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    native_bf16 = (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()) \
        and capability == "AVX512" and (not limit or "BF16" in limit or "AMX" in limit or limit == "ALL")
    return words + (" with BF16" if native_bf16 else "")


@functools.lru_cache(maxsize=8)
def machine_class(device: str | torch.device = "cpu") -> str:
    """One line naming the class of machine a run on ``device`` runs on: 'NVIDIA H100 80GB HBM3 (GPU)',
    'AMD EPYC 9B14 (AVX-512 with BF16)'."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (GPU)"
    if device.type == "mps":
        return "an Apple GPU (MPS)"
    return f"{cpu_model()} ({cpu_isa()})"
