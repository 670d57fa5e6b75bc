"""The controllers the control plane runs besides Kubernetes' own, installed by one installer:
JobSet and Kueue are two configurations (`Controller`) of the same steps. Both are
controller-runtime managers laid out by kubebuilder, so each is its CRDs, a ClusterRole (and
Roles in its namespace) bound to its service account, webhook configurations pointed at it on
127.0.0.1, and a process started with a Configuration file and that account's kubeconfig."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.k8s.client import Api
from devtools.k8s.manifests import controller_manifests, local_webhooks
from devtools.k8s.rbac import service_account

JOBSET_NAMESPACE = "jobset-system"
JOBSET_SERVICE_ACCOUNT = "jobset-controller-manager"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_SERVICE_ACCOUNT = "kueue-controller-manager"
# Kueue v0.17, without its internal cert management, reads its metrics server's certificate
# from this fixed path and exits when it is missing, even with metrics off.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")


@dataclass(frozen=True)
class Controller:
    """One controller: its binary and ``config/components`` beside it (what build.sh copies),
    its namespace and service account, and what its Configuration file adds to the common part
    (`configuration`)."""

    name: str  # the component's name, the prefix of its cluster objects (as its kustomization)
    binary: str  # file names in the binaries folder
    config_dir: str
    namespace: str
    service_account: str
    config_api_version: str
    config_extra: Mapping[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    # Kueue's CRDs name a conversion webhook service that is not installed here
    drop_crd_conversion: bool = False

    @property
    def role(self) -> str:
        return f"{self.name}-manager-role"

    def configuration(
        self, *, webhook_port: int, health_port: int, cert_dir: Path
    ) -> dict[str, Any]:
        """The Configuration file: no leader election, no internal certificates (the
        harness's webhook certificate in `cert_dir`), no metrics, webhooks and health probes on
        127.0.0.1."""
        return {
            "apiVersion": self.config_api_version,
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            **self.config_extra,
        }

    def argv(self, binary: str, config: Path, kubeconfig: Path) -> list[str]:
        return [
            binary,
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            "--zap-log-level=info",
            *self.extra_args,
        ]


def jobset(version: str) -> Controller:
    """The JobSet controller of `version` (one of binaries.JOBSET_VERSIONS)."""
    return Controller(
        name="jobset",
        binary=f"jobset-{version}",
        config_dir=f"jobset-{version}-config",
        namespace=JOBSET_NAMESPACE,
        service_account=JOBSET_SERVICE_ACCOUNT,
        config_api_version="config.jobset.x-k8s.io/v1alpha1",
        extra_args=("--zap-devel=false",),
    )


KUEUE = Controller(
    name="kueue",
    binary="kueue",
    config_dir="kueue-config",
    namespace=KUEUE_NAMESPACE,
    service_account=KUEUE_SERVICE_ACCOUNT,
    config_api_version="config.kueue.x-k8s.io/v1beta2",
    config_extra={
        "namespace": KUEUE_NAMESPACE,
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
        # its aggregated visibility API server is not installed here
        "featureGates": {"VisibilityOnDemand": False},
    },
    drop_crd_conversion=True,
)


def install(
    api: Api,
    controller: Controller,
    *,
    bin_dir: Path,
    webhook_port: int,
    ca_pem: bytes,
    wait_crd: Callable[[str], None],
) -> None:
    """The cluster objects of `controller`: its CRDs (waited for with `wait_crd` until
    Established), its namespace, service account and roles, its webhook configurations
    pointed at 127.0.0.1:`webhook_port` with the CA `ca_pem`."""
    manifests = controller_manifests(bin_dir / controller.config_dir, prefix=f"{controller.name}-")
    for crd in manifests["crds"]:
        if controller.drop_crd_conversion:
            crd.get("spec", {}).pop("conversion", None)
        api.apply(crd)
    for crd in manifests["crds"]:
        wait_crd(crd["metadata"]["name"])
    service_account(
        api,
        controller.namespace,
        controller.service_account,
        controller.role,
        manifests["rules"],
        manifests["namespaced_rules"],
    )
    for config in local_webhooks(manifests["webhooks"], webhook_port, ca_pem):
        api.apply(config)
