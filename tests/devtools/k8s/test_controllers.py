"""The one controller installer, for its two configurations (JobSet, Kueue): what it applies
from a kubebuilder-laid-out ``config/components``, and the Configuration and command line each
controller starts with. No binary needed (tests/tasks/backends/gke/real/ runs them)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REPO

from devtools.k8s.binaries import JOBSET_VERSIONS, NEWEST_JOBSET
from devtools.k8s.controllers import KUEUE, Controller, install, jobset

CA = b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"
RULES = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["*"]}]
LEADER_RULES = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}]


class RecordingApi:
    """Stands in for devtools.k8s.client.Api: records what is applied, in order."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def apply(self, obj: dict[str, Any], manager: str = "rcpflow-harness") -> None:
        self.applied.append(obj)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.applied if o["kind"] == kind]


def write_components(bin_dir: Path, controller: Controller) -> None:
    """A controller's config/components as build.sh copies it beside the binary."""
    root = bin_dir / controller.config_dir
    files = {
        "crd/bases/widgets.yaml": (
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
            "metadata: {name: widgets.example.io}\n"
            "spec: {group: example.io, conversion: {strategy: Webhook}}\n"
        ),
        "rbac/role.yaml": (
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n"
            f"metadata: {{name: manager-role}}\nrules: {RULES}\n"
        ),
        "rbac/leader_election_role.yaml": (
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"
            f"metadata: {{name: leader-election-role}}\nrules: {LEADER_RULES}\n"
        ),
        "rbac/kustomization.yaml": "resources: [role.yaml, leader_election_role.yaml]\n",
        "webhook/manifests.yaml": (
            "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\n"
            "metadata: {name: mutating-webhook-configuration}\n"
            "webhooks:\n- name: mwidget.example.io\n  clientConfig:\n"
            "    service: {name: webhook-service, namespace: system, path: /mutate-widget}\n"
        ),
        "webhook/kustomization.yaml": "resources: [manifests.yaml]\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text.replace("'", '"'))


@pytest.mark.parametrize("controller", [jobset(NEWEST_JOBSET), KUEUE], ids=lambda c: c.name)
def test_the_installer_applies_the_controllers_objects(
    tmp_path: Path, controller: Controller
) -> None:
    write_components(tmp_path, controller)
    api, waited = RecordingApi(), []
    install(
        api,  # duck-typed: only apply is called
        controller,
        bin_dir=tmp_path,
        webhook_port=9443,
        ca_pem=CA,
        wait_crd=waited.append,
    )
    [crd] = api.of_kind("CustomResourceDefinition")
    assert waited == ["widgets.example.io"]
    # Kueue's conversion webhook service is not installed here: its CRDs go without it
    assert ("conversion" in crd["spec"]) is not controller.drop_crd_conversion
    assert [o["metadata"]["name"] for o in api.of_kind("Namespace")] == [controller.namespace]
    [account] = api.of_kind("ServiceAccount")
    assert account["metadata"] == {
        "name": controller.service_account,
        "namespace": controller.namespace,
    }
    [cluster_role] = api.of_kind("ClusterRole")
    assert cluster_role["metadata"]["name"] == f"{controller.name}-manager-role"
    assert cluster_role["rules"] == RULES
    [role] = api.of_kind("Role")
    assert role["metadata"]["namespace"] == controller.namespace
    assert role["rules"] == LEADER_RULES
    for binding in (*api.of_kind("ClusterRoleBinding"), *api.of_kind("RoleBinding")):
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": controller.service_account,
                "namespace": controller.namespace,
            }
        ]
    [webhooks] = api.of_kind("MutatingWebhookConfiguration")
    assert webhooks["metadata"]["name"] == f"{controller.name}-mutating-webhook-configuration"
    assert webhooks["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-widget",
        "caBundle": base64.b64encode(CA).decode(),
    }
    # the CRDs come first (the webhooks name their kinds), the webhooks last
    kinds = [o["kind"] for o in api.applied]
    assert kinds[0] == "CustomResourceDefinition"
    assert kinds[-1] == "MutatingWebhookConfiguration"


@pytest.mark.parametrize("controller", [jobset(NEWEST_JOBSET), KUEUE], ids=lambda c: c.name)
def test_each_controller_starts_on_loopback_with_its_own_configuration(
    tmp_path: Path, controller: Controller
) -> None:
    config = controller.configuration(webhook_port=9443, health_port=8081, cert_dir=tmp_path)
    assert config["kind"] == "Configuration"
    assert config["apiVersion"] == controller.config_api_version
    assert config["webhook"] == {"port": 9443, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:8081"}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["metrics"] == {"bindAddress": "0"}
    config_file, kubeconfig = tmp_path / "c.json", tmp_path / "kc"
    argv = controller.argv("/bin/x", config_file, kubeconfig)
    assert argv[:3] == ["/bin/x", f"--config={config_file}", f"--kubeconfig={kubeconfig}"]


def test_kueue_manages_jobsets_in_its_own_namespace() -> None:
    config = KUEUE.configuration(webhook_port=1, health_port=2, cert_dir=Path("/c"))
    assert config["namespace"] == KUEUE.namespace
    assert "jobset.x-k8s.io/jobset" in config["integrations"]["frameworks"]
    assert "namespace" not in jobset(NEWEST_JOBSET).configuration(
        webhook_port=1, health_port=2, cert_dir=Path("/c")
    )


def test_every_controller_binary_is_one_build_sh_builds() -> None:
    build = (REPO / "tests" / "k8s" / "controlplane" / "build.sh").read_text()
    for controller in (*(jobset(v) for v in JOBSET_VERSIONS), KUEUE):
        assert f'"{controller.binary}|' in build, controller.binary
        assert controller.config_dir == f"{controller.binary}-config"
