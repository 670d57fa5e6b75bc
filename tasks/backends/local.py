"""The local backend: training and evaluation jobs as subprocesses of the Airflow worker.

A job is one blocking task (a local child cannot outlive the task that started it), so JAX is
only ever imported in the child. Its output is streamed line by line into the task log; a
non-zero exit fails the task, quoting the last lines. A running evaluation job is recorded by
PID (`JobRecords`, on this machine: every local task runs here), so that a task of the same
run can stop it once a lower step passed (`LocalBackend.cancel_evaluation`).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import XComArg, get_current_context, task

from rcpflow.records.nemo_rl import NemoRLError
from tasks.backend_api.job_inputs import job_env, train_inputs, with_run_owner
from tasks.backend_api.protocol import FormDefaults, JobKeys, register
from tasks.deployment import MAX_EVAL_WINDOW, BackendName, Deployment
from tasks.executor_rule import refuse_distributed_executor
from tasks.jobs.processes import send_signal, stop_processes
from tasks.jobs.result import run_evaluate_job
from tasks.jobs.templates import EvaluateJob, TrainJob
from tasks.run.evaluation_group import RCP_VIEW_DOC
from tasks.run.spec import RunSpec, XComValue
from tasks.run.stages import EvalTarget, eval_target, evaluate_target, skip_if_decided, step_target
from tasks.run.train_result import import_checkpoints

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
    started: Callable[[subprocess.Popen[str]], None] | None = None,
) -> None:
    """Run `argv` to completion, streaming its output to the log; raise JobFailed on failure.
    `started(proc)` is called once the child runs, before its output is read."""
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
        if started is not None:
            started(proc)
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


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with
    the PID it names one process, not a later one that reused the PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])


@dataclass(frozen=True)
class JobRecords:
    """The running evaluation jobs of local tasks, one small JSON file per run and step under
    `folder` (this machine's temp folder by default): written when the job starts, removed
    when it ends."""

    folder: Path = Path(tempfile.gettempdir()) / "rcpflow-jobs"

    def path(self, run_dir: str, step: int) -> Path:
        key = hashlib.sha256(run_dir.encode()).hexdigest()[:20]
        return self.folder / key / f"evaluate_step_{step}.json"

    def add(self, run_dir: str, step: int, pid: int) -> None:
        path = self.path(run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"run_dir": run_dir, "step": step, "pid": pid, "start": _start_time(pid)}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    def remove(self, run_dir: str, step: int, pid: int) -> None:
        """Drop the record of `pid` (not a newer one of the same step)."""
        path = self.path(run_dir, step)
        try:
            if json.loads(path.read_text())["pid"] == pid:
                path.unlink()
        except (OSError, ValueError):
            pass

    def running(self, run_dir: str, step: int) -> int | None:
        """The PID of the step's job if it still runs (the same process that was recorded)."""
        try:
            record = json.loads(self.path(run_dir, step).read_text())
        except (OSError, ValueError):
            return None
        pid = record["pid"]
        if record["run_dir"] != run_dir or record["step"] != step:
            return None
        start = _start_time(pid)
        return pid if start is not None and start == record["start"] else None

    def stop(self, run_dir: str, step: int, grace_s: float) -> bool:
        """SIGTERM the step's job, SIGKILL it after `grace_s`; False when none runs."""
        pid = self.running(run_dir, step)
        if pid is None:
            return False
        log.info("evaluate step %d: stopping its job, pid %d", step, pid)
        send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.running(run_dir, step) == pid and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.running(run_dir, step) == pid:
            send_signal(pid, signal.SIGKILL)
        return True


@contextlib.contextmanager
def importing_checkpoints(run: RunSpec, job: TrainJob, interval_s: float) -> Iterator[None]:
    """While the block runs (the training job), import the checkpoints a job that leaves its
    own tree has committed so far (`tasks.run.train_result`), so that a wait sees their rows
    during training; a problem is logged here and named by the output check after the job."""
    if not job.result.imported:
        yield
        return
    done = threading.Event()

    def once() -> None:
        try:
            import_checkpoints(
                run.run_dir, run.seed, job.result, run.effective_val_start_at, allow_empty=True
            )
        except NemoRLError as exc:
            log.warning("checkpoint import: %s", exc)

    def poll() -> None:
        while not done.wait(interval_s):
            once()

    thread = threading.Thread(target=poll, name=f"import seed {run.seed}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        once()  # the last checkpoints, before the train task ends (the trainer's block_stop
        # already says training ended: a wait must find their rows)


@register
class LocalBackend:
    """Jobs as subprocesses of the worker: the deployment's ``[jobs]`` templates, run with its
    interpreter and environment (``job_env``, then the job's own ``env``)."""

    name: ClassVar[BackendName] = "local"
    # The worker runs no images and holds no Secrets of a cluster.
    job_keys: ClassVar[JobKeys] = JobKeys()
    jobs_run_on_worker: ClassVar[bool] = True
    # The default jobs are the toy: it learns at its own learning rate (open division) and
    # passes within 40 steps at gbs 256 (the demo's setting).
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="open", max_steps=40)

    def __init__(self, deployment: Deployment, records: JobRecords | None = None) -> None:
        refuse_distributed_executor(deployment)  # its jobs run on the worker's own host
        self.deployment = deployment
        self.train: TrainJob = deployment.jobs.train
        self.evaluate_job: EvaluateJob = deployment.jobs.evaluate
        self.records = records or JobRecords()

    def cancel_evaluation(self, run_dir: str, step: int) -> bool:
        return self.records.stop(run_dir, step, grace_s=_STOP_GRACE_S)

    def train_job(self, spec: XComArg) -> DependencyMixin:
        deployment, job = self.deployment, self.train
        env = job_env(deployment.job_env, job)

        @task(execution_timeout=timedelta(minutes=deployment.train_timeout_minutes))
        def train_job(spec: XComValue) -> None:
            run = RunSpec.from_dict(spec)
            inputs = train_inputs(job, run.job_values(), deployment.job_python)
            ti = get_current_context()["ti"]
            owned = with_run_owner({**env, **inputs["env"]}, ti.dag_id, ti.run_id, ti.task_id)
            with importing_checkpoints(run, job, deployment.checkpoint_poll_seconds):
                run_job(inputs["argv"], name=f"train seed {run.seed}", env=owned)

        return train_job(spec)

    def _launcher(self) -> Callable[[str, int, Callable[[], EvalTarget]], None]:
        deployment, job = self.deployment, self.evaluate_job
        env = job_env(deployment.job_env, job)

        records = self.records

        def launch(run_dir: str, step: int, target_of: Callable[[], EvalTarget]) -> None:
            pids: list[int] = []

            def started(proc: subprocess.Popen[str]) -> None:
                pids.append(proc.pid)
                records.add(run_dir, step, proc.pid)
                # A lower step that passed before this record existed could not stop this
                # job: look again now that it can (`cancel_above` runs after the pass).
                try:
                    skip_if_decided(target_of())
                except BaseException:
                    stop_processes([proc], first=signal.SIGTERM, grace_s=_STOP_GRACE_S)
                    raise

            try:
                run_evaluate_job(
                    job,
                    run_dir,
                    step,
                    python=deployment.job_python,
                    run=lambda argv: run_job(
                        argv, name=f"evaluate step {step}", env=env, started=started
                    ),
                )
            finally:
                for pid in pids:
                    records.remove(run_dir, step, pid)

        return launch

    def _evaluate_limits(self, window: int) -> dict[str, Any]:
        deployment = self.deployment
        return {
            "max_active_tis_per_dagrun": window,
            "retries": deployment.eval_retries,
            "execution_timeout": timedelta(minutes=deployment.eval_timeout_minutes),
            "doc_md": RCP_VIEW_DOC,
        }

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        launch, cancel = self._launcher(), self.cancel_evaluation

        @task(
            map_index_template="step {{ task.op_kwargs['row']['step'] }}",
            **self._evaluate_limits(self.deployment.eval_window),
        )
        def evaluate(run_dir: str, row: dict[str, Any]) -> dict[str, Any]:
            target = eval_target(run_dir, row)
            return evaluate_target(
                target, lambda d, s: launch(d, s, lambda: eval_target(d, row)), cancel
            )

        return evaluate.partial(run_dir=run_dir).expand(row=rows)

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        launch, cancel = self._launcher(), self.cancel_evaluation

        # The run's own window (a Param) is held by the step's wait; this is only a ceiling.
        @task(
            map_index_template="step {{ task.op_kwargs['step'] }}",
            **self._evaluate_limits(MAX_EVAL_WINDOW),
        )
        def evaluate(run_dir: XComValue, step: XComValue) -> dict[str, Any]:
            target = step_target(run_dir, step)
            return evaluate_target(
                target, lambda d, s: launch(d, s, lambda: step_target(d, s)), cancel
            )

        return evaluate(run_dir=run_dir, step=step)
