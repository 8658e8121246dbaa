"""The ``cuda_graphs`` setting's one place: which forward pass a run's decode loop calls.

A CUDA-graph decode would capture ``model(...)`` once per live-row count over a preallocated KV slab and
replay it, so that a step costs one graph launch instead of a few hundred kernel launches. It is not
implemented: this version has no GPU to test one on, and the engine's cache grows and is compacted by
reallocating (``GrowableLayer``), which a captured graph cannot follow. Asking for it logs one line that
says why the run decodes eagerly, and the run is exactly the eager one. A graph path goes in
:func:`decode_forward`, which must fall back to the eager forward when capture fails.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger(__name__)


def decode_forward(gen, cuda_graphs: bool = False) -> Callable:
    """The function a run feeds each step's tokens through, ``forward(batch, tokens)``: the generator's
    eager forward. With ``cuda_graphs``, one logged line says why it is still the eager one."""
    if cuda_graphs:
        device = torch.device(getattr(gen, "device", "cpu"))
        why = (f"{device} is not a CUDA device" if device.type != "cuda"
               else "this version has no CUDA-graph decode path (issue #24)")
        log.warning("cuda_graphs: %s; decoding eagerly", why)
    return gen.forward
