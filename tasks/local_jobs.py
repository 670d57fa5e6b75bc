"""The local backend: training and evaluation jobs as subprocesses of the Airflow worker.

Jobs run as ``python -m tpu_jobs.train|evaluate`` so JAX is only ever imported in the child,
never in an Airflow process. Commands are argument lists built from typed values: no shell, so
nothing a user typed into a Param is ever interpreted by one. The child's output is streamed
line by line into the task log; a non-zero exit is a task failure that quotes the last lines.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

_TAIL_LINES = 40
_STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


class JobFailed(RuntimeError):
    """A job exited non-zero (or could not start); the message quotes its last output lines."""


TRAIN_MODULE = "tpu_jobs.train"
EVALUATE_MODULE = "tpu_jobs.evaluate"


def train_args(
    *,
    run_dir: str,
    seed: int,
    global_batch_size: int,
    max_steps: int,
    val_start_at: int | None,
    division: str,
) -> list[str]:
    """Arguments of ``python -m tpu_jobs.train`` (the same on every backend)."""
    args = [
        "--run-dir",
        run_dir,
        "--seed",
        str(seed),
        "--global-batch-size",
        str(global_batch_size),
        "--max-steps",
        str(max_steps),
        "--division",
        division,
    ]
    if val_start_at is not None:
        args += ["--val-start-at", str(val_start_at)]
    return args


def evaluate_args(*, run_dir: str, step: int) -> list[str]:
    """Arguments of ``python -m tpu_jobs.evaluate`` (the same on every backend)."""
    return ["--run-dir", run_dir, "--step", str(step)]


def module_command(python: str, module: str, args: Sequence[str]) -> list[str]:
    return [python, "-m", module, *args]


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the Airflow task process is killed (SIGKILL
    # after a timeout or "mark failed"), the job gets SIGTERM instead of running on orphaned.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_job(
    argv: Sequence[str],
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> None:
    """Run `argv` to completion, streaming its output to the log; raise JobFailed on failure."""
    child_env = dict(os.environ)
    if env:
        child_env.update(env)
    # The child's Python output must reach us line by line, not in 8 KiB blocks at exit.
    child_env["PYTHONUNBUFFERED"] = "1"
    log.info("%s: starting %s", name, subprocess.list2cmdline(argv))
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            cwd=cwd,
            text=True,
            errors="replace",
            bufsize=1,
            preexec_fn=_die_with_parent,
        )
    except OSError as exc:
        raise JobFailed(f"{name}: could not start {argv[0]!r}: {exc}") from exc
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            log.info("%s | %s", name, line)
        returncode = proc.wait()
    finally:
        # Reached with the child still running only when we are interrupted (timeout, kill).
        if proc.poll() is None:
            log.warning("%s: stopping pid %d", name, proc.pid)
            proc.terminate()
            try:
                proc.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if returncode != 0:
        last = "\n".join(tail)
        raise JobFailed(f"{name} exited with status {returncode}; last output lines:\n{last}")
    log.info("%s: finished", name)
