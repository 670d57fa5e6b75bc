"""The local driver (`LocalDriver`): training and evaluation jobs as process groups of this
machine, through the process calls of `tasks.backends.local.processes`, under the one
lifecycle of `tasks.backend_api` (so the demo runs the nodes a cluster's run runs). JAX is only
ever imported in the jobs.

It is single-host: the worker that starts a job, the triggerer that watches it and the teardown
that cancels it must run on the same machine (they find the job by its process and its files
in this machine's temp folder).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from tasks.backend_api.job_inputs import job_env
from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import eval_label
from tasks.backend_api.protocol import FormDefaults, JobKeys, JobRequest, Submitted, register
from tasks.backends.local import processes
from tasks.backends.local.processes import DEFAULT_JOBS_ROOT, LocalJob
from tasks.deployment import BackendName, Deployment

if TYPE_CHECKING:
    from tasks.jobs.command import Role
    from tasks.jobs.templates import EvaluateJob, TrainJob


@register
@dataclass(frozen=True)
class LocalDriver:
    """Jobs as local process groups (see the module doc): the deployment's ``[jobs]``
    templates, run with its interpreter (`python`) and environment (`base_env`, then the job's
    own ``env``), each in its folder under `jobs_root`."""

    name: ClassVar[BackendName] = "local"
    # The worker runs no images and holds no Secrets of a cluster.
    job_keys: ClassVar[JobKeys] = JobKeys()
    jobs_run_on_worker: ClassVar[bool] = True
    # The default jobs are the toy: it learns at its own learning rate (open division) and
    # passes within 40 steps at gbs 256 (the demo's setting).
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="open", max_steps=40)
    cluster_word: ClassVar[str] = "machine"
    quick_jobs: ClassVar[bool] = True

    python: str
    base_env: Mapping[str, str]
    jobs_root: str = str(DEFAULT_JOBS_ROOT)
    poll_interval_s: float = 2.0
    outage_budget_s: float = 600.0
    backoff_max_s: float = 30.0
    run_retries: int = 0

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> LocalDriver:
        return cls(python=deployment.job_python, base_env=dict(deployment.job_env))

    def args(self) -> dict[str, Any]:
        # the triggerer reads and cancels by the job's reference: the root is enough
        return {"jobs_root": self.jobs_root}

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> LocalDriver:
        return cls(python="python", base_env={}, jobs_root=str(args["jobs_root"]))

    def job_env(self, job: TrainJob | EvaluateJob) -> dict[str, str]:
        return job_env(self.base_env, job)

    def train_extra(self, values: Mapping[str, str | int]) -> dict[str, Any] | None:
        return None

    def max_restarts(self, role: Role) -> int:
        return 0

    def defer_timeout(
        self, job_timeout: timedelta | None, memo: Mapping[str, Any]
    ) -> timedelta | None:
        # the job's own bound: the task fails at it, and its teardown cancels the job
        return job_timeout

    # --- on the worker ----------------------------------------------------------------------

    def folder(self, request: JobRequest, label: str) -> Any:
        return processes.job_folder(
            self.jobs_root, request.dag_id, request.run_id, request.run_dir, label
        )

    def planned_ref(self, request: JobRequest) -> Mapping[str, Any] | None:
        return None  # a job is its process: known once started

    def submit_or_adopt(self, request: JobRequest, log: Any) -> Submitted:
        name = _job_name(request)
        folder = self.folder(request, request.label)
        job, adopted = processes.start_or_adopt(folder, name, request.argv, request.env)
        if adopted:
            return Submitted(job.ref(), line=f"{name} (pid {job.pid}) is running already: adopted")
        argv = subprocess.list2cmdline(request.argv)
        return Submitted(job.ref(), line=f"{name}: started {argv} (pid {job.pid})")

    def restart(self, request: JobRequest, log: Any) -> Submitted:
        raise NotImplementedError("the local driver restarts no job (a task retry does)")

    def waits_for(self, request: JobRequest, log: Any) -> Submitted | None:
        return None

    def cancel(self, ref: Mapping[str, Any]) -> bool:
        return processes.cancel(LocalJob.from_ref(ref))

    def cancel_step(self, dag_id: str, run_id: str, run_dir: str, step: int) -> bool:
        folder = processes.job_folder(self.jobs_root, dag_id, run_id, run_dir, eval_label(step))
        return processes.cancel_running(folder)

    def describe(self, ref: Mapping[str, Any]) -> str:
        return str(ref["name"])

    def output_tail(self, ref: Mapping[str, Any], state: JobState) -> str:
        if processes.could_not_start(state):
            return ""  # its line names the program and why, in one line
        return processes.output_tail(LocalJob.from_ref(ref))

    def remove(self, ref: Mapping[str, Any]) -> None:
        processes.remove_folder(LocalJob.from_ref(ref))

    # --- on the triggerer -------------------------------------------------------------------

    async def read(self, ref: Mapping[str, Any], memo: dict[str, Any], now: float) -> JobState:
        job = LocalJob.from_ref(ref)
        state = await asyncio.to_thread(processes.state, job)
        # after the state: a job that has ended has written all its output
        lines, memo["output_offset"] = await asyncio.to_thread(
            processes.read_output, job, int(memo.get("output_offset", 0))
        )
        return JobState(state.line, state.outcome, state.exit_code, output=tuple(lines))


def _job_name(request: JobRequest) -> str:
    """How the task log names a local job: ``train``, ``evaluate step N``."""
    if request.role == "train":
        return request.label
    return f"evaluate {request.label.replace('eval-', 'step ', 1)}"
