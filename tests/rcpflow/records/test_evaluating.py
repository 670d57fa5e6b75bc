"""The evaluation-in-progress record (`rcpflow.records.evaluating`): there while the block runs,
gone after it, after a failure and after SIGTERM (a cancelled evaluation); left by a worker that
does not persist the summary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rcpflow.files.layout import RunLayout
from rcpflow.records.evaluating import held, running

HOLD = """
import sys
from rcpflow.records.evaluating import held
with held(sys.argv[1], 18, "ckpt", remove=True):
    print("held", flush=True)
    sys.stdin.readline()  # until the test has sent SIGTERM (then it never returns)
"""


def test_the_record_is_there_during_the_block_and_gone_after(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    assert running(run_dir, 18) is None
    with held(run_dir, 18, f"{run_dir}/checkpoints/18", remove=True):
        said = running(run_dir, 18)
        assert said is not None and said.startswith(RunLayout(run_dir).evaluating(18) + ": pid ")
    assert running(run_dir, 18) is None
    with pytest.raises(RuntimeError), held(run_dir, 18, "ckpt", remove=True):
        raise RuntimeError("the evaluation failed")
    assert running(run_dir, 18) is None
    with held(run_dir, 19, "ckpt", remove=False):  # a worker other than 0
        pass
    assert running(run_dir, 19) is not None  # worker 0 removes it once the summary is written
    Path(RunLayout(run_dir).evaluating(19)).write_text("{not json")
    assert running(run_dir, 19) == f"{RunLayout(run_dir).evaluating(19)} (unreadable)"


def test_sigterm_removes_the_record_and_still_ends_the_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        assert running(str(tmp_path), 18) is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM  # died of it, as without the record
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert running(str(tmp_path), 18) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace of its own needs root (CI is root)")
def test_sigterm_to_pid_1_of_a_container_ends_it_without_its_record(tmp_path: Path) -> None:
    """In a container the evaluator is PID 1, where the kernel ignores a signal's default
    action: re-raising SIGTERM would leave it evaluating with its record gone (found on the
    real pods of issue 46). It ends with 143 instead."""
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", HOLD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1  # the evaluator, PID 1 of its namespace
        status = Path(f"/proc/{children[0]}/status").read_text().splitlines()
        nspid = next(line for line in status if line.startswith("NSpid:")).split()
        assert nspid[-1] == "1"  # its pid in its own namespace
        os.kill(int(children[0]), signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert running(str(tmp_path), 18) is None
