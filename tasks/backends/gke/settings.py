"""Settings of the GKE backend (the deployment's ``[gke]`` table): cluster, image, and the TPU
shape of each job role. Pure standard library: read at DAG-parse time for free.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from tasks.jobs import Role
from tasks.settings import SettingError

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

# Kubernetes object names (namespace, service account) are DNS-1123 labels.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class TpuJobShape:
    """Where one role's job runs: `slices` TPU slices of `topology`, each slice one Job of
    ``hosts_per_slice`` pods with `chips_per_host` chips each.

    `max_restarts` is the JobSet's failurePolicy.maxRestarts: the in-cluster restart budget
    (all slices restart together). Airflow-level retries do not re-run a failed JobSet.
    """

    accelerator: str
    topology: str
    slices: int
    chips_per_host: int
    max_restarts: int = 0

    def __post_init__(self) -> None:
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

    @property
    def chips_per_slice(self) -> int:
        return math.prod(int(p) for p in self.topology.split("x"))

    @property
    def hosts_per_slice(self) -> int:
        return self.chips_per_slice // self.chips_per_host

    @property
    def total_chips(self) -> int:
        return self.chips_per_slice * self.slices


def default_train_shape() -> TpuJobShape:
    """Training: one v5p slice of 128 chips (4x4x8), 32 hosts."""
    return TpuJobShape(accelerator="tpu-v5p-slice", topology="4x4x8", slices=1, chips_per_host=4)


def default_eval_shape() -> TpuJobShape:
    """Evaluation: 64 chips as 16 independent single-host 2x2x1 v5p workers; evaluation is
    idempotent (a valid summary is reused), so a restart costs only time.

    Each worker gets RCPFLOW_SLICE_INDEX / RCPFLOW_NUM_SLICES (see tasks.backends.gke.render); the
    evaluator evaluates its share of the instances and worker 0 merges the shards."""
    return TpuJobShape(
        accelerator="tpu-v5p-slice", topology="2x2x1", slices=16, chips_per_host=4, max_restarts=2
    )


@dataclass(frozen=True)
class GkeSettings:
    """Cluster, image and job shapes for the GKE backend.

    project_id None means the project of the Airflow connection `gcp_conn_id` (the Google
    provider's own default). `service_account` is the Kubernetes service account the job pods
    run as (bind it to a Google service account with Workload Identity for gs:// access).
    `image` is the accelerator image built from docker/Dockerfile.tpu and pushed to a registry
    the cluster can pull from.
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
    poll_interval_s: float = 30.0
    train: TpuJobShape = field(default_factory=default_train_shape)
    evaluate: TpuJobShape = field(default_factory=default_eval_shape)

    def __post_init__(self) -> None:
        if self.project_id is not None:
            _non_empty(self.project_id, "project_id")
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
            if len(value) > 63 or not _DNS1123_LABEL.match(value):
                raise SettingError(
                    name,
                    f"{value!r} is not a Kubernetes name (lowercase letters, digits and '-', "
                    "at most 63 characters)",
                )
        if any(c.isspace() for c in self.image):
            raise SettingError("image", f"{self.image!r} contains whitespace")
        if not all(self.impersonation_chain):
            raise SettingError("impersonation_chain", "account emails must not be empty")
        if self.poll_interval_s <= 0:
            raise SettingError("poll_interval_s", f"must be > 0, got {self.poll_interval_s}")

    def shape(self, role: Role) -> TpuJobShape:
        """The shape of a job role's JobSet."""
        return {"train": self.train, "evaluate": self.evaluate}[role]

    def connection_kwargs(self) -> dict[str, Any]:
        """Arguments the JobSet operators pass to the Google provider's GKE operators."""
        return {
            "project_id": self.project_id,
            "location": self.location,
            "cluster_name": self.cluster_name,
            "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": list(self.impersonation_chain) or None,
            "use_internal_ip": self.use_internal_ip,
            "use_dns_endpoint": self.use_dns_endpoint,
        }


def _non_empty(value: str, name: str) -> None:
    if not value.strip():
        raise SettingError(name, f"must be a non-empty string, got {value!r}")


def _at_least(value: int, minimum: int, name: str) -> None:
    if value < minimum:
        raise SettingError(name, f"must be >= {minimum}, got {value}")
