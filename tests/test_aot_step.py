"""The saved compiled step (sbon.aot_step) on a small function: what a file can hold."""

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


def test_a_step_through_a_class_defined_inside_a_function_is_saved_and_loaded(tmp_path):
    """Saved, then loaded and run on another layer with the same weights, as a later process has: the file holds
    nothing of the objects themselves."""
    torch.manual_seed(0)
    layer, other, x = Layer().eval(), Layer().eval(), torch.randn(3, 8)
    other.load_state_dict(layer.state_dict())
    path = tmp_path / "step.pt"
    with torch.inference_mode():
        aot_step.build(step, (layer, x), path, {})
        saved = aot_step.load(step, path)
        assert saved.fits(other, x)
        assert torch.allclose(saved(other, x), step(layer, x))
