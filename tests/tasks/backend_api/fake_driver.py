"""An in-memory driver (`FakeDriver`, registered as ``fake`` while a test holds the
`fake_driver` fixture): a cluster of jobs whose first argv word says how each ends (``ok``,
``fail``, ``restart``, ``long``: runs until cancelled), with an owner per job (a job of our
name that another account owns is never adopted nor cancelled) and a switch that makes every
read fail (an outage). What the lifecycle suite (test_driver_lifecycle.py) runs against besides
the real drivers."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from tasks.backend_api.job_state import JobState
from tasks.backend_api.protocol import FormDefaults, JobKeys, JobRequest, Submitted
from tasks.jobs.command import Role
from tasks.jobs.templates import EvaluateJob, TrainJob

OURS = "rcpflow"


@dataclass
class FakeJob:
    job_id: str
    name: str
    argv: tuple[str, ...]
    owner: str = OURS
    reads: int = 0
    cancelled: bool = False

    def state(self) -> JobState:
        kind = self.argv[0]
        if self.cancelled:
            return JobState("cancelled", "cancelled", 143)
        if kind == "long" or self.reads < 2:
            return JobState(f"running (read {self.reads})")
        return {
            "ok": JobState("exited 0", "succeeded", 0),
            "fail": JobState("exited 3", "failed", 3),
            "restart": JobState("preempted", "restart", 1),
            "fail_now": JobState("exited 2", "fail_now", 2),
        }[kind]


@dataclass
class FakeCluster:
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    down: bool = False
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def start(self, name: str, argv: tuple[str, ...], owner: str = OURS) -> FakeJob:
        job = FakeJob(str(next(self.ids)), name, argv, owner)
        self.jobs[job.job_id] = job
        return job

    def running(self, name: str) -> list[FakeJob]:
        return [j for j in self.jobs.values() if j.name == name and not j.state().ended]


# The one cluster of every FakeDriver (the triggerer rebuilds its driver from JSON args).
CLUSTER = FakeCluster()


def job_name(dag_id: str, run_id: str, label: str) -> str:
    return f"{dag_id}/{run_id}/{label}"


class FakeDriver:
    name: ClassVar[str] = "fake"
    job_keys: ClassVar[JobKeys] = JobKeys()
    jobs_run_on_worker: ClassVar[bool] = False
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="open", max_steps=4)
    cluster_word: ClassVar[str] = "fake cluster"
    quick_jobs: ClassVar[bool] = False
    poll_interval_s = 0.01
    outage_budget_s = 60.0
    backoff_max_s = 5.0
    run_retries = 0
    python = "python"

    def __init__(self, restarts: int = 1) -> None:
        self.restarts = restarts

    @classmethod
    def from_deployment(cls, deployment: Any) -> FakeDriver:
        return cls()

    def args(self) -> dict[str, Any]:
        return {"restarts": self.restarts}

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> FakeDriver:
        return cls(int(args["restarts"]))

    def job_env(self, job: TrainJob | EvaluateJob) -> dict[str, str]:
        return dict(job.env)

    def train_extra(self, values: Mapping[str, str | int]) -> dict[str, Any] | None:
        return None

    def max_restarts(self, role: Role) -> int:
        return self.restarts

    def defer_timeout(
        self, job_timeout: timedelta | None, memo: Mapping[str, Any]
    ) -> timedelta | None:
        return job_timeout

    def planned_ref(self, request: JobRequest) -> Mapping[str, Any] | None:
        return None

    def submit_or_adopt(self, request: JobRequest, log: Any) -> Submitted:
        name = job_name(request.dag_id, request.run_id, request.label)
        ours = [j for j in CLUSTER.running(name) if j.owner == OURS]
        if ours:
            return Submitted({"job_id": ours[-1].job_id}, line=f"{name}: adopted")
        return self.restart(request, log)

    def restart(self, request: JobRequest, log: Any) -> Submitted:
        name = job_name(request.dag_id, request.run_id, request.label)
        job = CLUSTER.start(name, request.argv)
        return Submitted({"job_id": job.job_id}, line=f"{name}: started")

    def waits_for(self, request: JobRequest, log: Any) -> Submitted | None:
        return None

    def cancel(self, ref: Mapping[str, Any]) -> bool:
        job = CLUSTER.jobs.get(str(ref["job_id"]))
        if job is None or job.owner != OURS or job.state().ended:
            return False
        job.cancelled = True
        return True

    def cancel_step(self, dag_id: str, run_id: str, run_dir: str, step: int) -> bool:
        running = CLUSTER.running(job_name(dag_id, run_id, f"eval-{step}"))
        return any([self.cancel({"job_id": j.job_id}) for j in running if j.owner == OURS])

    def describe(self, ref: Mapping[str, Any]) -> str:
        return f"fake job {ref['job_id']}"

    def output_tail(self, ref: Mapping[str, Any], state: JobState) -> str:
        return "the fake job's last words"

    def remove(self, ref: Mapping[str, Any]) -> None:
        pass

    async def read(self, ref: Mapping[str, Any], memo: dict[str, Any], now: float) -> JobState:
        if CLUSTER.down:
            raise ConnectionError("the fake cluster is down")
        job = CLUSTER.jobs[str(ref["job_id"])]
        if job.owner != OURS:
            return JobState("another account's job now", "foreign")
        job.reads += 1
        memo["reads"] = job.reads
        state = job.state()
        return JobState(state.line, state.outcome, state.exit_code, output=(f"read {job.reads}",))
