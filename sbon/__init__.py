"""SBoN Explorer: Speculative Rejection (fast Best-of-N decoding) on any transformers model.

The names below load their module on first use (PEP 562): a process that needs one light module, such as
``import sbon.machine_load``, does not import torch and transformers' model stack first, which takes seconds."""

import importlib

_MODULE_OF = {"METHODS": "algorithms", "best_of_n": "algorithms", "events": "algorithms", "run": "algorithms",
              "speculative_bon_tau": "algorithms", "speculative_rejection": "algorithms", "RunConfig": "config",
              "Generator": "engine", "SamplingConfig": "engine", "SBoNError": "errors", "load_generator": "models",
              "load_reward": "models", "Candidate": "results", "RunResult": "results"}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'sbon' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
