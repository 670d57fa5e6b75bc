"""Helpers of the real-control-plane tests: render the project's JobSet for a test namespace,
create it as the run task does (``fieldValidation=Strict``), and read what the real
controllers made of it; the rehearsal submission on the GKE backend (its deployment, its conf,
the connection's service account), which the LocalExecutor test here and the distributed one
(``tests/airflow/distributed/test_distributed_gke.py``) both run."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from repo_paths import REPO

from devtools.k8s.client import ApiError
from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.kwok_nodes import TpuNodePool
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

    def wait_condition(
        self, namespace: str, name: str, kind: str, timeout_s: float = 60
    ) -> dict[str, Any]:
        """The JobSet once its condition `kind` (Completed, Failed, ...) is True."""
        return self.wait_status(
            namespace, name, lambda st: condition(st, kind) is not None, kind, timeout_s
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


# -- the rehearsal submission on the GKE backend

CONN_ID = "rcp_kwok"
ACCOUNT = "rcpflow-airflow"
SEEDS = (1, 2, 3)
CONF = {"global_batch_size": 256, "max_steps": 26, "val_start_at": None}  # validation from 18
# One single-host slice per pool (the JobSet's exclusive topology takes a whole pool): three
# trainings and their evaluations at once.
POOLS = tuple(TpuNodePool(f"tpu-v5p-2x2x1-{c}", "2x2x1", 1) for c in "abcdefgh")
SYSTEM = {
    "system_name": "kwok-tpu-v5p-rehearsal",
    "accelerator_model_name": "TPU v5p (kwok, simulated)",
    "accelerators_per_node": "4",
}


# Both roles: one single-host v5p slice, requests a kwok node always has.
SHAPE = """accelerator = "tpu-v5p-slice"
topology = "2x2x1"
slices = 1
chips_per_host = 4
max_restarts = 1
termination_grace_period_s = 10
cpu_request = "1"
memory_request = "1Gi"
"""


def gke_rehearsal_deployment(storage_root: str | Path, namespace: str) -> str:
    """The shipped rehearsal deployment on the GKE backend: its [jobs] tables as they are
    (with an image each), a [gke] table of single-host v5p slices in `namespace`."""
    text = (REPO / "docker" / "deployment.rehearsal.toml").read_text()
    head, jobs = text.split("[jobs.train]", 1)
    assert 'backend = "local"' in head
    image = '\nimage = "rcpflow-rehearsal:test"\n'
    jobs = jobs.replace("\n]\n", "\n]" + image, 2)
    assert jobs.count(image) == 2
    return f"""
backend = "gke"
storage_root = {json.dumps(str(storage_root))}
eval_window = 2
train_timeout_minutes = 20
eval_timeout_minutes = 10

[gke]
kubernetes_conn_id = "{CONN_ID}"
namespace = "{namespace}"
image = "rcpflow-rehearsal:test"
poll_interval_s = 1.0
backoff_max_s = 5.0
ttl_after_finished_s = 600

[gke.train]
{SHAPE}
[gke.evaluate]
{SHAPE}

[jobs.train]{jobs}"""


def connection_kubeconfig(plane: ControlPlane, namespace: str) -> Path:
    """A kubeconfig of a service account with only the rights docs/gke.md lists."""
    plane.api.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": ACCOUNT, "namespace": namespace},
        }
    )
    subject = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}
    plane.grant(f"rcpflow-airflow-{namespace}", DOCUMENTED_RULES, subject)
    return plane.service_account_kubeconfig(namespace, ACCOUNT)


def airflow_env(plane: ControlPlane, namespace: str, deployment: Path) -> dict[str, str]:
    """What Airflow's processes need to run `deployment` on `namespace`: the connection as the
    documented service account (`connection_kubeconfig`) and the repository importable."""
    kubeconfig = connection_kubeconfig(plane, namespace)
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    return {
        "RCPFLOW_DEPLOYMENT": str(deployment),
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn),
        "PYTHONPATH": str(REPO),
    }


def rehearsal_conf(storage_root: str | Path, name: str) -> dict[str, Any]:
    """The submission's conf: `SEEDS` of the rehearsal (`CONF`) on the GKE backend, the
    submission `name` under `storage_root`."""
    return {
        **CONF,
        "seeds": list(SEEDS),
        "target": 0.69,
        "division": "open",
        "backend": "gke",
        "storage_root": str(storage_root),
        "submission_name": name,
        "system": SYSTEM,
    }


def wait_namespace_empty(plane: ControlPlane, namespace: str, timeout_s: float = 120) -> None:
    """Wait until nothing of the runs is left in `namespace`: every JobSet torn down, with its
    Jobs and pods."""
    jobsets = JobSets.for_plane(plane)

    def empty() -> bool | None:
        listed = jobsets.custom.list_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL
        )
        left = (
            listed["items"]
            or jobsets.batch.list_namespaced_job(namespace).items
            or plane.pods(namespace)
        )
        return None if left else True

    plane.wait_for(
        empty, what=f"namespace {namespace} empty of JobSets, Jobs and pods", timeout_s=timeout_s
    )
