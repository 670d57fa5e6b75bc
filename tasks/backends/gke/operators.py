"""The operators that run a JobSet on GKE and delete it: the GKE side of the cluster-job
lifecycle (`tasks.backend_api.cluster_job`, `tasks.backend_api.teardown`); every cluster call
is in `tasks.backends.gke.adapter` (through `tasks.backends.gke.hooks.JobSetHook`).

- `RunJobSetOperator` renders the JobSet in `execute` (the object carries env values: no XCom,
  template field or log line ever holds it), checks the cluster's JobSet CRD has every field
  of it (`tasks.backends.gke.crd`), creates it with strict field validation, then defers to
  `JobSetTrigger` until it is terminal, deferring again whenever the trigger's state changes.
  An existing JobSet (a retry) is adopted only when it was rendered from the same spec.
- `DeleteJobSetOperator` deletes it (a teardown), `DeleteEvalJobSetsOperator` what all
  instances of a mapped task created: only after a real failure, a success, a stop, a timeout
  the user set, or when the run task ended outside rcpflow's hands (a user's mark, Airflow's
  deferral timeout). A watch or create error leaves the JobSet running (a retry adopts it);
  one that was replaced by someone else is never touched.
The operators that evaluate a checkpoint as a JobSet are in `tasks.backends.gke.evaluate_operators`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backend_api.cluster_job import ClusterJobOperator, argv_of
from tasks.backend_api.job_inputs import cluster_job_env
from tasks.backend_api.teardown import CancelRecordedJobs
from tasks.backend_api.watch_trigger import WatchTrigger, wall_clock
from tasks.backends.gke.adapter import check_api, create_or_adopt, jobset_hook
from tasks.backends.gke.render import jobset_ref, render_jobset
from tasks.backends.gke.settings import GkeCluster, GkeSettings
from tasks.backends.gke.triggers import REPLACED, WATCH_BOUNDS, JobSetTrigger, cluster_kwargs
from tasks.jobs.command import Role
from tasks.jobs.templates import SecretKeyRef

if TYPE_CHECKING:
    from airflow.sdk import Context

# Airflow's deferral timeout is an outer net behind the trigger's own bounds: this much later.
_DEFER_SLACK = timedelta(minutes=10)


class JobSetReplacedError(AirflowFailException):
    """The JobSet under the task's name is another object than the one it created or adopted
    (deleted and created again): not the task's to follow, nor to delete."""


# How the log names a JobSet (`ClusterJobOperator.log_name`).
LOG_NAME = "JobSet {namespace}/{name}"
_where = LOG_NAME.format_map


class RunJobSetOperator(ClusterJobOperator):
    """Render the JobSet of `command` (an argument list, or the XComArg of a task that
    returns one) for `role` and `job` on the cluster of `settings`, create it and wait,
    deferred, until it finishes.

    Returns ``{"name", "namespace", "phase", "progress"}``. A Failed JobSet fails the task
    without Airflow retries (restarts belong to the JobSet's failurePolicy), naming its failed
    pods' reasons and exit codes; API trouble never fails it (the watch goes on). An error of
    the task itself (an unreadable status, a create that did not land) fails it with retries
    allowed, and the retry adopts the still-running JobSet. `job_timeout` bounds the time the
    JobSet runs, the settings' `max_suspended_minutes` the time it waits suspended for
    admission. With `stop_run_dir` the JobSet is deleted `stop_grace` after a stop request of
    that run. `on_kill` deletes the JobSet this task created or adopted.
    """

    template_fields: Sequence[str] = ("command", "run_env", "stop_run_dir")
    ui_color = "#e8f0fe"
    trigger_type = JobSetTrigger
    log_name = LOG_NAME

    def __init__(
        self,
        *,
        settings: GkeSettings,
        role: Role,
        job: str,
        command: Sequence[str] | XComArg,  # an XComArg is resolved before execute
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        secret_env: Mapping[str, SecretKeyRef] | None = None,
        job_timeout: timedelta | None = None,
        run_env: Mapping[str, str] | XComArg | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.role: Role = role
        self.job = job
        self.command = command
        self.image = image
        self.env = dict(env or {})
        self.run_env = run_env  # what the run adds (`job_inputs.run_env`), an XCom resolved
        self.secret_env = dict(secret_env or {})
        self.job_timeout = job_timeout

    @property
    def cluster(self) -> GkeCluster:
        return self.settings.cluster

    def render(self, context: Context) -> dict[str, Any]:
        """The JobSet this task runs (with env values: never log or return it)."""
        dag_run = context["dag_run"]
        env = cluster_job_env(self.env, self.run_env, self.role, context)
        return render_jobset(
            self.settings,
            role=self.role,
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            job=self.job,
            command=argv_of(self.command, "command"),
            image=self.image,
            env=env,
            secret_env=self.secret_env,
        )

    def execute(self, context: Context) -> Any:
        jobset = self.render(context)
        ref = jobset_ref(jobset)
        self.record(context, ref, None, "pending")
        try:
            hook = jobset_hook(self.cluster)
            check_api(hook, jobset)
            existing = create_or_adopt(hook, jobset, self.log)
            suspended = bool(existing.get("spec", {}).get("suspend")) or self._suspended(existing)
        except Exception as exc:
            self.record(context, ref, False, f"not created or adopted: {exc}")
            raise
        now = wall_clock()
        end = self.task_end_spec(context, ref)
        self.log.info("%s submitted; waiting for it to finish", _where(ref))
        s = self.settings
        trigger = JobSetTrigger(
            name=ref["name"],
            namespace=ref["namespace"],
            cluster=cluster_kwargs(self.cluster),
            uid=existing.get("metadata", {}).get("uid"),
            running_since=None if suspended else now,
            suspended_since=now if suspended else None,
            submitted_at=now,
            max_suspended_s=s.max_suspended_minutes * 60.0,
            max_running_s=None if self.job_timeout is None else self.job_timeout.total_seconds(),
            poll_interval_s=s.poll_interval_s,
            outage_budget_s=s.outage_budget_s,
            backoff_max_s=s.backoff_max_s,
            task_end=None if end is None else end.kwargs(),
            **self.stop_kwargs(),
        )
        self.watch(ref, trigger)

    @staticmethod
    def _suspended(jobset: Mapping[str, Any]) -> bool:
        from tasks.backends.gke.status import interpret_status

        return interpret_status(jobset).suspended

    def defer_timeout(self, trigger: WatchTrigger) -> timedelta | None:
        # The trigger bounds running and suspended time itself (its clocks survive a triggerer
        # restart); this net only catches a trigger that never fires.
        submitted_at = getattr(trigger, "submitted_at", None)
        if self.job_timeout is None or submitted_at is None:
            return None
        total = self.job_timeout + timedelta(minutes=self.settings.max_suspended_minutes)
        left = total + _DEFER_SLACK - timedelta(seconds=wall_clock() - submitted_at)
        return max(left, timedelta(seconds=1))

    def job_ref(self, event: Mapping[str, Any]) -> dict[str, Any]:
        return {"name": event["name"], "namespace": event["namespace"]}

    def cancel_job(self, ref: Mapping[str, Any]) -> bool:
        return jobset_hook(self.cluster).delete_jobset(ref["namespace"], ref["name"])

    def stopped(self, ref: Mapping[str, Any], event: Mapping[str, Any]) -> Any:
        return {**ref, "phase": "Stopped", "progress": event["progress"]}

    def job_ended(self, context: Context, ref: Mapping[str, Any], event: Mapping[str, Any]) -> Any:
        where = _where(ref)
        phase, reason = event["phase"], event["reason"]
        result = {**ref, "phase": phase, "progress": event["progress"]}
        if phase == "Succeeded":
            self.record(context, ref, True, "succeeded")
            self.log.info("%s succeeded [%s]", where, event["progress"])
            return result
        if phase == "Failed" and reason in WATCH_BOUNDS:
            self.record(context, ref, True, f"{reason}: a bound of the deployment")
            raise AirflowFailException(
                f"{where} ({reason}): {event['message']} [{event['progress']}]; the cleanup "
                "teardown deletes it"
            )
        if phase == "Failed":
            self.record(context, ref, True, f"failed ({reason})")
            pods = "".join(f"\n  failed pod {line}" for line in event["pods"])
            raise AirflowFailException(
                f"{where} failed ({reason}): {event['message']} [{event['progress']}]."
                f"{pods}\nRestarts are the JobSet's failurePolicy (docs/exit-codes.md: "
                "disruptions restart without counting, user errors fail at once); an Airflow "
                "retry would only find the same failed JobSet (clear the task group to run it "
                "again)."
            )
        if reason == REPLACED:
            self._owned = None
            self.record(context, ref, False, "replaced by another object of that name")
            raise JobSetReplacedError(event["message"])
        self.record(context, ref, False, f"watch error: {event['message']}")
        raise AirflowException(
            f"{where}: could not follow its status: {event['message']}; the JobSet is left "
            "running, and a retry (or clearing the task) adopts it"
        )


class DeleteJobSetOperator(CancelRecordedJobs):
    """Teardown: delete the JobSet that the task `run_task_id` (a RunJobSetOperator, same map
    index) recorded, if `should_cancel`. Nothing recorded, or already gone: logged, success;
    returns ``{"name", "namespace", "deleted"}`` (None: nothing recorded)."""

    log_name = LOG_NAME

    def __init__(self, *, cluster: GkeCluster, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster

    def cancel_job(self, ref: Mapping[str, Any], why: str) -> dict[str, Any] | None:
        deleted = jobset_hook(self.cluster).delete_jobset(ref["namespace"], ref["name"])
        self.log.info("%s %s (%s)", _where(ref), "deleted" if deleted else "was already gone", why)
        return {"name": ref["name"], "namespace": ref["namespace"], "deleted": deleted}

    def left(self, ref: Mapping[str, Any]) -> dict[str, Any] | None:
        return {"name": ref["name"], "namespace": ref["namespace"], "deleted": False}

    def execute(self, context: Context) -> Any:
        done = super().execute(context)
        return done if self.mapped else (done[0] if done else None)


class DeleteEvalJobSetsOperator(DeleteJobSetOperator):
    """Teardown: delete every JobSet that an instance of the mapped task `run_task_id`
    recorded, if `should_cancel`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(mapped=True, **kwargs)
