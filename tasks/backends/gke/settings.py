"""Settings of the GKE backend (the deployment's ``[gke]`` table): cluster, image, the TPU
shape of each job role, and the policy for failures, queueing and watching. Pure standard
library: read at DAG-parse time for free.

Only shapes whose process layout has been run are accepted: a training job on one slice
(one process per host, one `jax.distributed` system; tests/tpu_jobs/rcp/test_multihost.py
runs it with two CPU processes), and evaluation workers of one slice each, one
`jax.distributed` system per slice (tests/tpu_jobs/eval/test_multihost_eval.py). Multislice
training (DCN between slices), and multi-host workers for the Tunix evaluator
(`check_evaluate_job`), are refused with the reason.

The exit codes are the job contract of docs/exit-codes.md: `fail_exit_codes` fail a JobSet at
once, SIGTERM (143) and a disruption restart it without counting, anything else (1 included:
Python's code for any uncaught exception) restarts it up to `max_restarts`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rcpflow.trainer import job_exit
from tasks.deployment import DeploymentError, register_table
from tasks.jobs.command import Role
from tasks.settings import SettingError

log = logging.getLogger(__name__)

# GKE node label cloud.google.com/gke-tpu-accelerator -> (topology dimensions, chips per host
# that its machine types offer). From the GKE TPU docs (plan-tpus); extend when a generation is
# added there.
TPU_ACCELERATORS: dict[str, tuple[int, tuple[int, ...]]] = {
    "tpu-v4-podslice": (3, (4,)),
    "tpu-v5p-slice": (3, (4,)),
    "tpu-v5-lite-podslice": (2, (1, 4, 8)),
    "tpu-v6e-slice": (2, (1, 4, 8)),
    "tpu7x": (3, (4,)),
}

# Kubernetes object names (namespace, service account) are DNS-1123 labels; a PriorityClass
# name is a DNS-1123 subdomain; a label value (the Kueue queue name) is at most 63 characters.
# Every pattern is matched whole (fullmatch: `$` alone lets a trailing newline pass).
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# Kubernetes resource quantities (apimachinery's resource.Quantity, the forms a request uses).
_CPU_QUANTITY = re.compile(r"([0-9]+(\.[0-9]{1,3})?|[0-9]+m)")
_MEMORY_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")

# The job exit-code contract (docs/exit-codes.md, `rcpflow.trainer.job_exit.restart_decision`):
# the failurePolicy is rendered from it (`tasks.backends.gke.render`).
DEFAULT_FAIL_EXIT_CODES = job_exit.DEFAULT_FAIL_EXIT_CODES
# The TPU node labels rcpflow sets from the shape; extra node selectors may not change them.
TPU_NODE_LABELS = ("cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology")
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
# The evaluator that runs one process per worker, as a module (``-m``) and as a script.
TUNIX_EVALUATOR = ("tpu_jobs.tunix_evaluate", "tpu_jobs/tunix_evaluate.py")


@dataclass(frozen=True)
class TpuJobShape:
    """Where one role's job runs: `slices` TPU slices of `topology`, each slice one Job of
    ``hosts_per_slice`` pods with `chips_per_host` chips each.

    `max_restarts` is the JobSet's failurePolicy.maxRestarts: the in-cluster restart budget
    for crashes (all slices restart together); a disruption (preemption, maintenance eviction,
    exit 143) restarts without counting, an exit code of `fail_exit_codes` fails at once.
    Airflow-level retries never re-run a failed JobSet. `termination_grace_period_s` is how
    long a pod has between SIGTERM and SIGKILL: for training, long enough to drain the
    checkpoint save queue. `cpu_request` / `memory_request` are each pod's requests (Kubernetes
    quantities): a pod without them is BestEffort, the first a node under pressure evicts; they
    must fit the TPU host's allocatable CPU and memory, or the pods never schedule.
    """

    accelerator: str
    topology: str
    slices: int
    chips_per_host: int
    max_restarts: int = 0
    termination_grace_period_s: int = 60
    # Small enough for every TPU host GKE offers (the smallest, ct5lp-hightpu-1t, has 24 vCPUs
    # and 48 GB): raise them to what the job needs.
    cpu_request: str = "8"
    memory_request: str = "32Gi"

    def __post_init__(self) -> None:
        if not _CPU_QUANTITY.fullmatch(self.cpu_request):
            raise SettingError(
                "cpu_request", f"{self.cpu_request!r} is not a CPU quantity (e.g. '8', '7500m')"
            )
        if not _MEMORY_QUANTITY.fullmatch(self.memory_request):
            raise SettingError(
                "memory_request",
                f"{self.memory_request!r} is not a memory quantity (e.g. '32Gi', '400G')",
            )
        if self.accelerator not in TPU_ACCELERATORS:
            known = ", ".join(sorted(TPU_ACCELERATORS))
            raise SettingError(
                "accelerator",
                f"unknown TPU accelerator {self.accelerator!r} (the GKE node label value; "
                f"one of: {known})",
            )
        dims, host_sizes = TPU_ACCELERATORS[self.accelerator]
        parts = self.topology.split("x")
        if len(parts) != dims or not all(p.isdigit() and int(p) > 0 for p in parts):
            example = "x".join(["2"] * dims)
            raise SettingError(
                "topology",
                f"{self.topology!r} is not a {dims}-D topology for {self.accelerator} "
                f"(expected e.g. {example!r})",
            )
        _at_least(self.slices, 1, "slices")
        if self.chips_per_host not in host_sizes:
            raise SettingError(
                "chips_per_host",
                f"{self.chips_per_host} is not offered for {self.accelerator} "
                f"(one of: {', '.join(map(str, host_sizes))})",
            )
        if self.chips_per_slice % self.chips_per_host:
            raise SettingError(
                "",
                f"topology {self.topology} has {self.chips_per_slice} chips, not a multiple of "
                f"chips_per_host={self.chips_per_host}",
            )
        _at_least(self.max_restarts, 0, "max_restarts")
        _at_least(self.termination_grace_period_s, 1, "termination_grace_period_s")

    @property
    def chips_per_slice(self) -> int:
        return math.prod(int(p) for p in self.topology.split("x"))

    @property
    def hosts_per_slice(self) -> int:
        return self.chips_per_slice // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        """More than one host per slice: the pods of a slice form one system."""
        return self.hosts_per_slice > 1


def default_train_shape() -> TpuJobShape:
    """Training: one v5p slice of 128 chips (4x4x8), 32 hosts. It resumes from its newest
    checkpoint, so a crash restarts it (3 times); 10 minutes between SIGTERM and SIGKILL let the
    queued checkpoint saves finish."""
    return TpuJobShape(
        accelerator="tpu-v5p-slice",
        topology="4x4x8",
        slices=1,
        chips_per_host=4,
        max_restarts=3,
        termination_grace_period_s=600,
    )


def default_eval_shape() -> TpuJobShape:
    """Evaluation: 64 chips as 16 independent single-host 2x2x1 v5p workers; evaluation is
    idempotent (a valid summary is reused), so a restart costs only time.

    Each worker gets RCPFLOW_SLICE_INDEX / RCPFLOW_NUM_SLICES (see tasks.backends.gke.render); the
    evaluator evaluates its share of the instances and worker 0 merges the shards."""
    return TpuJobShape(
        accelerator="tpu-v5p-slice", topology="2x2x1", slices=16, chips_per_host=4, max_restarts=2
    )


@dataclass(frozen=True)
class GkeCluster:
    """Which cluster the jobs run on and how to reach it, as one object the operators are
    given: the fields of the Google provider's `GKEOperatorMixin` (project_id None: the project
    of the connection `gcp_conn_id`), or, when `kubernetes_conn_id` is set, that cncf-kubernetes
    connection (a kubeconfig, or in-cluster) and none of the GKE fields."""

    location: str
    cluster_name: str
    project_id: str | None = None
    gcp_conn_id: str = "google_cloud_default"
    impersonation_chain: tuple[str, ...] = ()
    use_internal_ip: bool = False
    use_dns_endpoint: bool = False
    kubernetes_conn_id: str | None = None


def cluster_kwargs(cluster: GkeCluster) -> dict[str, Any]:
    """`cluster` as JSON (a trigger's driver args): every field (`cluster_from_kwargs` is the
    inverse)."""
    kwargs = dataclasses.asdict(cluster)
    kwargs["impersonation_chain"] = list(cluster.impersonation_chain)
    return kwargs


def cluster_from_kwargs(kwargs: Mapping[str, Any]) -> GkeCluster:
    """The cluster `cluster_kwargs` wrote."""
    return GkeCluster(**{**kwargs, "impersonation_chain": tuple(kwargs["impersonation_chain"])})


@dataclass(frozen=True)
class GkeSettings:
    """Cluster, image and job shapes for the GKE backend.

    project_id None means the project of the Airflow connection `gcp_conn_id` (the Google
    provider's own default). `kubernetes_conn_id` reaches the cluster through that
    cncf-kubernetes connection instead (its kubeconfig, or in-cluster): no GKE API lookup, and
    the GKE fields (project, location, cluster, Google connection, impersonation, internal IP,
    DNS endpoint) are not used; e.g. a rehearsal on a kwok cluster, or a GKE cluster whose
    kubeconfig the deployment holds. `service_account` is the Kubernetes service account the job
    pods run as (bind it to a Google service account with Workload Identity for gs:// access).
    `image` is the accelerator image built from docker/Dockerfile.tpu and pushed to a registry
    the cluster can pull from (pin it by digest: ``...@sha256:<digest>``).

    Failures: `fail_exit_codes` fail the JobSet at once (default DEFAULT_FAIL_EXIT_CODES, the
    deterministic user errors of docs/exit-codes.md); 1 and 143 may not be among them.
    Queueing: `queue_name` submits through that Kueue LocalQueue (label
    ``kueue.x-k8s.io/queue-name``, created suspended; admitted all-or-nothing),
    `priority_class` is the pods' PriorityClass; a JobSet suspended (not admitted) for
    `max_suspended_minutes` fails, and that time does not count against the job's own timeout.
    `ttl_after_finished_s`: the cluster deletes a finished JobSet after that long (the teardown
    normally deletes it first).
    Watching (the same three keys as ``[slurm]``): the JobSet is read every `poll_interval_s`;
    API errors are retried with exponential backoff up to `backoff_max_s` between reads. An
    outage never fails the task: after `outage_budget_s` of failed reads the watch says so in
    the task log and goes on from a fresh lookup of the cluster's endpoint. `run_retries`
    (training; evaluation uses the deployment's eval_retries) are for an error of the task
    itself, and a retry adopts the JobSet that is still running.
    Pods: `node_selector` adds node labels to the TPU ones, `tolerations` and `volumes` are
    core/v1 Toleration and Volume objects (TOML tables, Kubernetes' field names) added to every
    pod, `volume_mounts` (VolumeMount objects) mount them in the job's container, and
    `pod_annotations` annotate the pods (e.g. ``gke-gcsfuse/volumes = "true"`` for a GCS FUSE
    CSI volume). The cluster validates them strictly on create.
    """

    project_id: str | None = None
    location: str = "us-east5"
    cluster_name: str = "rcpflow"
    namespace: str = "default"
    image: str = "rcpflow-tpu:latest"
    service_account: str = "default"
    gcp_conn_id: str = "google_cloud_default"
    impersonation_chain: tuple[str, ...] = ()
    use_internal_ip: bool = False
    use_dns_endpoint: bool = False
    kubernetes_conn_id: str | None = None
    poll_interval_s: float = 30.0
    outage_budget_s: float = 1200.0
    backoff_max_s: float = 120.0
    run_retries: int = 2
    fail_exit_codes: tuple[int, ...] = DEFAULT_FAIL_EXIT_CODES
    queue_name: str | None = None
    priority_class: str | None = None
    max_suspended_minutes: int = 720
    ttl_after_finished_s: int = 86400
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    tolerations: tuple[dict, ...] = ()  # Kubernetes objects
    volumes: tuple[dict, ...] = ()
    volume_mounts: tuple[dict, ...] = ()
    pod_annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    train: TpuJobShape = field(default_factory=default_train_shape)
    evaluate: TpuJobShape = field(default_factory=default_eval_shape)

    def __post_init__(self) -> None:
        if self.project_id is not None:
            _non_empty(self.project_id, "project_id")
        if self.kubernetes_conn_id is not None:
            _non_empty(self.kubernetes_conn_id, "kubernetes_conn_id")
            gke_only = [
                name
                for name, value in (
                    ("impersonation_chain", self.impersonation_chain),
                    ("use_internal_ip", self.use_internal_ip),
                    ("use_dns_endpoint", self.use_dns_endpoint),
                )
                if value
            ]
            if gke_only:
                raise SettingError(
                    gke_only[0],
                    "is a GKE lookup setting, unused when kubernetes_conn_id reaches the cluster "
                    "through a Kubernetes connection; remove one of the two",
                )
        for name, value in (
            ("location", self.location),
            ("cluster_name", self.cluster_name),
            ("image", self.image),
            ("gcp_conn_id", self.gcp_conn_id),
        ):
            _non_empty(value, name)
        for name, value in (
            ("namespace", self.namespace),
            ("service_account", self.service_account),
        ):
            _non_empty(value, name)
            if len(value) > 63 or not _DNS1123_LABEL.fullmatch(value):
                raise SettingError(
                    name,
                    f"{value!r} is not a Kubernetes name (lowercase letters, digits and '-', "
                    "at most 63 characters)",
                )
        if any(c.isspace() for c in self.image):
            raise SettingError("image", f"{self.image!r} contains whitespace")
        if not all(self.impersonation_chain):
            raise SettingError("impersonation_chain", "account emails must not be empty")
        for name in ("poll_interval_s", "outage_budget_s", "backoff_max_s"):
            if getattr(self, name) <= 0:
                raise SettingError(name, f"must be > 0, got {getattr(self, name)}")
        _at_least(self.run_retries, 0, "run_retries")
        _at_least(self.max_suspended_minutes, 1, "max_suspended_minutes")
        problem = job_exit.fail_exit_codes_problem(self.fail_exit_codes)
        if problem:
            raise SettingError("fail_exit_codes", problem)
        self._check_pod_extras()
        # The watch must see the terminal status before the cluster deletes the JobSet.
        if self.ttl_after_finished_s < max(600, 10 * self.poll_interval_s):
            raise SettingError(
                "ttl_after_finished_s",
                f"{self.ttl_after_finished_s} s is too close to poll_interval_s="
                f"{self.poll_interval_s}: the cluster could delete a finished JobSet before the "
                "watch reads its outcome (use at least 600 s and 10 poll intervals)",
            )
        if self.queue_name is not None and not _LABEL_VALUE.fullmatch(self.queue_name):
            raise SettingError(
                "queue_name",
                f"{self.queue_name!r} is not a Kueue LocalQueue name usable as a label value "
                "(letters, digits, '-', '_', '.', at most 63 characters)",
            )
        if self.priority_class is not None and (
            len(self.priority_class) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(self.priority_class)
        ):
            raise SettingError(
                "priority_class", f"{self.priority_class!r} is not a PriorityClass name"
            )
        self._check_proven_shapes()

    def _check_pod_extras(self) -> None:
        taken = sorted(set(self.node_selector) & set(TPU_NODE_LABELS))
        if taken:
            raise SettingError(
                f"node_selector.{taken[0]}", "is set from the job's TPU shape; set the shape"
            )
        for i, toleration in enumerate(self.tolerations):
            unknown = sorted(set(toleration) - _TOLERATION_KEYS)
            if unknown or not toleration:
                raise SettingError(
                    f"tolerations[{i}]",
                    f"a Toleration has the keys {', '.join(sorted(_TOLERATION_KEYS))}; got "
                    f"{', '.join(map(str, unknown)) or 'none'}",
                )
        names: list[str] = []
        for i, volume in enumerate(self.volumes):
            name = volume.get("name")
            if not isinstance(name, str) or not _DNS1123_LABEL.fullmatch(name) or len(volume) < 2:
                raise SettingError(
                    f"volumes[{i}]", "a Volume needs a 'name' (a DNS label) and one volume source"
                )
            if name in names:
                raise SettingError(f"volumes[{i}].name", f"{name!r} is given twice")
            names.append(name)
        for i, mount in enumerate(self.volume_mounts):
            if mount.get("name") not in names:
                raise SettingError(
                    f"volume_mounts[{i}].name",
                    f"{mount.get('name')!r} is not one of gke.volumes ({', '.join(names)})",
                )
            path = mount.get("mountPath")
            if not isinstance(path, str) or not path.startswith("/"):
                raise SettingError(f"volume_mounts[{i}].mountPath", "must be an absolute path")

    def _check_proven_shapes(self) -> None:
        if self.train.slices > 1:
            raise SettingError(
                "train.slices",
                f"{self.train.slices} slices: multislice training is not supported yet (the "
                "trainer forms one jax.distributed system per slice; DCN between slices is not "
                "proven); use one larger slice",
            )

    def shape(self, role: Role) -> TpuJobShape:
        """The shape of a job role's JobSet."""
        return {"train": self.train, "evaluate": self.evaluate}[role]

    @property
    def cluster(self) -> GkeCluster:
        """The cluster the JobSet operators talk to (`tasks.backends.gke.hooks`): the settings'
        fields of the same names."""
        return GkeCluster(**{f.name: getattr(self, f.name) for f in dataclasses.fields(GkeCluster)})


def check_evaluate_job(settings: GkeSettings, command: Sequence[str], source: str) -> None:
    """Refuse a multi-host evaluation shape for `command` (``jobs.evaluate`` of the deployment
    file `source`) when it runs the evaluator that is one process per worker, the Tunix one:
    `DeploymentError` naming the file, the setting and the job."""
    shape = settings.evaluate
    module, script = TUNIX_EVALUATOR
    if shape.multi_host and any(item == module or item.endswith(script) for item in command):
        raise DeploymentError(
            f"{source}: gke.evaluate.topology: {shape.topology} has {shape.hosts_per_slice} "
            "hosts per slice, but jobs.evaluate runs the Tunix evaluator "
            "(tpu_jobs.tunix_evaluate), which restores a checkpoint on one process; use a "
            "single-host topology and more slices"
        )


def _non_empty(value: str, name: str) -> None:
    if not value.strip():
        raise SettingError(name, f"must be a non-empty string, got {value!r}")


def _at_least(value: int, minimum: int, name: str) -> None:
    if value < minimum:
        raise SettingError(name, f"must be >= {minimum}, got {value}")


TABLE = "gke"
register_table(TABLE, GkeSettings)
