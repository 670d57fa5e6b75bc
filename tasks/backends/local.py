"""The local backend: training and evaluation jobs as subprocesses of the Airflow worker.

A job is one blocking task (a local child cannot outlive the task that started it), so JAX is
only ever imported in the child. Its output is streamed line by line into the task log; a
non-zero exit fails the task, quoting the last lines.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import XComArg, get_current_context, task

from rcpflow.ownership import OWNER_ENV, airflow_owner
from tasks.backends.base import FormDefaults, register
from tasks.deployment import BackendName, Deployment
from tasks.jobs.result import run_evaluate_job
from tasks.jobs.templates import EvaluateJob, TrainJob
from tasks.jobs.values import train_values
from tasks.processes import stop_processes
from tasks.run.spec import RunSpec, XComValue
from tasks.run.steps import eval_target, evaluate_target, step_target

if TYPE_CHECKING:
    from airflow.sdk.definitions._internal.mixins import DependencyMixin

log = logging.getLogger(__name__)

_TAIL_LINES = 40
_STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


class JobFailed(RuntimeError):
    """A job exited non-zero (or could not start); the message quotes its last output lines."""


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
            stop_processes([proc], first=signal.SIGTERM, grace_s=_STOP_GRACE_S)
    if returncode != 0:
        last = "\n".join(tail)
        raise JobFailed(f"{name} exited with status {returncode}; last output lines:\n{last}")
    log.info("%s: finished", name)


@register
class LocalBackend:
    """Jobs as subprocesses of the worker: the deployment's ``[jobs]`` templates, run with its
    interpreter and environment (``job_env``, then the job's own ``env``)."""

    name: ClassVar[BackendName] = "local"
    jobs_run_on_worker: ClassVar[bool] = True
    # The default jobs are the toy: it learns at its own learning rate (open division) and
    # passes within 40 steps at gbs 256 (the demo's setting).
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="open", max_steps=40)

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.train: TrainJob = deployment.jobs.train
        self.evaluate_job: EvaluateJob = deployment.jobs.evaluate

    def train_job(self, spec: XComArg) -> DependencyMixin:
        deployment, job = self.deployment, self.train
        env = {**deployment.job_env, **job.env}

        @task(execution_timeout=timedelta(minutes=deployment.train_timeout_minutes))
        def train_job(spec: XComValue) -> None:
            run = RunSpec.from_dict(spec)
            argv = job.job_command.render(train_values(run.job_values(), deployment.job_python))
            # The run folder's owner: every try of this DAG run's task, and nobody else.
            ti = get_current_context()["ti"]
            owner = airflow_owner(ti.dag_id, ti.run_id, ti.task_id)
            run_job(argv, name=f"train seed {run.seed}", env={**env, OWNER_ENV: owner})

        return train_job(spec)

    def _launcher(self) -> Callable[[str, int], None]:
        deployment, job = self.deployment, self.evaluate_job
        env = {**deployment.job_env, **job.env}

        def launch(run_dir: str, step: int) -> None:
            run_evaluate_job(
                job,
                run_dir,
                step,
                python=deployment.job_python,
                run=lambda argv: run_job(argv, name=f"evaluate step {step}", env=env),
            )

        return launch

    def _evaluate_limits(self) -> dict[str, Any]:
        deployment = self.deployment
        return {
            "max_active_tis_per_dagrun": deployment.eval_window,
            "retries": deployment.eval_retries,
            "execution_timeout": timedelta(minutes=deployment.eval_timeout_minutes),
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        launch = self._launcher()

        @task(
            map_index_template="step {{ task.op_kwargs['row']['step'] }}", **self._evaluate_limits()
        )
        def evaluate(run_dir: str, row: dict[str, Any]) -> dict[str, Any]:
            return evaluate_target(eval_target(run_dir, row), launch)

        return evaluate.partial(run_dir=run_dir).expand(row=rows)

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        launch = self._launcher()

        @task(map_index_template="step {{ task.op_kwargs['step'] }}", **self._evaluate_limits())
        def evaluate(run_dir: XComValue, step: XComValue) -> dict[str, Any]:
            return evaluate_target(step_target(run_dir, step), launch)

        return evaluate(run_dir=run_dir, step=step)
