"""Helpers of the real-control-plane tests: render the project's JobSet for a test namespace,
create it as the run task does (``fieldValidation=Strict``), and read what the real
controllers made of it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from devtools.k8s.client import ApiError
from devtools.k8s.control_plane import ControlPlane
from tasks.backends.gke.render import (
    JOBSET_GROUP,
    JOBSET_NAME_LABEL,
    JOBSET_PLURAL,
    JOBSET_RESTART_ATTEMPT_LABEL,
    JOBSET_VERSION,
    render_jobset,
)
from tasks.backends.gke.settings import GkeSettings, TpuJobShape

RUN_ID = "manual__2026-05-01T12:00:00+00:00"
# The bearer token of the test Google credentials (`fixed_token_credentials`): the API server
# knows it as AIRFLOW_USER, whom RBAC gives only what docs/gke.md asks for.
GOOGLE_TOKEN = "rcpflow-test-google-token"
AIRFLOW_USER = "rcpflow-airflow"

# docs/gke.md, "What the cluster needs": the Google connection's account's rights.
DOCUMENTED_RULES = [
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["get"],
    },
    {
        "apiGroups": ["jobset.x-k8s.io"],
        "resources": ["jobsets"],
        "verbs": ["create", "get", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]


def shape(topology: str = "2x2x1", *, slices: int = 1, max_restarts: int = 3) -> TpuJobShape:
    return TpuJobShape(
        accelerator="tpu-v5p-slice",
        topology=topology,
        slices=slices,
        chips_per_host=4,
        max_restarts=max_restarts,
        termination_grace_period_s=30,
    )


def settings(namespace: str, **kwargs: Any) -> GkeSettings:
    train = kwargs.pop("train", shape("2x2x2", max_restarts=3))
    evaluate = kwargs.pop("evaluate", shape("2x2x1", slices=2, max_restarts=2))
    return GkeSettings(
        namespace=namespace, image="rcpflow-tpu:test", train=train, evaluate=evaluate, **kwargs
    )


# A DAG id short enough that a multi-host training JobSet's coordinator label fits (see
# test_real_jobset_admission.py: with the real DAG's id it does not).
SHORT_DAG_ID = "rcp"


def render(
    s: GkeSettings,
    role: str = "train",
    job: str = "train",
    run_id: str = RUN_ID,
    dag_id: str = SHORT_DAG_ID,
) -> dict[str, Any]:
    return render_jobset(
        s,
        role=role,  # type: ignore[arg-type]
        dag_id=dag_id,
        run_id=run_id,
        job=job,
        command=["python", "-m", f"tpu_jobs.{role}", "--run-dir", "gs://bucket/$run"],
    )


@contextlib.contextmanager
def fresh_namespace(plane: ControlPlane) -> Iterator[str]:
    """A new namespace of `plane` (its default service account there), deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    plane.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    # The service-account controller makes it too, but after an API server restart its
    # informers may take longer than a test waits: create it here when it is not there yet.
    try:
        plane.api.request(
            "POST",
            f"/api/v1/namespaces/{name}/serviceaccounts",
            {"metadata": {"name": "default"}},
        )
    except ApiError as exc:
        if exc.status != 409:  # the controller was first
            raise
    try:
        yield name
    finally:
        plane.api.request("DELETE", f"/api/v1/namespaces/{name}")


class JobSets:
    """The JobSet API of the test control plane through the `kubernetes` client."""

    @classmethod
    def for_plane(cls, plane: ControlPlane) -> JobSets:
        import kubernetes

        return cls(kubernetes.config.new_client_from_config(str(plane.kubeconfig)), plane)

    def __init__(self, kube: Any, plane: ControlPlane) -> None:
        import kubernetes

        self.custom = kubernetes.client.CustomObjectsApi(kube)
        self.core = kubernetes.client.CoreV1Api(kube)
        self.batch = kubernetes.client.BatchV1Api(kube)
        self.plane = plane

    def create(self, jobset: dict[str, Any], *, strict: bool = True) -> dict[str, Any]:
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            JOBSET_GROUP,
            JOBSET_VERSION,
            jobset["metadata"]["namespace"],
            JOBSET_PLURAL,
            jobset,
            field_validation="Strict" if strict else None,
        )
        return created

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name
        )
        return got

    def delete(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            JOBSET_GROUP,
            JOBSET_VERSION,
            namespace,
            JOBSET_PLURAL,
            name,
            propagation_policy="Foreground",
        )

    def pods(self, namespace: str, name: str, attempt: int | None = None) -> list[dict[str, Any]]:
        selector = f"{JOBSET_NAME_LABEL}={name}"
        if attempt is not None:
            selector += f",{JOBSET_RESTART_ATTEMPT_LABEL}={attempt}"
        return [
            p
            for p in self.plane.pods(namespace, selector)
            if not p["metadata"].get("deletionTimestamp")
        ]

    def jobs(self, namespace: str, name: str) -> list[Any]:
        return list(
            self.batch.list_namespaced_job(
                namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}"
            ).items
        )

    def running_pods(
        self, namespace: str, name: str, count: int, attempt: int = 0, timeout_s: float = 60
    ) -> list[dict[str, Any]]:
        """Wait until `count` pods of restart `attempt` run (scheduled, kwok started them)."""

        def check() -> list[dict[str, Any]] | None:
            pods = self.pods(namespace, name, attempt)
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
            return running if len(running) == count else None

        return self.plane.wait_for(
            check,
            what=f"{count} running pods of JobSet {namespace}/{name} attempt {attempt}",
            timeout_s=timeout_s,
        )

    def wait_status(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[dict[str, Any]], bool],
        what: str,
        timeout_s: float = 60,
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.get(namespace, name)
            return obj if predicate(obj.get("status") or {}) else None

        return self.plane.wait_for(
            check, what=f"JobSet {namespace}/{name}: {what}", timeout_s=timeout_s
        )


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in status.get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def fixed_token_credentials(token: str) -> Any:
    """Google credentials whose refresh yields `token` without any network."""
    import google.auth.credentials

    class FixedTokenCredentials(google.auth.credentials.Credentials):  # type: ignore[misc]
        def refresh(self, request: Any) -> None:
            self.token = token

    return FixedTokenCredentials()
