"""The GKE driver (`GkeDriver`): jobs as JobSets on TPU slices under the one lifecycle of
`tasks.backend_api`; every cluster call goes through `tasks.backends.gke.hooks` (the worker's
in `.adapter`, the triggerer's through `AsyncJobSetHook`, imported on a watch's first read so
that importing this module stays cheap; the endpoint is looked up through the Google connection
then and after a failed read, never kept in a trigger's kwargs).

The JobSet is rendered as it is created (the object carries env values: no XCom, template
field or log line ever holds it), checked against the cluster's JobSet CRD
(`tasks.backends.gke.crd`) and created with strict field validation; an existing one (a retry)
is adopted only when it was rendered from the same spec. Restarts are the JobSet's
failurePolicy (docs/exit-codes.md), so a Failed JobSet fails its task without retries. The
reference (``{name, namespace, uid}``) and the watch's memo hold the JobSet's UID: one replaced
under the same name is never the task's, neither to follow nor to delete (`cancel` and
`remove` delete with the UID as the API's precondition; a finished JobSet is not cancelled,
the teardown's `remove` deletes it). The memo holds its clocks (running since, suspended
since, running time so far): time spent suspended, waiting for Kueue to admit it, is bounded on
its own and does not count against the job's running time (`read`).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from tasks.backend_api.job_state import JobState
from tasks.backend_api.protocol import FormDefaults, JobKeys, JobRequest, Submitted, register
from tasks.backend_api.watch_trigger import wall_clock
from tasks.backends.gke.adapter import (
    cancel_jobset,
    cancel_step_jobset,
    check_api,
    create_or_adopt,
    jobset_hook,
    remove_finished_jobset,
)
from tasks.backends.gke.render import jobset_ref, render_jobset
from tasks.backends.gke.settings import (
    TABLE,
    GkeCluster,
    GkeSettings,
    check_evaluate_job,
    cluster_from_kwargs,
    cluster_kwargs,
)
from tasks.backends.gke.status import (
    JobSetGone,
    JobSetStatusError,
    failed_pods,
    interpret_status,
    over_bound,
)
from tasks.deployment import BackendName, Deployment

if TYPE_CHECKING:
    from tasks.backends.gke.hooks import AsyncJobSetHook
    from tasks.jobs.command import Role
    from tasks.jobs.templates import EvaluateJob, SecretKeyRef, TrainJob

# Reason of a JobSet that is another object now than the one created (`JobState.reason`).
REPLACED = "Replaced"
# The cluster calls of the triggerer, imported on a watch's first read (`GkeDriver._hook`).
HOOKS_MODULE = "tasks.backends.gke.hooks"
# Airflow's deferral timeout is an outer net behind the watch's own bounds: this much later.
_DEFER_SLACK = timedelta(minutes=10)


@register
class GkeDriver:
    """JobSets on the cluster of `settings` (see the module doc); `images` and `secret_envs`:
    the deployment's per role."""

    name: ClassVar[BackendName] = "gke"
    # Images and Secret envs are the JobSet's own.
    job_keys: ClassVar[JobKeys] = JobKeys(image=True, secret_env=True)
    jobs_run_on_worker: ClassVar[bool] = False
    # TPU jobs run the benchmark itself: the closed division's rules.
    form_defaults: ClassVar[FormDefaults] = FormDefaults(division="closed", max_steps=60)
    cluster_word: ClassVar[str] = "Kubernetes API"
    quick_jobs: ClassVar[bool] = False
    python: str = "python"

    def __init__(
        self,
        settings: GkeSettings,
        images: Mapping[str, str | None] | None = None,
        secret_envs: Mapping[str, Mapping[str, SecretKeyRef]] | None = None,
        cluster: GkeCluster | None = None,
    ) -> None:
        self.settings = settings
        self.cluster = cluster or settings.cluster
        self.images = dict(images or {})
        self.secret_envs = dict(secret_envs or {})
        self.poll_interval_s = settings.poll_interval_s
        self.outage_budget_s = settings.outage_budget_s
        self.backoff_max_s = settings.backoff_max_s
        self.run_retries = settings.run_retries
        self._async_hook: AsyncJobSetHook | None = None

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> GkeDriver:
        settings = deployment.backend_table(TABLE, GkeSettings)
        check_evaluate_job(settings, deployment.jobs.evaluate.command, deployment.source)
        jobs = deployment.jobs
        return cls(
            settings,
            images={"train": jobs.train.image, "evaluate": jobs.evaluate.image},
            secret_envs={"train": jobs.train.secret_env, "evaluate": jobs.evaluate.secret_env},
        )

    def args(self) -> dict[str, Any]:
        return {"cluster": cluster_kwargs(self.cluster), "namespace": self.settings.namespace}

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> GkeDriver:
        settings = GkeSettings(namespace=str(args["namespace"]))
        return cls(settings, cluster=cluster_from_kwargs(args["cluster"]))

    def job_env(self, job: TrainJob | EvaluateJob) -> dict[str, str]:
        return dict(job.env)

    def train_extra(self, values: Mapping[str, str | int]) -> dict[str, Any] | None:
        return None

    def max_restarts(self, role: Role) -> int:
        return 0  # the JobSet's failurePolicy restarts it, on the cluster

    def defer_timeout(
        self, job_timeout: timedelta | None, memo: Mapping[str, Any]
    ) -> timedelta | None:
        # The watch bounds running and suspended time itself (its clocks survive a triggerer
        # restart); this net only catches a watch that never fires.
        submitted_at = memo.get("submitted_at")
        if job_timeout is None or submitted_at is None:
            return None
        total = job_timeout + timedelta(minutes=self.settings.max_suspended_minutes)
        left = total + _DEFER_SLACK - timedelta(seconds=wall_clock() - float(submitted_at))
        return max(left, timedelta(seconds=1))

    # --- on the worker ----------------------------------------------------------------------

    def render(self, request: JobRequest) -> dict[str, Any]:
        """The JobSet of `request` (with env values: never log or return it)."""
        return render_jobset(
            self.settings, role=request.role, dag_id=request.dag_id, run_id=request.run_id,
            job=request.label, command=request.argv, image=self.images.get(request.role),
            env=request.env, secret_env=self.secret_envs.get(request.role),
        )  # fmt: skip

    def planned_ref(self, request: JobRequest) -> Mapping[str, Any] | None:
        return jobset_ref(self.render(request))  # the name is the DAG run's and the label's

    def submit_or_adopt(self, request: JobRequest, log: Any) -> Submitted:
        jobset = self.render(request)
        hook = jobset_hook(self.cluster)
        check_api(hook, jobset)
        existing = create_or_adopt(hook, jobset, log)
        suspended = bool(existing.get("spec", {}).get("suspend")) or (
            interpret_status(existing).suspended
        )
        now = wall_clock()
        uid = existing.get("metadata", {}).get("uid")
        memo = {
            "uid": uid,
            "running_since": None if suspended else now,
            "suspended_since": now if suspended else None,
            "running_s": 0.0,
            "submitted_at": now,
            "max_suspended_s": self.settings.max_suspended_minutes * 60.0,
            "max_running_s": request.timeout_s,
        }
        # The UID names this object, not the name's next one: a cancel deletes only it.
        ref: dict[str, Any] = {**jobset_ref(jobset), "uid": uid}
        return Submitted(ref, memo, f"{self.describe(ref)} submitted; waiting for it to finish")

    def restart(self, request: JobRequest, log: Any) -> Submitted:
        raise NotImplementedError("a JobSet's restarts are its failurePolicy's, on the cluster")

    def waits_for(self, request: JobRequest, log: Any) -> Submitted | None:
        return None

    def cancel(self, ref: Mapping[str, Any]) -> bool:
        """Delete the JobSet of `ref` if it still runs, and only the object of its UID (one
        created again under the name is someone else's): False, nothing deleted, when it has
        finished, is gone or is another object. A reference recorded before the create
        (`planned_ref`, a worker lost before the create's record) has no UID: the object the
        name holds is cancelled then."""
        hook = jobset_hook(self.cluster)
        return cancel_jobset(hook, ref["namespace"], ref["name"], ref.get("uid"))

    def cancel_step(self, dag_id: str, run_id: str, run_dir: str, step: int) -> bool:
        hook = jobset_hook(self.cluster)
        return cancel_step_jobset(hook, self.settings.namespace, dag_id, run_id, step)

    def describe(self, ref: Mapping[str, Any]) -> str:
        return f"JobSet {ref['namespace']}/{ref['name']}"

    def output_tail(self, ref: Mapping[str, Any], state: JobState) -> str:
        return ""  # its failed pods' reasons and exit codes are the state's detail

    def remove(self, ref: Mapping[str, Any]) -> None:
        """Delete the JobSet of `ref` once it has finished (its pods and Service with it; the
        cluster would after `ttl_after_finished_s`), only the object of its UID; a running one,
        a foreign one, or one known by name alone (no UID) is left."""
        if ref.get("uid") is not None:
            hook = jobset_hook(self.cluster)
            remove_finished_jobset(hook, ref["namespace"], ref["name"], str(ref["uid"]))

    # --- on the triggerer -------------------------------------------------------------------

    async def _hook(self) -> AsyncJobSetHook:
        """The hook of the cluster, its endpoint looked up on first use and after an error.
        The first use in a triggerer imports the Kubernetes client and the providers (3.3 s
        measured here): in a thread, so that no other watch of the loop waits for it."""
        if self._async_hook is None:
            hooks = await asyncio.to_thread(importlib.import_module, HOOKS_MODULE)
            hook_type: type[AsyncJobSetHook] = hooks.AsyncJobSetHook
            self._async_hook = await hook_type.for_cluster(self.cluster)
        return self._async_hook

    async def read(self, ref: Mapping[str, Any], memo: dict[str, Any], now: float) -> JobState:
        try:
            jobset = await (await self._hook()).get_jobset(ref["namespace"], ref["name"])
        except JobSetGone as exc:
            return JobState(f"is gone: {exc}", "fail_now", reason="NotFound")
        except Exception:
            self._async_hook = None  # the next read looks the endpoint up again
            raise
        uid = (jobset.get("metadata") or {}).get("uid")
        if memo.get("uid") is None and ref.get("uid") is not None:
            memo["uid"] = ref["uid"]  # the reference's: the object the task created
        if memo.get("uid") is not None and uid != memo["uid"]:
            line = (
                f"is another object now (uid {uid!r}, created as {memo['uid']!r}): it was "
                "deleted and created again by someone else; rcpflow leaves it alone"
            )
            return JobState(line, "foreign", reason=REPLACED)
        changed = memo.get("uid") is None and uid is not None
        memo["uid"] = uid
        try:
            status = interpret_status(jobset)
        except JobSetStatusError as exc:
            return JobState(f"unreadable status: {exc}", "lost")
        progress = f" [{status.progress}]" if status.progress else ""
        if status.phase == "Succeeded":
            # every pod of its last attempt exited 0: a child Job completes only so (its
            # backoffLimit is 0) and the JobSet only when all its Jobs have
            return JobState(f"succeeded{progress}", "succeeded", 0, reason=status.reason)
        if status.phase == "Failed":
            pods = await self._failed_pod_lines(ref)
            line = f"failed ({status.reason}): {status.message}{progress}"
            return JobState(line, "fail_now", reason=status.reason, detail=tuple(pods))
        over, changed = over_bound(memo, status.suspended, now, changed)
        if over is not None:
            reason, said = over
            line = f"{reason}: {said}{': ' + status.message if status.suspended else ''}"
            return JobState(f"{line}{progress}; a bound of the deployment", "fail_now",
                            reason=reason)  # fmt: skip
        return JobState(status.describe(), changed=changed)

    async def _failed_pod_lines(self, ref: Mapping[str, Any]) -> list[str]:
        # The reason and exit code of the failed pods make the task's error actionable; not
        # being able to read them must not hide the failure itself.
        try:
            hook = await self._hook()
            pods = await hook.list_jobset_pods(ref["namespace"], ref["name"])
            return [f"failed pod {line}" for line in failed_pods(pods)]
        except Exception as exc:
            return [f"(could not read the JobSet's pods: {exc!r})"]
