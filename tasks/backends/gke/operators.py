"""The operators that run JobSets on GKE and delete them.

- `RunJobSetOperator` creates the JobSet with the Google provider's
  `GKECreateCustomResourceOperator`, then defers to `JobSetTrigger` until it is terminal. An
  existing JobSet (a retry) is adopted only when it was rendered from the same spec.
- `DeleteJobSetOperator` deletes it (a teardown; an absent JobSet is fine).
- `EvaluateJobSetOperator` evaluates one manifest row as a JobSet behind the gate of
  `tasks.run.steps`; `DeleteEvalJobSetsOperator` deletes what all its instances created.

The provider and kubernetes modules cost seconds to import, so only `_create` and `_delete_jobset`
import them; importing this module at DAG-parse time stays cheap.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator, XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backends.gke.render import (
    JOBSET_API_VERSION,
    JOBSET_GROUP,
    JOBSET_KIND,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    check_adoptable,
    jobset_ref,
    render_jobset,
    with_spec_hash,
)
from tasks.backends.gke.settings import GkeSettings
from tasks.backends.gke.triggers import WATCH_BOUNDS, JobSetTrigger
from tasks.jobs.result import Baseline, baseline, import_result, now_ms
from tasks.jobs.templates import EvaluateJob
from tasks.jobs.values import evaluate_values
from tasks.run.steps import (
    EvalTarget,
    EvaluationError,
    collect,
    eval_target,
    reusable,
    skip_if_decided,
    step_target,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from rcpflow.manifest import ManifestRow

log = logging.getLogger(__name__)

# XCom key under which the run task records which JobSet it is about to create, before
# creating it, so that the cleanup teardown can delete it whatever happened afterwards.
REF_XCOM_KEY = "jobset_ref"
# XCom key of a foreign evaluate job's start: its wall clock and what was at its result path
# (read back when the deferred task resumes, in another process).
EVAL_START_XCOM_KEY = "eval_start"


class _GkeClusterArgs:
    """The cluster arguments shared by the operators, as the provider's GKE operators take
    them."""

    task_id: str

    def _set_cluster_args(
        self,
        *,
        location: str,
        cluster_name: str,
        project_id: str | None,
        gcp_conn_id: str,
        impersonation_chain: str | Sequence[str] | None,
        use_internal_ip: bool,
        use_dns_endpoint: bool,
    ) -> None:
        self.location = location
        self.cluster_name = cluster_name
        self.project_id = project_id
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.use_internal_ip = use_internal_ip
        self.use_dns_endpoint = use_dns_endpoint

    def _cluster_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "location": self.location,
            "cluster_name": self.cluster_name,
            "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": self.impersonation_chain,
            "use_internal_ip": self.use_internal_ip,
            "use_dns_endpoint": self.use_dns_endpoint,
        }
        if self.project_id is not None:
            args["project_id"] = self.project_id
        return args


class RunJobSetOperator(_GkeClusterArgs, BaseOperator):
    """Create `jobset` (a JobSet object; usually the XComArg of a task that called
    `render_jobset`) on the GKE cluster and wait, deferred, until it finishes.

    Returns ``{"name", "namespace", "phase", "progress"}``. A Failed JobSet fails the task
    without Airflow retries (restarts belong to the JobSet's failurePolicy), naming its failed
    pods' reasons and exit codes; an error while watching (the API unreachable for longer than
    `api_error_budget_s`) fails it with retries allowed, and the retry adopts the still-running
    JobSet. `job_timeout` bounds the time the JobSet runs, `max_suspended` the time it waits
    suspended for admission (None: no bound); Airflow's defer timeout is their sum.
    """

    template_fields: Sequence[str] = (
        "jobset", "location", "cluster_name", "project_id", "stop_run_dir",
    )  # fmt: skip
    template_fields_renderers: ClassVar[dict[str, str]] = {"jobset": "json"}
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        jobset: Mapping[str, Any] | XComArg,  # an XComArg is resolved before execute
        location: str,
        cluster_name: str,
        project_id: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        use_internal_ip: bool = False,
        use_dns_endpoint: bool = False,
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
        # training under evaluation during training: delete the JobSet if it is still running
        # `stop_grace` after the run's stop request (the trainer should have ended by then)
        self.stop_run_dir = stop_run_dir
        self.stop_grace = stop_grace
        self._set_cluster_args(
            location=location,
            cluster_name=cluster_name,
            project_id=project_id,
            gcp_conn_id=gcp_conn_id,
            impersonation_chain=impersonation_chain,
            use_internal_ip=use_internal_ip,
            use_dns_endpoint=use_dns_endpoint,
        )
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
        cluster_url, ssl_ca_cert = self._create(context, body)
        self.log.info(
            "JobSet %s/%s submitted; waiting for it to finish", ref["namespace"], ref["name"]
        )
        self.defer(
            trigger=JobSetTrigger(
                name=ref["name"],
                namespace=ref["namespace"],
                cluster_url=cluster_url,
                ssl_ca_cert=ssl_ca_cert,
                gcp_conn_id=self.gcp_conn_id,
                impersonation_chain=self.impersonation_chain,
                use_dns_endpoint=self.use_dns_endpoint,
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

    def _create(self, context: Context, body: dict[str, Any]) -> tuple[str, str]:
        """Create the JobSet (or adopt an identical existing one); return the cluster's URL and
        CA certificate for the trigger."""
        from airflow.providers.google.cloud.operators.kubernetes_engine import (
            GKECreateCustomResourceOperator,
        )
        from kubernetes.client.exceptions import ApiException

        ref = jobset_ref(body)
        create = GKECreateCustomResourceOperator(
            task_id=f"{self.task_id}__create",
            yaml_conf=json.dumps(body),
            custom_resource_definition=True,
            namespace=ref["namespace"],
            **self._cluster_args(),
        )
        try:
            create.execute(context)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.log.info("JobSet %s/%s already exists", ref["namespace"], ref["name"])
        # Read it back whatever execute() said: the provider retries a failed create (409 and
        # 5xx count as transient) on the already-consumed YAML generator, so the retry creates
        # nothing and still reports success (providers-cncf-kubernetes 10.25). The read also
        # tells an identical JobSet from an earlier try from a foreign one.
        try:
            existing = create.hook.get_custom_object(
                group=JOBSET_GROUP,
                version=JOBSET_VERSION,
                plural=JOBSET_PLURAL,
                name=ref["name"],
                namespace=ref["namespace"],
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            raise AirflowException(
                f"JobSet {ref['namespace']}/{ref['name']} is not on the cluster after the create "
                "call reported success (a create retried by the provider); a task retry creates "
                "it again"
            ) from exc
        check_adoptable(existing, body)
        return create.cluster_url, create.ssl_ca_cert


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


class DeleteJobSetOperator(_GkeClusterArgs, BaseOperator):
    """Delete the JobSet that the task `run_task_id` (a RunJobSetOperator, same map index)
    recorded. Nothing recorded, or already gone: logged, success. Use as a teardown."""

    template_fields: Sequence[str] = ("location", "cluster_name", "project_id")
    ui_color = "#fce8e6"

    def __init__(
        self,
        *,
        run_task_id: str,
        location: str,
        cluster_name: str,
        project_id: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        use_internal_ip: bool = False,
        use_dns_endpoint: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run_task_id = run_task_id
        self._set_cluster_args(
            location=location,
            cluster_name=cluster_name,
            project_id=project_id,
            gcp_conn_id=gcp_conn_id,
            impersonation_chain=impersonation_chain,
            use_internal_ip=use_internal_ip,
            use_dns_endpoint=use_dns_endpoint,
        )

    def execute(self, context: Context) -> dict[str, Any] | None:
        ti = context["ti"]
        ref = ti.xcom_pull(task_ids=self.run_task_id, key=REF_XCOM_KEY, map_indexes=ti.map_index)
        if ref is None:
            self.log.info("%s recorded no JobSet: nothing to delete", self.run_task_id)
            return None
        deleted = _delete_jobset(self, context, ref)
        if deleted:
            self.log.info("JobSet %s/%s deleted", ref["namespace"], ref["name"])
        else:
            self.log.info("JobSet %s/%s was already gone", ref["namespace"], ref["name"])
        return {**ref, "deleted": deleted}


def _delete_jobset(op: _GkeClusterArgs, context: Context, ref: Mapping[str, str]) -> bool:
    """Delete the JobSet `ref` names through `op`'s cluster; False when it did not exist."""
    from airflow.providers.google.cloud.operators.kubernetes_engine import (
        GKEDeleteCustomResourceOperator,
    )
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": JOBSET_API_VERSION, "kind": JOBSET_KIND, "metadata": dict(ref)}
    delete = GKEDeleteCustomResourceOperator(
        task_id=f"{op.task_id}__delete",
        yaml_conf=json.dumps(body),
        custom_resource_definition=True,
        namespace=ref["namespace"],
        **op._cluster_args(),
    )
    try:
        delete.execute(context)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


class EvaluateJobSetOperator(RunJobSetOperator):
    """Evaluate one manifest row as a JobSet of the `job` template, behind the gate of
    `tasks.run.steps`: a decided or already evaluated step creates nothing on the cluster. A
    foreign result is imported when the JobSet succeeded (`tasks.jobs.result`)."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "row")

    def __init__(
        self,
        *,
        settings: GkeSettings,
        job: EvaluateJob,
        run_dir: str,
        row: Mapping[str, Any],
        job_timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        # the JobSet is rendered in execute: its name needs the run id
        super().__init__(
            jobset={},
            job_timeout=job_timeout,
            **settings.connection_kwargs(),
            **settings.watch_kwargs(),
            **kwargs,
        )
        self.settings = settings
        self.job = job
        self.run_dir = run_dir
        self.row = row

    def target(self) -> EvalTarget:
        """The checkpoint this instance evaluates, as the manifest has it now."""
        return eval_target(self.run_dir, dict(self.row))

    def execute(self, context: Context) -> Any:
        target = self.target()
        skip_if_decided(target)
        if reusable(target):
            return collect(target)
        dag_run = context["dag_run"]
        values = evaluate_values(self.run_dir, target.row, "python")
        self.jobset = render_jobset(
            self.settings,
            role="evaluate",
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            job=f"eval-{target.step}",
            command=self.job.job_command.render(values),
            image=self.job.image,
            env=self.job.env,
        )
        if self.job.result.imported:
            before = baseline(self.job.result, values)
            context["ti"].xcom_push(
                key=EVAL_START_XCOM_KEY, value={"ms": now_ms(), "baseline": before.to_dict()}
            )
        return super().execute(context)

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> Any:
        target = self.target()
        try:
            super().execute_complete(context, event)
            if self.job.result.imported:
                self._import_result(context, target.row)
        except Exception:
            skip_if_decided(target)  # a lower step passed meanwhile: this failure is moot
            raise
        return collect(target)

    def _import_result(self, context: Context, row: ManifestRow) -> None:
        """The foreign result of the JobSet that just succeeded, with the wall clock from just
        before its creation to now as the eval times (`tasks.jobs.result`)."""
        ti = context["ti"]
        start = ti.xcom_pull(task_ids=ti.task_id, key=EVAL_START_XCOM_KEY, map_indexes=ti.map_index)
        if start is None:
            raise EvaluationError(
                f"step {row.step}: no {EVAL_START_XCOM_KEY} recorded before the JobSet was "
                "created: its eval times are unknown; clear the task to evaluate again"
            )
        imported = import_result(
            self.job.result,
            evaluate_values(self.run_dir, row, "python"),
            Baseline.from_dict(start["baseline"]),
            (start["ms"], now_ms()),
        )
        self.log.info("%s", imported.describe())


class EvaluateStepJobSetOperator(EvaluateJobSetOperator):
    """`EvaluateJobSetOperator` for the checkpoint of a planned `step` (evaluation during
    training: the step's wait saw its row committed), read from the manifest."""

    template_fields = (*RunJobSetOperator.template_fields, "run_dir", "step")

    def __init__(self, *, step: int, **kwargs: Any) -> None:
        super().__init__(row={}, **kwargs)
        self.step = step

    def target(self) -> EvalTarget:
        return step_target(self.run_dir, self.step)


class DeleteEvalJobSetsOperator(_GkeClusterArgs, BaseOperator):
    """Teardown: delete every JobSet that any instance of the mapped task `run_task_id`
    recorded; absent ones are fine."""

    template_fields: Sequence[str] = ("location", "cluster_name", "project_id")
    ui_color = "#fce8e6"

    def __init__(self, *, run_task_id: str, settings: GkeSettings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_task_id = run_task_id
        self._set_cluster_args(**settings.connection_kwargs())

    def execute(self, context: Context) -> list[dict[str, Any]]:
        refs = context["ti"].xcom_pull(task_ids=self.run_task_id, key=REF_XCOM_KEY)
        if isinstance(refs, dict):
            refs = [refs]
        done = []
        for ref in [r for r in refs or [] if r is not None]:
            deleted = _delete_jobset(self, context, ref)
            log.info(
                "JobSet %s/%s %s",
                ref["namespace"],
                ref["name"],
                "deleted" if deleted else "already gone",
            )
            done.append({**ref, "deleted": deleted})
        return done
