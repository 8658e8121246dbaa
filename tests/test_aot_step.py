"""The saved compiled step (sbon.aot_step) on a small function: what a file can hold, and which files stay."""

import os
import time

import torch

from sbon import aot_step


def _wrapped(func):
    """A module class made inside a function around ``func``, as the `kernels` package wraps model functions (Llama's
    rotary embedding) where transformers finds it installed."""
    class Func(torch.nn.Module):
        def forward(self, *args):
            return func(*args)
    return Func()


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.funcs = {"scale": _wrapped(lambda x: x * 2.0)}  # a plain attribute, as `kernels` keeps its wrappers

    def forward(self, x):
        return self.funcs["scale"](self.linear(x))


def step(layer, x):
    return layer(x) + 1.0


def test_a_step_is_saved_and_loaded_and_saving_one_deletes_the_steps_no_process_loaded_for_two_weeks(tmp_path):
    """Saved, then loaded and run on another layer with the same weights, as a later process has: the file holds
    nothing of the objects themselves (the layer calls a class defined inside a function). An update renames the step
    (its key hashes the code and the versions): the old file is never loaded again, and goes when a step is next
    saved; one loaded within the fortnight stays, and loading marks it used. One build serves both: each takes
    seconds."""
    day = 86400
    stale, recent = tmp_path / "stale.pt", tmp_path / "recent.pt"
    for path, age in ((stale, aot_step.UNUSED_DAYS + 1), (recent, aot_step.UNUSED_DAYS - 1)):
        path.write_bytes(b"a step an earlier version saved")
        os.utime(path, (time.time() - age * day,) * 2)
    torch.manual_seed(0)
    layer, other, x = Layer().eval(), Layer().eval(), torch.randn(3, 8)
    other.load_state_dict(layer.state_dict())
    path = tmp_path / "step.pt"
    with torch.inference_mode():
        aot_step.build(step, (layer, x), path, {})
        assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["recent.pt", "step.pt"]
        os.utime(path, (time.time() - (aot_step.UNUSED_DAYS + 1) * day,) * 2)
        saved = aot_step.load(step, path)
        assert saved.fits(other, x)
        assert torch.allclose(saved(other, x), step(layer, x))
    assert time.time() - path.stat().st_mtime < day
    assert aot_step.forget_unused(tmp_path) == []  # the step just loaded, and the recent one, stay
