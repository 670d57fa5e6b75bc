"""Airflow operators and trigger that run a JobSet on GKE and clean it up.

- `RunJobSetOperator` creates the JobSet as a custom resource with the Google provider's
  `GKECreateCustomResourceOperator` (GKE auth, cluster lookup, API retries are the provider's),
  then defers to `JobSetTrigger`, which polls the JobSet through `GKEKubernetesAsyncHook` on the
  triggerer until it is terminal. Failed -> the task fails with the controller's reason.
  If the JobSet already exists (a retry after a lost worker), it is adopted when it was created
  from the same spec, and refused otherwise.
- `DeleteJobSetOperator` deletes it with `GKEDeleteCustomResourceOperator`; meant as a teardown
  (runs when the run fails too). An absent JobSet, or a run that never got to create one, is
  fine.

The provider and kubernetes modules cost seconds to import, so they are imported only inside
the methods that talk to the cluster; importing this module (from a DAG file, through
`tasks.gke.jobset_task_group`) stays cheap. Those methods (`_create`, `_delete`,
`JobSetTrigger.read_jobset`) are the only cluster-touching code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from tasks.gke.jobset import (
    JOBSET_API_VERSION,
    JOBSET_GROUP,
    JOBSET_KIND,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    check_adoptable,
    jobset_ref,
    with_spec_hash,
)
from tasks.gke.status import JobSetStatusError, interpret_status

if TYPE_CHECKING:
    from airflow.sdk import Context

# XCom key under which the run task records which JobSet it is about to create, before
# creating it, so that the cleanup teardown can delete it whatever happened afterwards.
REF_XCOM_KEY = "jobset_ref"
TRIGGER_CLASSPATH = "plugins.jobset.JobSetTrigger"


class JobSetGone(RuntimeError):
    """The JobSet being watched does not exist (deleted while it ran)."""


class _GkeClusterArgs:
    """The cluster arguments shared by both operators, as the provider's GKE operators take
    them."""

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
    `tasks.gke.render_jobset`) on the GKE cluster and wait, deferred, until it finishes.

    Returns ``{"name", "namespace", "phase", "progress"}``. A Failed JobSet fails the task
    without Airflow retries (restarts belong to the JobSet's failurePolicy.maxRestarts); an
    error while watching (API unreachable) fails it with retries allowed, and the retry adopts
    the still-running JobSet. `job_timeout` bounds the wait (None: no bound).
    """

    template_fields: Sequence[str] = ("jobset", "location", "cluster_name", "project_id")
    template_fields_renderers = {"jobset": "json"}
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        jobset: Mapping[str, Any],
        location: str,
        cluster_name: str,
        project_id: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        use_internal_ip: bool = False,
        use_dns_endpoint: bool = False,
        poll_interval_s: float = 30.0,
        job_timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.jobset = jobset
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
        self.job_timeout = job_timeout

    def execute(self, context: Context) -> None:
        ref = jobset_ref(self.jobset)
        body = with_spec_hash(self.jobset)
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
            ),
            method_name="execute_complete",
            timeout=self.job_timeout,
        )

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, str]:
        where = f"JobSet {event['namespace']}/{event['name']}"
        phase = event["phase"]
        if phase == "Succeeded":
            self.log.info("%s succeeded [%s]", where, event["progress"])
            return {k: event[k] for k in ("name", "namespace", "phase", "progress")}
        if phase == "Failed":
            raise AirflowFailException(
                f"{where} failed ({event['reason']}): {event['message']} [{event['progress']}]. "
                "Restarts are the JobSet's failurePolicy.maxRestarts; an Airflow retry would "
                "only find the same failed JobSet (clear the task group to run it again)."
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
        deleted = self._delete(context, ref)
        if deleted:
            self.log.info("JobSet %s/%s deleted", ref["namespace"], ref["name"])
        else:
            self.log.info("JobSet %s/%s was already gone", ref["namespace"], ref["name"])
        return {**ref, "deleted": deleted}

    def _delete(self, context: Context, ref: Mapping[str, str]) -> bool:
        """Delete the JobSet; False when it did not exist."""
        from airflow.providers.google.cloud.operators.kubernetes_engine import (
            GKEDeleteCustomResourceOperator,
        )
        from kubernetes.client.exceptions import ApiException

        body = {"apiVersion": JOBSET_API_VERSION, "kind": JOBSET_KIND, "metadata": dict(ref)}
        delete = GKEDeleteCustomResourceOperator(
            task_id=f"{self.task_id}__delete",
            yaml_conf=json.dumps(body),
            custom_resource_definition=True,
            namespace=ref["namespace"],
            **self._cluster_args(),
        )
        try:
            delete.execute(context)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


class JobSetTrigger(BaseTrigger):
    """Poll a JobSet every `poll_interval_s` until it is terminal; one event:
    ``{"phase": "Succeeded"|"Failed"|"error", "name", "namespace", "reason", "message",
    "progress"}``. A JobSet that disappears is Failed (reason NotFound); `max_consecutive_errors`
    failed reads in a row give ``error``; a malformed status gives ``error`` at once."""

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        cluster_url: str,
        ssl_ca_cert: str,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        use_dns_endpoint: bool = False,
        poll_interval_s: float = 30.0,
        max_consecutive_errors: int = 5,
    ) -> None:
        super().__init__()
        self.name = name
        self.namespace = namespace
        self.cluster_url = cluster_url
        self.ssl_ca_cert = ssl_ca_cert
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.use_dns_endpoint = use_dns_endpoint
        self.poll_interval_s = poll_interval_s
        self.max_consecutive_errors = max_consecutive_errors

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            TRIGGER_CLASSPATH,
            {
                "name": self.name,
                "namespace": self.namespace,
                "cluster_url": self.cluster_url,
                "ssl_ca_cert": self.ssl_ca_cert,
                "gcp_conn_id": self.gcp_conn_id,
                "impersonation_chain": self.impersonation_chain,
                "use_dns_endpoint": self.use_dns_endpoint,
                "poll_interval_s": self.poll_interval_s,
                "max_consecutive_errors": self.max_consecutive_errors,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        where = f"JobSet {self.namespace}/{self.name}"
        errors = 0
        last_line = None
        while True:
            try:
                jobset = await self.read_jobset()
            except JobSetGone as exc:
                yield TriggerEvent(self._event("Failed", reason="NotFound", message=str(exc)))
                return
            except Exception as exc:
                errors += 1
                self.log.warning("%s: read %d failed: %r", where, errors, exc)
                if errors >= self.max_consecutive_errors:
                    message = f"{errors} reads in a row failed, last: {exc!r}"
                    yield TriggerEvent(self._event("error", message=message))
                    return
                await asyncio.sleep(self.poll_interval_s)
                continue
            errors = 0
            try:
                status = interpret_status(jobset)
            except JobSetStatusError as exc:
                yield TriggerEvent(self._event("error", message=f"unreadable status: {exc}"))
                return
            line = status.describe()
            if line != last_line:
                self.log.info("%s: %s", where, line)
                last_line = line
            if status.terminal:
                yield TriggerEvent(
                    self._event(
                        status.phase,
                        reason=status.reason,
                        message=status.message,
                        progress=status.progress,
                    )
                )
                return
            await asyncio.sleep(self.poll_interval_s)

    def _event(
        self, phase: str, *, reason: str = "", message: str = "", progress: str = ""
    ) -> dict[str, str]:
        return {
            "phase": phase,
            "name": self.name,
            "namespace": self.namespace,
            "reason": reason,
            "message": message,
            "progress": progress,
        }

    async def read_jobset(self) -> dict[str, Any]:
        """The JobSet object from the cluster; JobSetGone when it does not exist."""
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        async with self._hook.get_conn() as api_client:
            try:
                return await CustomObjectsApi(api_client).get_namespaced_custom_object(
                    group=JOBSET_GROUP,
                    version=JOBSET_VERSION,
                    namespace=self.namespace,
                    plural=JOBSET_PLURAL,
                    name=self.name,
                )
            except ApiException as exc:
                if exc.status == 404:
                    raise JobSetGone(f"JobSet {self.namespace}/{self.name} not found") from exc
                raise

    @cached_property
    def _hook(self) -> Any:
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook

        return GKEKubernetesAsyncHook(
            cluster_url=self.cluster_url,
            ssl_ca_cert=self.ssl_ca_cert,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.impersonation_chain,
            use_dns_endpoint=self.use_dns_endpoint,
        )
