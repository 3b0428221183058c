"""Pre-flight checks: shared memory and open files, against what the run will share."""

from __future__ import annotations

import resource
import subprocess
import sys


def _limited(soft: int, hard: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return limit


def _run(installed, run_dir, soft: int, hard: int, tensors: int):
    args = ["--plugin", "probe", "--workers", "1", "--total-steps", "100", "--quiet"]
    args += ["--run-dir", str(run_dir), "--set", f"model_tensors={tensors}"]
    return subprocess.run(
        [sys.executable, "-m", "mprl", "run", *args],
        capture_output=True, text=True, timeout=120, preexec_fn=_limited(soft, hard),
    )  # fmt: skip


def test_too_low_open_file_limit_is_refused_before_starting(installed, run_dir):
    # 600 parameter tensors, each an open file under the file_descriptor strategy
    proc = _run(installed, run_dir, 400, 400, tensors=600)
    assert proc.returncode == 2, proc.stderr
    assert "open-file limit is 400 (`ulimit -Hn`)" in proc.stderr
    assert "ulimit -n" in proc.stderr and "set_sharing_strategy('file_system')" in proc.stderr
    assert not run_dir.exists()


def test_a_low_soft_limit_is_raised_and_the_run_goes_on(installed, run_dir):
    proc = _run(installed, run_dir, 400, 8192, tensors=600)
    assert proc.returncode == 0, proc.stderr
    assert "raised the open-file limit from 400 to" in proc.stderr
    # more tensors than a forkserver can pass a child: spawned children, said once
    assert "children start with spawn: the run shares" in proc.stderr
