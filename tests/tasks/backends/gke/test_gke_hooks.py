"""How the JobSet hooks reach a cluster: through the GKE lookup by default, through a
cncf-kubernetes connection (its kubeconfig) when the settings name one. Against the stand-in
API server; the real control plane's tests use the kubeconfig path end to end
(real/test_real_submission.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from env_helpers import set_env

from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.hooks import (
    AsyncJobSetHook,
    AsyncKubeconfigJobSetHook,
    GkeJobSetHook,
    JobSetHook,
    KubeconfigJobSetHook,
)
from tasks.backends.gke.render import jobset_ref, render_jobset
from tasks.backends.gke.settings import GkeSettings, cluster_from_kwargs, cluster_kwargs
from tasks.backends.gke.status import JobSetGone


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "kubeconfig-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def kubeconfig_cluster(fake_kube_api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stand-in reached through a Kubernetes connection; the GKE lookup raises if used."""
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails

    def no_lookup(self: object) -> tuple[str, str]:
        raise AssertionError("the GKE lookup was used for a kubernetes_conn_id cluster")

    monkeypatch.setattr(GKEClusterAuthDetails, "fetch_cluster_info", no_lookup)
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", fake_kube_api.endpoint())
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    set_env(monkeypatch, {"AIRFLOW_CONN_RCP_K8S": json.dumps(conn)})
    return GkeSettings(kubernetes_conn_id="rcp_k8s").cluster


def test_a_kubernetes_connection_reaches_the_cluster_without_the_gke_lookup(
    fake_kube_api, kubeconfig_cluster
) -> None:
    jobset = render_jobset(
        GkeSettings(), role="train", dag_id="d", run_id="r", job="train", command=["python"]
    )
    hook = JobSetHook.for_cluster(kubeconfig_cluster)
    assert isinstance(hook, KubeconfigJobSetHook)
    assert hook.get_jobset_crd()["metadata"]["name"] == "jobsets.jobset.x-k8s.io"
    assert hook.create_jobset(jobset) is True
    ref = jobset_ref(jobset)
    assert hook.get_jobset(ref["namespace"], ref["name"])["metadata"]["name"] == ref["name"]
    # the kubeconfig's user, not a Google token
    assert {auth for _, _, auth in fake_kube_api.requests} == {"Bearer kubeconfig-token"}

    async def from_the_triggerer() -> None:
        ahook = await AsyncJobSetHook.for_cluster(kubeconfig_cluster)
        assert isinstance(ahook, AsyncKubeconfigJobSetHook)
        found = await ahook.get_jobset(ref["namespace"], ref["name"])
        assert (
            found["metadata"]["uid"]
            == hook.get_jobset(ref["namespace"], ref["name"])["metadata"]["uid"]
        )
        assert await ahook.delete_jobset(ref["namespace"], ref["name"]) is True
        with pytest.raises(JobSetGone):
            await ahook.get_jobset(ref["namespace"], ref["name"])

    asyncio.run(from_the_triggerer())


def test_without_a_kubernetes_connection_the_gke_lookup_is_used(fake_gke) -> None:
    hook = JobSetHook.for_cluster(GkeSettings().cluster)
    assert isinstance(hook, GkeJobSetHook)
    assert hook.get_jobset_crd()["metadata"]["name"] == "jobsets.jobset.x-k8s.io"


@pytest.mark.parametrize(
    "settings",
    [
        GkeSettings(kubernetes_conn_id="rcp_k8s"),
        GkeSettings(project_id="p", impersonation_chain=("a@b",), use_dns_endpoint=True),
    ],
    ids=["kubernetes-connection", "gke-lookup"],
)
def test_the_trigger_kwargs_carry_the_whole_cluster(settings: GkeSettings) -> None:
    # Found by the whole submission on the real control plane: the trigger's kwargs once
    # listed the GKE fields by hand and lost kubernetes_conn_id, so the triggerer looked the
    # cluster up through a Google connection the deployment does not have.
    kwargs = cluster_kwargs(settings.cluster)
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert cluster_from_kwargs(kwargs) == settings.cluster
    # the driver's args (what a watch trigger's kwargs hold) rebuild the same cluster
    args = json.loads(json.dumps(GkeDriver(settings).args()))
    assert GkeDriver.from_args(args).cluster == settings.cluster
