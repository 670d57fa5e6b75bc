"""The JobSet CRD version gate (`tasks.backends.gke.crd`) against the real CRDs of JobSet
v0.9.1 (older than the minimum), v0.10.1 (the minimum) and the newest built, each served by a
real API server: the gate refuses exactly where the API server itself would refuse the strict
create (or, without strict validation, drop the failure policy's message patterns)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_real import render, settings, shape

from devtools.k8s.binaries import JOBSET_VERSIONS, OLDER_JOBSET_CRD
from devtools.k8s.client import ApiError
from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.manifests import controller_manifests
from tasks.backends.gke.crd import JobSetVersionError, check_crd
from tasks.backends.gke.render import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION


@pytest.fixture(scope="module")
def bare_api(k8s_bin: Path) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver only: CRDs are swapped freely (no controller watches them)."""
    with ControlPlane(k8s_bin, controllers=False) as plane:
        yield plane


def _install(plane: ControlPlane, config: Path) -> dict[str, Any]:
    (crd,) = controller_manifests(config, prefix="jobset-")["crds"]
    name = crd["metadata"]["name"]
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    try:
        plane.api.request("DELETE", path)
    except ApiError as exc:
        assert exc.status == 404

    def deleted() -> bool | None:
        try:
            plane.api.get(path)
        except ApiError as exc:
            return True if exc.status == 404 else None
        return None

    plane.wait_for(deleted, what=f"CRD {name} deleted", timeout_s=60)
    plane.api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    plane._wait_crd(name)
    served: dict[str, Any] = plane.api.get(path)
    return served


def _create(plane: ControlPlane, jobset: dict[str, Any], strict: bool) -> dict[str, Any]:
    query = "?fieldValidation=Strict" if strict else ""
    ns = jobset["metadata"]["namespace"]
    created: dict[str, Any] = plane.api.request(
        "POST",
        f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/{ns}/{JOBSET_PLURAL}{query}",
        jobset,
    )
    return created


@pytest.mark.parametrize("version", [OLDER_JOBSET_CRD, *JOBSET_VERSIONS])
def test_the_gate_and_the_api_server_agree(
    version: str, bare_api: ControlPlane, k8s_bin: Path
) -> None:
    crd = _install(bare_api, k8s_bin / f"jobset-{version}-config")
    jobset = render(settings("default", train=shape("2x2x1")), run_id=f"manual__gate_{version}")
    old = version == OLDER_JOBSET_CRD
    if old:
        with pytest.raises(JobSetVersionError) as refused:
            check_crd(crd, jobset)
        assert "onJobFailureMessagePatterns (JobSet v0.10)" in str(refused.value)
        with pytest.raises(ApiError) as strict:
            _create(bare_api, copy.deepcopy(jobset), strict=True)
        assert strict.value.status == 400
        assert "onJobFailureMessagePatterns" in strict.value.body
        # what the gate prevents: the lenient create drops the patterns, and with them the
        # difference between a disruption and a user error
        stored = _create(bare_api, copy.deepcopy(jobset), strict=False)
        rules = stored["spec"]["failurePolicy"]["rules"]
        assert all("onJobFailureMessagePatterns" not in r for r in rules)
        bare_api.api.request(
            "DELETE",
            f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/default/{JOBSET_PLURAL}/"
            + jobset["metadata"]["name"],
        )
    else:
        check_crd(crd, jobset)
        stored = _create(bare_api, copy.deepcopy(jobset), strict=True)
        policy = dict(stored["spec"]["failurePolicy"])
        # the CRD's structural-schema default, added by the API server itself
        assert policy.pop("restartStrategy") == "Recreate"
        assert policy == jobset["spec"]["failurePolicy"]
        bare_api.api.request(
            "DELETE",
            f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/default/{JOBSET_PLURAL}/"
            + jobset["metadata"]["name"],
        )
