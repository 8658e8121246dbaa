"""On PYTHONPATH only for an emulated CPU class (benchmarks.cpu_classes): torch.cpu's BF16/AMX checks say no in
every Python process of the run, as on a CPU without them."""
import os

if os.environ.get("SBON_EMULATED_CPU"):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for benchmarks.cpu_classes
    from benchmarks.cpu_classes import hide_cpu_features

    hide_cpu_features()
