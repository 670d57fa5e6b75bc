"""What the `cluster` fixture of this folder hands a test (conftest.py starts it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devtools.servers.distributed_airflow import DistributedAirflow
from devtools.servers.slurm_cluster import SlurmCluster


@dataclass(frozen=True)
class Cluster:
    airflow: DistributedAirflow
    slurm: SlurmCluster
    storage: Path  # the deployment's storage_root, shared by every component
