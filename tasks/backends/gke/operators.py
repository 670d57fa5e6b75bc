"""The operators that run a JobSet on GKE and delete it; every cluster call is a
`tasks.backends.gke.hooks.JobSetHook` call (imported in `execute`: DAG parsing stays cheap).

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

from airflow.sdk import BaseOperator, XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backend_api.job_inputs import cluster_job_env
from tasks.backend_api.teardown import should_delete
from tasks.backends.gke import triggers
from tasks.backends.gke.render import check_adoptable, jobset_ref, render_jobset
from tasks.backends.gke.settings import GkeCluster, GkeSettings
from tasks.backends.gke.status import JobSetGone
from tasks.backends.gke.triggers import (
    REPLACED,
    WATCH_BOUNDS,
    WATCHING,
    JobSetTrigger,
    cluster_kwargs,
)
from tasks.jobs.command import Role
from tasks.jobs.templates import SecretKeyRef

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tasks.backends.gke.hooks import JobSetHook

# XCom key under which the run task records which JobSet it is about to create, before
# creating it, and then what became of it: ``{"name", "namespace", "delete", "why"}``;
# `delete` None (pending) until the task itself decided (see `should_delete`).
REF_XCOM_KEY = "jobset_ref"
# Statuses of a create whose outcome is unknown (the apiserver may have applied it).
_UNKNOWN_OUTCOME = frozenset({429, 500, 502, 503, 504})
# Airflow's deferral timeout is an outer net behind the trigger's own bounds: this much later.
_DEFER_SLACK = timedelta(minutes=10)


class JobSetReplacedError(AirflowFailException):
    """The JobSet under the task's name is another object than the one it created or adopted
    (deleted and created again): not the task's to follow, nor to delete."""


def jobset_hook(cluster: GkeCluster) -> JobSetHook:
    from tasks.backends.gke.hooks import JobSetHook

    return JobSetHook.for_cluster(cluster)


class RunJobSetOperator(BaseOperator):
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
        stop_run_dir: str | XComArg | None = None,
        stop_grace: timedelta = timedelta(minutes=10),
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
        self.stop_run_dir = stop_run_dir
        self.stop_grace = stop_grace
        self._owned: dict[str, str] | None = None

    @property
    def cluster(self) -> GkeCluster:
        return self.settings.cluster

    def render(self, context: Context) -> dict[str, Any]:
        """The JobSet this task runs (with env values: never log or return it)."""
        command = self.command
        if isinstance(command, str) or not isinstance(command, Sequence):
            raise ValueError(f"command must be a list of strings, got {command!r}")
        dag_run = context["dag_run"]
        env = cluster_job_env(self.env, self.run_env, self.role, context)
        return render_jobset(
            self.settings,
            role=self.role,
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            job=self.job,
            command=list(command),
            image=self.image,
            env=env,
            secret_env=self.secret_env,
        )

    def execute(self, context: Context) -> Any:
        jobset = self.render(context)
        ref = jobset_ref(jobset)
        where = f"JobSet {ref['namespace']}/{ref['name']}"
        self._record(context, ref, None, "pending")
        try:
            hook = jobset_hook(self.cluster)
            self._check_api(hook, jobset)
            existing = self._create(hook, jobset)
            suspended = bool(existing.get("spec", {}).get("suspend")) or self._suspended(existing)
        except Exception as exc:
            self._record(context, ref, False, f"not created or adopted: {exc}")
            raise
        self._owned = ref
        now = triggers.wall_clock()
        self.log.info("%s submitted; waiting for it to finish", where)
        self._defer(
            JobSetTrigger(
                name=ref["name"],
                namespace=ref["namespace"],
                cluster=cluster_kwargs(self.cluster),
                uid=existing.get("metadata", {}).get("uid"),
                running_since=None if suspended else now,
                suspended_since=now if suspended else None,
                submitted_at=now,
                stop_run_dir=self.stop_run_dir if isinstance(self.stop_run_dir, str) else None,
                stop_grace_s=self.stop_grace.total_seconds(),
                max_suspended_s=self.settings.max_suspended_minutes * 60.0,
                max_running_s=None
                if self.job_timeout is None
                else self.job_timeout.total_seconds(),
                **self._watch(),
            )
        )

    def _watch(self) -> dict[str, float]:
        s = self.settings
        return {
            "poll_interval_s": s.poll_interval_s,
            "api_error_budget_s": s.api_error_budget_s,
            "api_backoff_max_s": s.api_backoff_max_s,
        }

    @staticmethod
    def _suspended(jobset: Mapping[str, Any]) -> bool:
        from tasks.backends.gke.status import interpret_status

        return interpret_status(jobset).suspended

    def _defer(self, trigger: JobSetTrigger) -> None:
        self.defer(
            trigger=trigger, method_name="execute_complete", timeout=self._defer_timeout(trigger)
        )

    def _defer_timeout(self, trigger: JobSetTrigger) -> timedelta | None:
        # The trigger bounds running and suspended time itself (its clocks survive a triggerer
        # restart); this net only catches a trigger that never fires.
        if self.job_timeout is None or trigger.submitted_at is None:
            return None
        total = self.job_timeout + timedelta(minutes=self.settings.max_suspended_minutes)
        left = (
            total + _DEFER_SLACK - timedelta(seconds=triggers.wall_clock() - trigger.submitted_at)
        )
        return max(left, timedelta(seconds=1))

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, str]:
        ref = {"name": event["name"], "namespace": event["namespace"]}
        self._owned = ref
        where = f"JobSet {ref['namespace']}/{ref['name']}"
        phase, reason = event["phase"], event["reason"]
        if phase == WATCHING:
            if event["message"]:
                self.log.warning("%s: %s", where, event["message"])
            self._defer(JobSetTrigger(**event["kwargs"]))
        result = {k: event[k] for k in ("name", "namespace", "phase", "progress")}
        if phase == "Succeeded":
            self._record(context, ref, True, "succeeded")
            self.log.info("%s succeeded [%s]", where, event["progress"])
            return result
        if phase == "Stopped":
            # the verdict was decided; what the job committed before is what the run has
            self._record(context, ref, True, "stopped after the run's stop request")
            self.log.warning("%s deleted: %s [%s]", where, event["message"], event["progress"])
            return result
        if phase == "Failed" and reason in WATCH_BOUNDS:
            self._record(context, ref, True, f"{reason}: a bound of the deployment")
            raise AirflowFailException(
                f"{where} ({reason}): {event['message']} [{event['progress']}]; the cleanup "
                "teardown deletes it"
            )
        if phase == "Failed":
            self._record(context, ref, True, f"failed ({reason})")
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
            self._record(context, ref, False, "replaced by another object of that name")
            raise JobSetReplacedError(event["message"])
        self._record(context, ref, False, f"watch error: {event['message']}")
        raise AirflowException(
            f"{where}: could not follow its status: {event['message']}; the JobSet is left "
            "running, and a retry (or clearing the task) adopts it"
        )

    def on_kill(self) -> None:
        """The task is killed (marked by hand, a timeout): delete the JobSet it owns."""
        if self._owned is not None:
            deleted = jobset_hook(self.cluster).delete_jobset(
                self._owned["namespace"], self._owned["name"]
            )
            self.log.warning(
                "killed: JobSet %s/%s %s", self._owned["namespace"], self._owned["name"],
                "deleted" if deleted else "was already gone",
            )  # fmt: skip

    def _record(
        self, context: Context, ref: Mapping[str, str], delete: bool | None, why: str
    ) -> None:
        value = {"name": ref["name"], "namespace": ref["namespace"], "delete": delete, "why": why}
        context["ti"].xcom_push(key=REF_XCOM_KEY, value=value)

    def _check_api(self, hook: JobSetHook, jobset: Mapping[str, Any]) -> None:
        """Refuse (AirflowFailException) a cluster whose JobSet CRD lacks a field of `jobset`."""
        from kubernetes.client.exceptions import ApiException

        from tasks.backends.gke.crd import CRD_NAME, MINIMUM_JOBSET, JobSetVersionError, check_crd

        try:
            crd = hook.get_jobset_crd()
        except ApiException as exc:
            if exc.status in _UNKNOWN_OUTCOME:
                raise  # transient: a retry reads it again
            what = (
                "is not installed" if exc.status == 404 else f"cannot be read (HTTP {exc.status})"
            )
            raise AirflowFailException(
                f"the JobSet CRD {CRD_NAME} {what}: rcpflow needs JobSet {MINIMUM_JOBSET} or "
                "newer, and reads its CRD before every create (grant get on "
                "customresourcedefinitions)"
            ) from exc
        try:
            check_crd(crd, jobset)
        except JobSetVersionError as exc:
            raise AirflowFailException(str(exc)) from None

    def _create(self, hook: JobSetHook, body: dict[str, Any]) -> dict[str, Any]:
        """Create the JobSet, or adopt an identical existing one (an earlier try's); the
        JobSet as the cluster has it."""
        from kubernetes.client.exceptions import ApiException

        ref = jobset_ref(body)
        where = f"JobSet {ref['namespace']}/{ref['name']}"
        failed: ApiException | None = None
        try:
            if not hook.create_jobset(body):
                self.log.info("%s already exists", where)
        except ApiException as exc:
            if exc.status in (400, 422):
                # strict field validation or the schema refused it: rerunning cannot help
                raise AirflowFailException(
                    f"the cluster refused {where} (HTTP {exc.status}): {_api_message(exc)}"
                ) from None
            if exc.status not in _UNKNOWN_OUTCOME:
                raise
            failed = exc  # the apiserver may have created it: the read below tells
        # Read it back whatever the create said: it tells an identical JobSet from an earlier
        # try from a foreign one, and whether a create that failed was applied after all.
        try:
            existing = hook.get_jobset(ref["namespace"], ref["name"])
        except JobSetGone as exc:
            said = "succeeded" if failed is None else f"failed (HTTP {failed.status})"
            raise AirflowException(
                f"{where} is not on the cluster after the create call {said}; a task retry "
                "creates it again"
            ) from exc
        check_adoptable(existing, body)
        return existing


def _api_message(exc: Exception) -> str:
    """The ``message`` of a Kubernetes Status in an ApiException's body, else its reason."""
    import json

    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(getattr(exc, "reason", exc))


class _DeleteJobSets(BaseOperator):
    """Delete the JobSets `recorded` names on `cluster` when `should_delete` says so; absent
    ones are fine."""

    ui_color = "#fce8e6"

    def __init__(self, *, run_task_id: str, cluster: GkeCluster, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_task_id = run_task_id
        self.cluster = cluster

    def recorded(self, context: Context) -> list[dict[str, Any]]:
        raise NotImplementedError

    def delete(self, context: Context) -> list[dict[str, Any]]:
        refs = self.recorded(context)
        if not refs:
            self.log.info("%s recorded no JobSet: nothing to delete", self.run_task_id)
            return []
        hook: JobSetHook | None = None
        done = []
        for ref in refs:
            where = f"JobSet {ref['namespace']}/{ref['name']}"
            wanted, why = should_delete(ref)
            if not wanted:
                self.log.warning("%s is left as it is: %s", where, why)
                done.append({"name": ref["name"], "namespace": ref["namespace"], "deleted": False})
                continue
            hook = hook or jobset_hook(self.cluster)
            deleted = hook.delete_jobset(ref["namespace"], ref["name"])
            self.log.info("%s %s (%s)", where, "deleted" if deleted else "was already gone", why)
            done.append({"name": ref["name"], "namespace": ref["namespace"], "deleted": deleted})
        return done


class DeleteJobSetOperator(_DeleteJobSets):
    """Teardown: delete the JobSet that the task `run_task_id` (a RunJobSetOperator, same map
    index) recorded, if `should_delete`. Nothing recorded, or already gone: logged, success."""

    def recorded(self, context: Context) -> list[dict[str, Any]]:
        ti = context["ti"]
        ref = ti.xcom_pull(task_ids=self.run_task_id, key=REF_XCOM_KEY, map_indexes=ti.map_index)
        return [] if ref is None else [ref]

    def execute(self, context: Context) -> dict[str, Any] | None:
        done = self.delete(context)
        return done[0] if done else None


class DeleteEvalJobSetsOperator(_DeleteJobSets):
    """Teardown: delete every JobSet that an instance of the mapped task `run_task_id`
    recorded, if `should_delete`."""

    def recorded(self, context: Context) -> list[dict[str, Any]]:
        refs = context["ti"].xcom_pull(task_ids=self.run_task_id, key=REF_XCOM_KEY)
        if isinstance(refs, dict):
            refs = [refs]
        return [r for r in refs or [] if r is not None]

    def execute(self, context: Context) -> list[dict[str, Any]]:
        return self.delete(context)
