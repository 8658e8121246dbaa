"""How many cores are free right now: the same one-thread matmul loop alone, then two copies side
by side. Two free cores give each copy its time alone; one free core gives each twice that.
Run from the repository root: python benchmarks/results/cpu-2core-epyc/ray/cores_check.py"""

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

LOOP = ("import time, torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\nt = time.perf_counter()\n"
        "for _ in range(400):\n    a @ a\nprint(time.perf_counter() - t)")


def side_by_side(k: int) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(k)]
    return [float(p.communicate()[0]) for p in procs]


def main() -> None:
    load_before = os.getloadavg()
    alone, two, alone_again = side_by_side(1), side_by_side(2), side_by_side(1)
    mean_alone = (alone[0] + alone_again[0]) / 2
    record = {"command": "python benchmarks/results/cpu-2core-epyc/ray/cores_check.py",
              "time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu_count": os.cpu_count(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "alone_s": [alone[0], alone_again[0]], "two_side_by_side_s": two,
              "throughput_two_over_one": 2 * mean_alone / max(two)}
    out = Path(__file__).resolve().parent / "cores_check.json"
    runs = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(runs + [record], indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
