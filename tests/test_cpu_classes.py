"""The emulated CPU classes of `python -m benchmarks machines`: their limits, and the check that they hold."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cpu_classes import CPU_CLASSES, EMULATE_DIR, limit_problems

ROOT = Path(__file__).resolve().parents[1]


def check(**changes):
    base = {"capability": "AVX512", "torch_cpu_avx512_bf16": False, "torch_cpu_amx": False,
            "matmul_fp32_gflops": 130.0, "matmul_bf16_gflops": 70.0, "inductor_flags": "-mavx512f -mfma"}
    return {**base, **changes}


def test_a_limit_that_does_not_hold_is_named():
    no_bf16 = CPU_CLASSES["avx512"]
    assert limit_problems(no_bf16, check()) == []
    assert limit_problems(no_bf16, check(matmul_bf16_gflops=400.0)) == [
        "bf16 matmuls run at 400 GFLOP/s against fp32's 130: native"]
    assert limit_problems(no_bf16, check(torch_cpu_avx512_bf16=True)) == ["torch.cpu still reports AVX-512 BF16 or AMX"]
    assert limit_problems(no_bf16, check(inductor_flags="-mavx512f -mavx512bf16")) == [
        "inductor still compiles with -mavx512f -mavx512bf16"]
    assert limit_problems(CPU_CLASSES["avx2"], check()) == ["torch's capability is AVX512, not AVX2"]
    assert limit_problems(CPU_CLASSES["avx512-bf16"], check()) == [
        "bf16 matmuls run at 70 GFLOP/s against fp32's 130: not native"]


def test_a_class_without_bf16_hides_it_from_every_python_process_of_the_run():
    env = CPU_CLASSES["avx512"].environ({"PATH": "/usr/bin"})
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_VNNI" and env["PYTHONPATH"].split(":")[0] == str(EMULATE_DIR)
    assert (EMULATE_DIR / "sitecustomize.py").exists()
    assert CPU_CLASSES["avx512-bf16"].environ({}) == {}  # this machine as it is: no limits


@pytest.mark.slow  # a Python process with torch under the laptop's limits
def test_the_laptop_class_limits_torch_onednn_and_inductor():
    code = ("import json; from benchmarks.cpu_classes import isa_check; "
            "print(json.dumps(isa_check()))")
    out = subprocess.run([sys.executable, "-c", code], env=CPU_CLASSES["avx2"].environ(), cwd=ROOT,
                         capture_output=True, text=True, check=True)
    measured = json.loads(out.stdout.splitlines()[-1])
    assert measured["capability"] == "AVX2" and not measured["torch_cpu_avx512_bf16"]
    assert "avx512" not in (measured["inductor_flags"] or "")
    assert limit_problems(CPU_CLASSES["avx2"], measured) == []


def test_the_report_names_each_class_native_or_emulated_and_adds_another_machine_s_own_class(tmp_path):
    """The machines tables: the reference machine's files, each said native or emulated from the CPU's own flags
    (without them, only the class that sets no limit is native), then another machine's file of its own class, with
    AMX where its CPU has it; that machine's emulated classes are left out (the reference machine has those)."""
    from benchmarks.report import result_tables
    from benchmarks.report.formatting import MACHINE

    shipped = json.loads((ROOT / "benchmarks/results" / MACHINE / "machines/avx2.json").read_text())

    def write(folder: str, name: str, flags: list[str] | None) -> None:
        env = {**shipped["environment"], "cpu_model": folder}
        if flags is not None:
            env["cpu_flags"] = flags
        path = tmp_path / folder / "machines" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**shipped, "class": name, "title": CPU_CLASSES[name].title, "environment": env}))

    write(MACHINE, "avx512-bf16", None)
    write(MACHINE, "avx2", ["avx2", "fma", "avx512f", "avx512_bf16"])
    write("cpu-2core-laptop", "avx2", ["avx2", "fma"])
    write("cpu-2core-laptop", "avx512", ["avx2", "fma"])  # not this CPU's class: emulated, left out
    write("cpu-2core-amx", "avx512-bf16", ["avx2", "avx512f", "amx_bf16"])
    table = result_tables.machines_readme(tmp_path)
    rows = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()[2:]]
    assert rows == [f"AVX-512 with BF16 (native on {MACHINE})", f"AVX2 only (emulated on {MACHINE})",
                    "AVX-512 with BF16 (native on cpu-2core-amx, with AMX)",
                    "AVX2 only (native on cpu-2core-laptop)"], rows
