"""The Slurm driver (`SlurmDriver`): jobs as Slurm batch jobs under the one lifecycle of
`tasks.backend_api`, through the hooks of `tasks.backends.slurm.hooks` (imported in the
function: DAG parsing stays cheap) and the cluster calls of `.adapter`.

The batch script is rendered as the job is submitted (never in an XCom, a template field or a
log line). A retry adopts the job of that name an earlier try left running, or takes the one
that ended with success (`adapter.submit_or_adopt`); only jobs of the submitting account
carrying rcpflow's comment are adopted, read or cancelled. When a job ends, the exit-code
contract (`.outcome.decide`) says what follows: success; fail at once (2, 5); start again,
counted against the shape's ``max_restarts`` (other codes, the time limit) or not
(preemption, node failure, SIGTERM): the restart itself is the lifecycle's
(`tasks.backend_api.job_operator`). With ``eval_in_training_allocation`` the training's job
evaluates in its own allocation after training (`.in_allocation`), and an evaluation waits
for it first (`waits_for`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from tasks.backend_api.job_state import JobState, Outcome
from tasks.backend_api.lifecycle_names import TRAIN_LABEL, eval_label
from tasks.backend_api.protocol import FormDefaults, JobKeys, JobRequest, Submitted, register
from tasks.backends.slurm.adapter import (
    hook_for,
    job_name,
    job_ref,
    role_of,
    running_job,
    running_jobs,
    state_line,
    submit_or_adopt,
)
from tasks.backends.slurm.in_allocation import (
    check_in_allocation,
    in_allocation_eval,
    in_allocation_fields,
)
from tasks.backends.slurm.script import BatchJob, output_file
from tasks.backends.slurm.settings import TABLE, SlurmSettings
from tasks.deployment import BackendName, Deployment

if TYPE_CHECKING:
    from tasks.backends.slurm.hooks import AsyncSlurmHook, JobInfo
    from tasks.jobs.command import Role
    from tasks.jobs.templates import EvaluateJob, TrainJob

_TAIL_BYTES = 4000
# What the triggerer needs of the settings to reach the cluster (`args`); log_dir: a job's
# output file is derived from it, never read from the cluster's answer.
_CONNECTION_FIELDS = (
    "transport", "ssh_conn_id", "rest_url", "rest_conn_id", "command_timeout_s", "log_dir",
    "export_env",
)  # fmt: skip
# The contract's answers (`outcome.decide`) as the lifecycle's outcomes.
_OUTCOMES: Mapping[str, Outcome] = {
    "succeeded": "succeeded",
    "cancelled": "cancelled",
    "fail_now": "fail_now",
    "restart_counted": "restart",
    "restart_uncounted": "restart_uncounted",
}


@register
class SlurmDriver:
    """Jobs as Slurm batch jobs on the cluster of `settings` (see the module doc); `evaluate`:
    the deployment's evaluate job, for the evaluation in the training's allocation."""

    name: ClassVar[BackendName] = "slurm"
    # An image is a Pyxis container, a secret a reference on the cluster: [slurm.<role>] keys.
    job_keys: ClassVar[JobKeys] = JobKeys(image="container_image", secret_env="secret_env")
    jobs_run_on_worker: ClassVar[bool] = False
    # GPU clusters run the benchmark itself: the closed division's rules.
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="closed", max_steps=60)
    cluster_word: ClassVar[str] = "cluster"
    quick_jobs: ClassVar[bool] = True

    def __init__(self, settings: SlurmSettings, evaluate: EvaluateJob | None = None) -> None:
        self.settings = settings
        self.evaluate = evaluate
        self.poll_interval_s = settings.poll_interval_s
        self.outage_budget_s = settings.outage_budget_s
        self.backoff_max_s = settings.backoff_max_s
        self.run_retries = settings.run_retries
        self.python = settings.python
        self._async_hook: AsyncSlurmHook | None = None

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> SlurmDriver:
        settings = deployment.backend_table(TABLE, SlurmSettings)
        if settings.eval_in_training_allocation:
            check_in_allocation(deployment, settings)
        return cls(settings, deployment.jobs.evaluate)

    def args(self) -> dict[str, Any]:
        s = self.settings
        return {
            "connection": {name: getattr(s, name) for name in _CONNECTION_FIELDS},
            "fail_exit_codes": list(s.fail_exit_codes),
            "shapes": {
                role: {"signal_grace_s": shape.signal_grace_s, "time_limit": shape.time_limit}
                for role, shape in (("train", s.train), ("evaluate", s.evaluate))
            },
        }  # fmt: skip

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> SlurmDriver:
        from dataclasses import replace

        base = SlurmSettings(working_dir="/", log_dir="/")
        connection = dict(args["connection"])
        connection["export_env"] = tuple(connection.get("export_env", ()))
        shapes = args["shapes"]
        settings = replace(
            base,
            **connection,
            fail_exit_codes=tuple(args["fail_exit_codes"]),
            train=replace(base.train, **shapes["train"]),
            evaluate=replace(base.evaluate, **shapes["evaluate"]),
        )
        # What `read` imports, imported here: a trigger builds its driver in a thread
        # (`watch_trigger.load_driver`), and its reads run on the triggerer's event loop.
        for module in ("hooks", "outcome"):
            importlib.import_module(f"tasks.backends.slurm.{module}")
        return cls(settings)

    def job_env(self, job: TrainJob | EvaluateJob) -> dict[str, str]:
        return dict(job.env)

    def train_extra(self, values: Mapping[str, str | int]) -> dict[str, Any] | None:
        if not self.settings.eval_in_training_allocation or self.evaluate is None:
            return None
        return in_allocation_fields(self.evaluate, self.settings, values)

    def max_restarts(self, role: Role) -> int:
        return self.settings.shape(role).max_restarts

    def defer_timeout(
        self, job_timeout: timedelta | None, memo: Mapping[str, Any]
    ) -> timedelta | None:
        return None  # the job's time limit is Slurm's; the watch never gives up on a job

    # --- on the worker ----------------------------------------------------------------------

    def batch_job(self, request: JobRequest) -> BatchJob:
        """The job of `request` (with env values: never log or return it)."""
        s, shape = self.settings, self.settings.shape(request.role)
        return BatchJob(
            name=job_name(request.dag_id, request.run_id, request.label),
            argv=request.argv,
            shape=shape,
            working_dir=s.working_dir,
            log_dir=s.log_dir,
            env=dict(request.env),
            secret_env=shape.secret_env,
            then_evaluate=in_allocation_eval(request.extra),
            export_env=s.export_env,
        )

    def planned_ref(self, request: JobRequest) -> Mapping[str, Any] | None:
        return None  # a job's id is Slurm's answer to the submit

    def submit_or_adopt(self, request: JobRequest, log: Any) -> Submitted:
        from tasks.backends.slurm.hooks import JobInfo

        found = submit_or_adopt(hook_for(self.settings), self.batch_job(request), log,
                                retry=request.retry)  # fmt: skip
        if isinstance(found, JobInfo):  # it ended with success before this try
            return Submitted(job_ref(found), ended=self._ended(found))
        return Submitted(job_ref(found))

    def restart(self, request: JobRequest, log: Any) -> Submitted:
        return Submitted(job_ref(hook_for(self.settings).submit(self.batch_job(request))))

    def waits_for(self, request: JobRequest, log: Any) -> Submitted | None:
        """Under ``eval_in_training_allocation`` an evaluation waits for the training's job
        while it runs, then looks again: a step it evaluated is reused."""
        if request.role != "evaluate" or not self.settings.eval_in_training_allocation:
            return None
        name = job_name(request.dag_id, request.run_id, TRAIN_LABEL)
        job = running_job(hook_for(self.settings), name, log)
        if job is None:
            return None
        line = f"the training's Slurm job {job.job_id} evaluates in its allocation: waiting"
        return Submitted(job_ref(job), line=line)

    def cancel(self, ref: Mapping[str, Any]) -> bool:
        """scancel the job of `ref` if it is still ours (its id, name, submit time, account
        and comment) and has not ended; False when it had ended, is forgotten, or its id names
        another's job now. A cluster that does not answer raises (`ClusterUnreachable`): the
        job may still run, and no caller may take it for gone."""
        from tasks.backends.slurm.hooks import JobForgotten, JobIdReused, SubmittedJob

        expected = SubmittedJob(ref["job_id"], ref["name"], ref["submit_time"])
        hook = hook_for(self.settings)
        try:
            info = hook.job(expected.job_id, expected)
        except (JobForgotten, JobIdReused):  # NotOurJob too
            return False  # gone, or its id names another job now: not ours to cancel
        if info.finished:
            return False
        hook.cancel(expected.job_id)
        return True

    def cancel_step(self, dag_id: str, run_id: str, run_dir: str, step: int) -> bool:
        hook = hook_for(self.settings)
        running = running_jobs(hook, job_name(dag_id, run_id, eval_label(step)))
        for job in running:
            hook.cancel(job.job_id)
        return bool(running)

    def describe(self, ref: Mapping[str, Any]) -> str:
        return f"Slurm job {ref['job_id']} ({ref['name']})"

    def output_tail(self, ref: Mapping[str, Any], state: JobState) -> str:
        """The end of the job's output file (its whole lines), wherever long its output."""
        path = output_file(self.settings.log_dir, str(ref["name"]), str(ref["job_id"]))
        text = hook_for(self.settings).read_tail(path, _TAIL_BYTES)
        if len(text.encode()) >= _TAIL_BYTES and "\n" in text:
            text = text[text.index("\n") + 1 :]  # the first line cut: left out
        return text

    def remove(self, ref: Mapping[str, Any]) -> None:
        """Nothing: the job's output file stays on the cluster, beside its accounting."""

    # --- on the triggerer -------------------------------------------------------------------

    def _ended(self, info: JobInfo) -> JobState:
        from tasks.backends.slurm.outcome import decide

        shape = self.settings.shape(role_of(info.name))
        found = decide(
            info, self.settings.fail_exit_codes, shape.signal_grace_s, shape.time_limit_s
        )
        return JobState(found.why, _OUTCOMES[found.decision], info.exit_code)

    async def read(self, ref: Mapping[str, Any], memo: dict[str, Any], now: float) -> JobState:
        from tasks.backends.slurm.hooks import JobForgotten, JobIdReused, SubmittedJob

        hook = self._hook()
        expected = SubmittedJob(ref["job_id"], ref["name"], ref["submit_time"])
        try:
            info = await hook.job(expected.job_id, expected)
        except JobIdReused as exc:
            return JobState(str(exc), "foreign")
        except JobForgotten as exc:
            return JobState(str(exc), "lost")
        output = await self._new_output(info, memo)
        if not info.finished:
            return JobState(state_line(info), output=output)
        ended = self._ended(info)
        return JobState(ended.line, ended.outcome, ended.exit_code, output=output)

    def _hook(self) -> AsyncSlurmHook:
        if self._async_hook is None:
            from tasks.backends.slurm.hooks import AsyncSlurmHook, slurm_hook

            self._async_hook = AsyncSlurmHook(slurm_hook(self.settings))
        return self._async_hook

    async def _new_output(self, info: JobInfo, memo: dict[str, Any]) -> tuple[str, ...]:
        """The job's new whole output lines (best effort; `memo` keeps the offset)."""
        if not info.stdout_path:
            return ()
        try:
            text, end = await self._hook().read_output(info.stdout_path, memo.get("offset", 0))
        except Exception:
            return ()
        complete = text.rfind("\n") + 1  # whole lines only; the rest is read next time
        memo["offset"] = end - len(text[complete:].encode())
        return tuple(text[:complete].splitlines())
