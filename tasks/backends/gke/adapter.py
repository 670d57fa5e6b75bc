"""The cluster calls of a JobSet's life that the GKE driver (`tasks.backends.gke.driver`) makes
on the worker, each through `tasks.backends.gke.hooks.JobSetHook` (imported in the function: DAG
parsing stays cheap): create it after checking the cluster's JobSet CRD has every field of it,
or adopt the identical one an earlier try created (`create_or_adopt`); delete a JobSet that
still runs, only the object the task created (`cancel_jobset`; one step's evaluation:
`cancel_step_jobset`), and one that has finished (`remove_finished_jobset`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tasks.backend_api.lifecycle_names import eval_label
from tasks.backends.gke.render import check_adoptable, jobset_name, jobset_ref
from tasks.backends.gke.status import JobSetGone

if TYPE_CHECKING:
    from tasks.backends.gke.hooks import JobSetHook
    from tasks.backends.gke.settings import GkeCluster

# Statuses of a create whose outcome is unknown (the apiserver may have applied it).
UNKNOWN_OUTCOME = frozenset({429, 500, 502, 503, 504})


def jobset_hook(cluster: GkeCluster) -> JobSetHook:
    from tasks.backends.gke.hooks import JobSetHook

    return JobSetHook.for_cluster(cluster)


def check_api(hook: JobSetHook, jobset: Mapping[str, Any]) -> None:
    """Refuse (AirflowFailException) a cluster whose JobSet CRD lacks a field of `jobset`."""
    from kubernetes.client.exceptions import ApiException

    from tasks.backends.gke.crd import CRD_NAME, MINIMUM_JOBSET, JobSetVersionError, check_crd

    try:
        crd = hook.get_jobset_crd()
    except ApiException as exc:
        if exc.status in UNKNOWN_OUTCOME:
            raise  # transient: a retry reads it again
        what = "is not installed" if exc.status == 404 else f"cannot be read (HTTP {exc.status})"
        raise AirflowFailException(
            f"the JobSet CRD {CRD_NAME} {what}: rcpflow needs JobSet {MINIMUM_JOBSET} or "
            "newer, and reads its CRD before every create (grant get on "
            "customresourcedefinitions)"
        ) from exc
    try:
        check_crd(crd, jobset)
    except JobSetVersionError as exc:
        raise AirflowFailException(str(exc)) from None


def create_or_adopt(hook: JobSetHook, body: dict[str, Any], log: Any) -> dict[str, Any]:
    """Create the JobSet, or adopt an identical existing one (an earlier try's); the JobSet as
    the cluster has it."""
    from kubernetes.client.exceptions import ApiException

    ref = jobset_ref(body)
    where = f"JobSet {ref['namespace']}/{ref['name']}"
    failed: ApiException | None = None
    try:
        if not hook.create_jobset(body):
            log.info("%s already exists", where)
    except ApiException as exc:
        if exc.status in (400, 422):
            # strict field validation or the schema refused it: rerunning cannot help
            raise AirflowFailException(
                f"the cluster refused {where} (HTTP {exc.status}): {api_message(exc)}"
            ) from None
        if exc.status not in UNKNOWN_OUTCOME:
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


def api_message(exc: Exception) -> str:
    """The ``message`` of a Kubernetes Status in an ApiException's body, else its reason."""
    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(getattr(exc, "reason", exc))


def cancel_step_jobset(
    hook: JobSetHook, namespace: str, dag_id: str, run_id: str, step: int
) -> bool:
    """Delete the evaluation JobSet of `step` in that DAG run if it still runs (its pods go
    with it); False when there is none, or it has finished (`cancel_jobset`)."""
    return cancel_jobset(hook, namespace, jobset_name(dag_id, run_id, eval_label(step)))


def cancel_jobset(hook: JobSetHook, namespace: str, name: str, uid: str | None = None) -> bool:
    """Delete the JobSet `namespace`/`name` if it still runs (its pods go with it) and, given
    `uid`, only when it is that object (one created again under the name is another's: never
    deleted); False, nothing deleted, when it is gone or being deleted, is another object, or
    has finished. Read first, then deleted with the UID it was read with as the API's
    precondition, so that an object replaced between the two calls is not deleted either. A
    status this version cannot read counts as running: the cancel was asked for."""
    from tasks.backends.gke.status import JobSetStatusError, interpret_status

    found = _own(hook, namespace, name, uid)
    if found is None:
        return False
    try:
        if interpret_status(found).terminal:
            return False
    except JobSetStatusError:
        pass
    return hook.delete_jobset(namespace, name, found["metadata"].get("uid"))


def remove_finished_jobset(hook: JobSetHook, namespace: str, name: str, uid: str) -> bool:
    """Delete the JobSet of `uid` when it has finished (its completed pods and Service with
    it, before the cluster's ``ttlSecondsAfterFinished`` does); False, nothing deleted, when
    it is gone, another object, still running, or its status unreadable (left as it is)."""
    from tasks.backends.gke.status import JobSetStatusError, interpret_status

    found = _own(hook, namespace, name, uid)
    if found is None:
        return False
    try:
        if not interpret_status(found).terminal:
            return False
    except JobSetStatusError:
        return False
    return hook.delete_jobset(namespace, name, uid)


def _own(hook: JobSetHook, namespace: str, name: str, uid: str | None) -> dict[str, Any] | None:
    """The JobSet `namespace`/`name` when it exists, is not being deleted and (given `uid`) is
    the object of that UID; else None."""
    try:
        found = hook.get_jobset(namespace, name)
    except JobSetGone:
        return None
    metadata = found.get("metadata")
    if not isinstance(metadata, Mapping) or metadata.get("deletionTimestamp"):
        return None
    if uid is not None and metadata.get("uid") != uid:
        return None
    return found
