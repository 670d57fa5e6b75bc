"""Settings of the GKE backend: which cluster, which image, and the TPU shape of each job kind.

Pure standard library, so the deployment config can build them at DAG-parse time for free.
`GkeSettings.from_mapping` reads the ``gke`` section of the deployment file; every problem is
reported with the dotted key that holds it (``gke.train.topology: ...``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

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


class GkeSettingsError(ValueError):
    """A GKE setting is missing, misspelt or out of range; the message names the key."""


@dataclass(frozen=True)
class TpuJobShape:
    """Where one kind of job runs: `slices` TPU slices of `topology`, each slice one Job of
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
        self.validate("TpuJobShape")

    def validate(self, where: str) -> None:
        """Raise GkeSettingsError naming `where` (e.g. ``gke.train``) for the first problem."""
        _non_empty_str(self.accelerator, f"{where}.accelerator")
        _non_empty_str(self.topology, f"{where}.topology")
        if self.accelerator not in TPU_ACCELERATORS:
            known = ", ".join(sorted(TPU_ACCELERATORS))
            raise GkeSettingsError(
                f"{where}.accelerator: unknown TPU accelerator {self.accelerator!r} "
                f"(the GKE node label value; one of: {known})"
            )
        dims, host_sizes = TPU_ACCELERATORS[self.accelerator]
        parts = self.topology.split("x")
        if len(parts) != dims or not all(p.isdigit() and int(p) > 0 for p in parts):
            example = "x".join(["2"] * dims)
            raise GkeSettingsError(
                f"{where}.topology: {self.topology!r} is not a {dims}-D topology for "
                f"{self.accelerator} (expected e.g. {example!r})"
            )
        _positive_int(self.slices, f"{where}.slices")
        _positive_int(self.chips_per_host, f"{where}.chips_per_host")
        if self.chips_per_host not in host_sizes:
            raise GkeSettingsError(
                f"{where}.chips_per_host: {self.chips_per_host} is not offered for "
                f"{self.accelerator} (one of: {', '.join(map(str, host_sizes))})"
            )
        if self.chips_per_slice % self.chips_per_host:
            raise GkeSettingsError(
                f"{where}: topology {self.topology} has {self.chips_per_slice} chips, not a "
                f"multiple of chips_per_host={self.chips_per_host}"
            )
        if not isinstance(self.max_restarts, int) or isinstance(self.max_restarts, bool):
            raise GkeSettingsError(f"{where}.max_restarts: must be an integer >= 0")
        if self.max_restarts < 0:
            raise GkeSettingsError(f"{where}.max_restarts: must be >= 0, got {self.max_restarts}")

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

    Each worker gets RCPFLOW_SLICE_INDEX / RCPFLOW_NUM_SLICES (see tasks.gke.jobset); the
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
        self.validate("gke")

    def validate(self, where: str) -> None:
        if self.project_id is not None:
            _non_empty_str(self.project_id, f"{where}.project_id")
        for name in ("location", "cluster_name", "image", "gcp_conn_id"):
            _non_empty_str(getattr(self, name), f"{where}.{name}")
        for name in ("namespace", "service_account"):
            value = getattr(self, name)
            _non_empty_str(value, f"{where}.{name}")
            if len(value) > 63 or not _DNS1123_LABEL.match(value):
                raise GkeSettingsError(
                    f"{where}.{name}: {value!r} is not a Kubernetes name (lowercase letters, "
                    "digits and '-', at most 63 characters)"
                )
        if any(c.isspace() for c in self.image):
            raise GkeSettingsError(f"{where}.image: {self.image!r} contains whitespace")
        if not isinstance(self.impersonation_chain, tuple) or not all(
            isinstance(a, str) and a for a in self.impersonation_chain
        ):
            raise GkeSettingsError(
                f"{where}.impersonation_chain: must be a tuple of non-empty account emails"
            )
        for name in ("use_internal_ip", "use_dns_endpoint"):
            if not isinstance(getattr(self, name), bool):
                raise GkeSettingsError(f"{where}.{name}: must be true or false")
        interval = self.poll_interval_s
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise GkeSettingsError(f"{where}.poll_interval_s: must be a number > 0")
        self.train.validate(f"{where}.train")
        self.evaluate.validate(f"{where}.evaluate")

    def shape(self, role: str) -> TpuJobShape:
        """The shape for a job role: ``train`` or ``evaluate``."""
        if role == "train":
            return self.train
        if role == "evaluate":
            return self.evaluate
        raise ValueError(f"job role must be 'train' or 'evaluate', got {role!r}")

    def connection_kwargs(self) -> dict[str, Any]:
        """Arguments the plugin operators pass to the Google provider's GKE operators."""
        return {
            "project_id": self.project_id,
            "location": self.location,
            "cluster_name": self.cluster_name,
            "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": list(self.impersonation_chain) or None,
            "use_internal_ip": self.use_internal_ip,
            "use_dns_endpoint": self.use_dns_endpoint,
        }

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "gke") -> GkeSettings:
        """Settings from the deployment file's section; missing keys take the defaults.

        ``train`` and ``evaluate`` are mappings of TpuJobShape fields; keys left out of them
        keep the default shape's values. Unknown keys and wrong types raise GkeSettingsError.
        """
        if not isinstance(data, Mapping):
            raise GkeSettingsError(f"{where}: must be a mapping, got {type(data).__name__}")
        _reject_unknown(data, cls, where)
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("train", "evaluate"):
                base = default_train_shape() if key == "train" else default_eval_shape()
                kwargs[key] = _shape_from_mapping(value, base, f"{where}.{key}")
            elif key == "impersonation_chain":
                if isinstance(value, str):
                    value = [value]
                if not isinstance(value, list | tuple):
                    raise GkeSettingsError(f"{where}.{key}: must be a list of account emails")
                kwargs[key] = tuple(value)
            else:
                kwargs[key] = value
        # Built without __init__ so that validation names `where`, as for the shapes.
        settings = object.__new__(cls)
        defaults = cls()
        for f in fields(cls):
            object.__setattr__(settings, f.name, kwargs.get(f.name, getattr(defaults, f.name)))
        settings.validate(where)
        return settings


def _shape_from_mapping(data: Any, base: TpuJobShape, where: str) -> TpuJobShape:
    if not isinstance(data, Mapping):
        raise GkeSettingsError(f"{where}: must be a mapping, got {type(data).__name__}")
    _reject_unknown(data, TpuJobShape, where)
    # Built without __init__ so that validation names the deployment-file key, not the class.
    shape = object.__new__(TpuJobShape)
    for f in fields(TpuJobShape):
        object.__setattr__(shape, f.name, data.get(f.name, getattr(base, f.name)))
    shape.validate(where)
    return shape


def _reject_unknown(data: Mapping[str, Any], cls: type, where: str) -> None:
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise GkeSettingsError(
            f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _non_empty_str(value: Any, where: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise GkeSettingsError(f"{where}: must be a non-empty string, got {value!r}")


def _positive_int(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GkeSettingsError(f"{where}: must be a positive integer, got {value!r}")
