"""The operators that run a JobSet on GKE and delete it; every cluster call is a
`tasks.backends.gke.hooks.JobSetHook` call (imported in `execute`: DAG parsing stays cheap).

- `RunJobSetOperator` creates the JobSet, then defers to `JobSetTrigger` until it is terminal.
  An existing JobSet (a retry) is adopted only when it was rendered from the same spec.
- `DeleteJobSetOperator` deletes it (a teardown; an absent JobSet is fine);
  `DeleteEvalJobSetsOperator` deletes what all instances of a mapped task created.
The operators that evaluate a checkpoint as a JobSet are in `tasks.backends.gke.evaluate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator, XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backends.gke.render import check_adoptable, jobset_ref, with_spec_hash
from tasks.backends.gke.settings import GkeCluster
from tasks.backends.gke.status import JobSetGone
from tasks.backends.gke.triggers import WATCH_BOUNDS, JobSetTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tasks.backends.gke.hooks import JobSetHook

# XCom key under which the run task records which JobSet it is about to create, before
# creating it, so that the cleanup teardown can delete it whatever happened afterwards.
REF_XCOM_KEY = "jobset_ref"
# Statuses of a create whose outcome is unknown (the apiserver may have applied it).
_UNKNOWN_OUTCOME = frozenset({429, 500, 502, 503, 504})


def jobset_hook(cluster: GkeCluster) -> JobSetHook:
    from tasks.backends.gke.hooks import JobSetHook

    return JobSetHook.for_cluster(cluster)


class RunJobSetOperator(BaseOperator):
    """Create `jobset` (a JobSet object; usually the XComArg of a task that called
    `render_jobset`) on `cluster` and wait, deferred, until it finishes.

    Returns ``{"name", "namespace", "phase", "progress"}``. A Failed JobSet fails the task
    without Airflow retries (restarts belong to the JobSet's failurePolicy), naming its failed
    pods' reasons and exit codes; an error while watching (the API unreachable for longer than
    `api_error_budget_s`) fails it with retries allowed, and the retry adopts the still-running
    JobSet. `job_timeout` bounds the time the JobSet runs, `max_suspended` the time it waits
    suspended for admission (None: no bound); Airflow's defer timeout is their sum. With
    `stop_run_dir` the JobSet is deleted `stop_grace` after a stop request of that run.
    """

    template_fields: Sequence[str] = ("jobset", "stop_run_dir")
    template_fields_renderers: ClassVar[dict[str, str]] = {"jobset": "json"}
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        jobset: Mapping[str, Any] | XComArg,  # an XComArg is resolved before execute
        cluster: GkeCluster,
        poll_interval_s: float = 30.0,
        api_error_budget_s: float = 1200.0,
        api_backoff_max_s: float = 120.0,
        job_timeout: timedelta | None = None,
        stop_run_dir: str | XComArg | None = None,
        stop_grace: timedelta = timedelta(minutes=10),
        max_suspended: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.jobset = jobset
        self.cluster = cluster
        self.stop_run_dir = stop_run_dir
        self.stop_grace = stop_grace
        self.poll_interval_s = poll_interval_s
        self.api_error_budget_s = api_error_budget_s
        self.api_backoff_max_s = api_backoff_max_s
        self.job_timeout = job_timeout
        self.max_suspended = max_suspended

    def execute(self, context: Context) -> None:
        jobset = self.jobset
        if not isinstance(jobset, Mapping):
            raise ValueError(f"expected a JobSet object (a dict), got {type(jobset).__name__}")
        ref = jobset_ref(jobset)
        body = with_spec_hash(jobset)
        context["ti"].xcom_push(key=REF_XCOM_KEY, value=ref)
        hook = jobset_hook(self.cluster)
        self._create(hook, body)
        self.log.info(
            "JobSet %s/%s submitted; waiting for it to finish", ref["namespace"], ref["name"]
        )
        self.defer(
            trigger=JobSetTrigger(
                name=ref["name"],
                namespace=ref["namespace"],
                cluster_url=hook.cluster_url,
                ssl_ca_cert=hook.ssl_ca_cert,
                gcp_conn_id=self.cluster.gcp_conn_id,
                impersonation_chain=list(self.cluster.impersonation_chain) or None,
                use_dns_endpoint=self.cluster.use_dns_endpoint,
                poll_interval_s=self.poll_interval_s,
                api_error_budget_s=self.api_error_budget_s,
                api_backoff_max_s=self.api_backoff_max_s,
                max_suspended_s=_seconds(self.max_suspended),
                max_running_s=_seconds(self.job_timeout),
                stop_run_dir=self.stop_run_dir if isinstance(self.stop_run_dir, str) else None,
                stop_grace_s=self.stop_grace.total_seconds(),
            ),
            method_name="execute_complete",
            timeout=self._defer_timeout(),
        )

    def _defer_timeout(self) -> timedelta | None:
        # The trigger bounds running and suspended time apart; this is the outer net (e.g. a
        # triggerer restart starts the trigger's own clocks afresh).
        if self.job_timeout is None or self.max_suspended is None:
            return None
        return self.job_timeout + self.max_suspended

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, str]:
        where = f"JobSet {event['namespace']}/{event['name']}"
        phase = event["phase"]
        if phase == "Succeeded":
            self.log.info("%s succeeded [%s]", where, event["progress"])
            return {k: event[k] for k in ("name", "namespace", "phase", "progress")}
        if phase == "Stopped":
            # the verdict was decided; what the job committed before is what the run has
            self.log.warning("%s deleted: %s [%s]", where, event["message"], event["progress"])
            return {k: event[k] for k in ("name", "namespace", "phase", "progress")}
        if phase == "Failed" and event["reason"] in WATCH_BOUNDS:
            raise AirflowFailException(
                f"{where} ({event['reason']}): {event['message']} [{event['progress']}]; the "
                "cleanup teardown deletes it"
            )
        if phase == "Failed":
            pods = "".join(f"\n  failed pod {line}" for line in event["pods"])
            raise AirflowFailException(
                f"{where} failed ({event['reason']}): {event['message']} [{event['progress']}]."
                f"{pods}\nRestarts are the JobSet's failurePolicy (disruptions restart without "
                "counting, application exit codes fail at once); an Airflow retry would only "
                "find the same failed JobSet (clear the task group to run it again)."
            )
        raise AirflowException(f"{where}: could not follow its status: {event['message']}")

    def _create(self, hook: JobSetHook, body: dict[str, Any]) -> None:
        """Create the JobSet, or adopt an identical existing one (an earlier try's)."""
        from kubernetes.client.exceptions import ApiException

        ref = jobset_ref(body)
        where = f"JobSet {ref['namespace']}/{ref['name']}"
        failed: ApiException | None = None
        try:
            if not hook.create_jobset(body):
                self.log.info("%s already exists", where)
        except ApiException as exc:
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


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


class _DeleteJobSets(BaseOperator):
    """Delete the JobSets `recorded` names on `cluster`; absent ones are fine."""

    ui_color = "#fce8e6"

    def __init__(self, *, run_task_id: str, cluster: GkeCluster, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_task_id = run_task_id
        self.cluster = cluster

    def recorded(self, context: Context) -> list[dict[str, str]]:
        raise NotImplementedError

    def delete(self, context: Context) -> list[dict[str, Any]]:
        refs = self.recorded(context)
        if not refs:
            self.log.info("%s recorded no JobSet: nothing to delete", self.run_task_id)
            return []
        hook = jobset_hook(self.cluster)
        done = []
        for ref in refs:
            deleted = hook.delete_jobset(ref["namespace"], ref["name"])
            state = "deleted" if deleted else "was already gone"
            self.log.info("JobSet %s/%s %s", ref["namespace"], ref["name"], state)
            done.append({**ref, "deleted": deleted})
        return done


class DeleteJobSetOperator(_DeleteJobSets):
    """Teardown: delete the JobSet that the task `run_task_id` (a RunJobSetOperator, same map
    index) recorded. Nothing recorded, or already gone: logged, success."""

    def recorded(self, context: Context) -> list[dict[str, str]]:
        ti = context["ti"]
        ref = ti.xcom_pull(task_ids=self.run_task_id, key=REF_XCOM_KEY, map_indexes=ti.map_index)
        return [] if ref is None else [ref]

    def execute(self, context: Context) -> dict[str, Any] | None:
        done = self.delete(context)
        return done[0] if done else None


class DeleteEvalJobSetsOperator(_DeleteJobSets):
    """Teardown: delete every JobSet that any instance of the mapped task `run_task_id`
    recorded."""

    def recorded(self, context: Context) -> list[dict[str, str]]:
        refs = context["ti"].xcom_pull(task_ids=self.run_task_id, key=REF_XCOM_KEY)
        if isinstance(refs, dict):
            refs = [refs]
        return [r for r in refs or [] if r is not None]

    def execute(self, context: Context) -> list[dict[str, Any]]:
        return self.delete(context)
