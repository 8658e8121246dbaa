"""`.ci/run` fails on a machine where chromium cannot be installed, instead of passing with the browser tests
skipped. Runs the real script with stand-ins for pip, apt-get and python (no install, no test run)."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ci_run(tmp_path: Path, with_chromium: bool) -> subprocess.CompletedProcess:
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    bin_dir.mkdir()
    for tool in ("dirname",):  # the only programs the script calls besides the stand-ins
        (bin_dir / tool).symlink_to(shutil.which(tool))
    stubs = {"pip": "exit 0", "apt-get": "exit 100",  # no network: the install attempt fails
             "python": f'echo "$@" >> "{tmp_path}/python.log"'}
    if with_chromium:
        stubs["chromium"] = "exit 0"
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return subprocess.run(["/bin/bash", str(repo / ".ci" / "run")], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(bin_dir)})


def test_ci_fails_when_chromium_cannot_be_installed(tmp_path):
    done = ci_run(tmp_path, with_chromium=False)
    assert done.returncode == 1
    assert "chromium is missing" in done.stderr
    assert not (tmp_path / "python.log").exists()  # the tests never ran


def test_ci_runs_the_tests_when_chromium_is_there(tmp_path):
    done = ci_run(tmp_path, with_chromium=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "python.log").read_text() == "-m pytest\n"
