"""A real Kubernetes control plane for the GKE backend's tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, the JobSet controller and kwok with TPU v5p nodes
(`devtools.k8s.control_plane`), started once per session. The planes themselves (`k8s_bin`,
`planes`: where the binaries come from, the skip without them) are the session fixtures of the
plugin `k8s_planes.py`, which other folders share.

Fixtures:
    control_plane  (session)  the running control plane (newest JobSet)
    kube           (session)  a `kubernetes` ApiClient with the admin kubeconfig
    namespace      (function) a fresh namespace, deleted afterwards (its default service
                              account exists)
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from k8s_planes import Planes
from k8s_real import fresh_namespace

from devtools.k8s.binaries import NEWEST_JOBSET
from devtools.k8s.control_plane import ControlPlane

# Airflow imported by these tests must not write into ~/airflow; another test folder's harness
# may have configured it already, which then wins.
if "AIRFLOW_HOME" not in os.environ and "airflow" not in sys.modules:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="rcpflow-k8s-airflow-home-")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture(scope="session")
def control_plane(planes: Planes) -> ControlPlane:
    """The control plane with the newest JobSet."""
    return planes(NEWEST_JOBSET)


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Iterator[Any]:
    import kubernetes

    client = kubernetes.config.new_client_from_config(str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(control_plane) as name:
        yield name
