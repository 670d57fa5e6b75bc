"""A real Kubernetes control plane on 127.0.0.1 for tests and for a person: etcd, kube-apiserver,
kube-controller-manager (the Job, garbage-collector, service-account and namespace
controllers), kube-scheduler, the JobSet controller with its webhooks, kwok simulating TPU v5p
hosts, and optionally Kueue's controller. The binaries are built from the Go modules under
``tests/k8s/controlplane/`` (``make k8s-bin``; docs/k8s-control-plane.md).

    python -m devtools.k8s [--jobset v0.10.1] [--kueue] [--build]

starts everything, prints the kubeconfig path and waits for Ctrl-C; then every process is
stopped by its PID and the working folder deleted.

What it sets up, in order (each wait has a timeout whose error names the component and ends
with the tail of its log):

1. a CA, serving certificates for the API server and the webhooks, an admin client
   certificate (``system:masters``) and a service-account signing key, in a fresh folder;
2. etcd and kube-apiserver on free loopback ports (client-certificate authentication, RBAC,
   ``ExtendedResourceToleration`` as GKE has it); the admin kubeconfig;
3. the JobSet CRD, its controller's ClusterRole bound to a service account whose token the
   controller runs with, and its webhook configurations pointed at the controller on
   127.0.0.1 (the manifests come from the JobSet module's ``config/components``, copied beside
   the binary by the build);
4. kube-controller-manager, kube-scheduler, the JobSet controller;
5. kwok and one Node per TPU host (`TpuNodePool`): the labels, taint and ``google.com/tpu``
   capacity GKE gives a TPU v5p host. kwok's stages, written here, run a scheduled pod, and
   end it when a test asks: annotation `EXIT_CODE_ANNOTATION` (the container's exit code;
   0 succeeds, others fail the pod) or `DISRUPTION_ANNOTATION` (the pod fails with the
   ``DisruptionTarget`` condition, as a preempted or evicted pod does);
6. with ``kueue=True``: Kueue's CRDs, webhooks and controller.

`ControlPlane.stop_apiserver` / `start_apiserver` stop and start the API server alone (same
port, same etcd), for watch tests.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from devtools.k8s.binaries import JOBSET_VERSIONS, NEWEST_JOBSET
from devtools.k8s.client import Api
from devtools.k8s.controllers import KUEUE, KUEUE_METRICS_CERTS, Controller, install, jobset
from devtools.k8s.errors import BinariesMissing, ControlPlaneError
from devtools.k8s.kwok_nodes import (
    DEFAULT_POOLS,
    DISRUPTION_ANNOTATION,
    EXIT_CODE_ANNOTATION,
    KWOK_NODE_ANNOTATION,
    TpuNodePool,
    kwok_stages,
    tpu_nodes,
)
from devtools.k8s.pki import Pki, make_pki
from devtools.k8s.processes import Component, WorkFolder, wait_until
from devtools.k8s.rbac import grant
from tasks.jobs.processes import Server, free_port

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.64.0.0/14"
START_TIMEOUT_S = 120.0

T = TypeVar("T")


def _started(value: T | None) -> T:
    """What `start` sets (the working folder, the client, the certificates), once it has."""
    if value is None:
        raise ControlPlaneError("the control plane is not started")
    return value


@dataclass
class ControlPlane(WorkFolder, Server):
    """``with ControlPlane(binaries()) as cp:`` a running control plane (see the module doc).

    `kubeconfig` is the admin kubeconfig; `api` a stdlib client with the same identity."""

    bin_dir: Path
    jobset_version: str = NEWEST_JOBSET
    pools: Sequence[TpuNodePool] = DEFAULT_POOLS
    kueue: bool = False
    # False: etcd and kube-apiserver only (no CRD, controller or node): a bare API server.
    controllers: bool = True
    workdir: Path | None = None
    timeout_s: float = START_TIMEOUT_S
    keep_workdir: bool = False
    # Bearer tokens the API server takes as admins (group system:masters), e.g. the fixed token
    # of test Google credentials; `admin_token` is always one of them.
    admin_tokens: Sequence[str] = ()
    # Bearer token -> user name (no group): a client whose rights are only what RBAC binds to
    # that user, e.g. the Airflow connection's identity with the roles docs/gke.md lists.
    user_tokens: Mapping[str, str] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict)
    _owns_workdir: bool = False

    def __post_init__(self) -> None:
        if self.jobset_version not in JOBSET_VERSIONS:
            raise ControlPlaneError(
                f"jobset_version {self.jobset_version!r}: built are {', '.join(JOBSET_VERSIONS)}"
            )
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.apiserver_port = free_port()
        self.jobset_webhook_port = free_port()
        self.jobset_health_port = free_port()
        self.kueue_webhook_port = free_port()
        self.kueue_health_port = free_port()
        self._api: Api | None = None
        self._pki: Pki | None = None
        self._created_kueue_certs = False
        self.admin_token = base64.urlsafe_b64encode(os.urandom(24)).decode()

    # -- paths and clients

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def api(self) -> Api:
        return _started(self._api)

    @property
    def pki(self) -> Pki:
        return _started(self._pki)

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not path.is_file():
            raise BinariesMissing(f"{path} is missing (build.sh builds it)")
        return str(path)

    def pids(self) -> dict[str, int]:
        """PID of every running component, by name."""
        return {n: c.pid for n, c in self.components.items() if c.running() and c.pid}

    # -- start and stop

    def start(self) -> None:
        self.make_workdir("rcpflow-k8s-")
        self._pki = make_pki(self.root / "pki")
        self._write_kubeconfig(
            self.kubeconfig,
            user={
                "client-certificate": str(self.pki.admin_crt),
                "client-key": str(self.pki.admin_key),
            },
        )
        self._start_etcd()
        self.start_apiserver()
        self._api = Api(self.url, self.pki)
        if not self.controllers:
            return
        # JobSet's CRDs and webhooks before the Job controller, its controller after
        self._install_controller(self.jobset, self.jobset_webhook_port)
        self._start_kube_controllers()
        self._start_controller(self.jobset, self.jobset_webhook_port, self.jobset_health_port)
        self._start_kwok()
        if self.kueue:
            self._start_kueue()

    def stop(self) -> None:
        """Stop every component by its PID (controllers first, etcd last), then delete the
        working folder unless `keep_workdir`."""
        for name in reversed(list(self.components)):
            self.components[name].stop()
        if self._created_kueue_certs:
            for name in ("tls.crt", "tls.key"):
                with contextlib.suppress(OSError):
                    (KUEUE_METRICS_CERTS / name).unlink()
            for folder in (KUEUE_METRICS_CERTS, *KUEUE_METRICS_CERTS.parents):
                if folder == Path("/etc"):
                    break
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
            self._created_kueue_certs = False
        if not self.keep_workdir:
            self.remove_workdir()

    def _add(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Component:
        component = self.components.get(name)
        if component is None:
            component = Component(name, argv, self.logs, env)
            self.components[name] = component
        component.start()
        return component

    def _write_kubeconfig(self, path: Path, *, user: Mapping[str, str]) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "rcpflow-test",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.pki.ca_crt),
                    },
                }
            ],
            "users": [{"name": "user", "user": dict(user)}],
            "contexts": [
                {"name": "rcpflow-test", "context": {"cluster": "rcpflow-test", "user": "user"}}
            ],
            "current-context": "rcpflow-test",
        }
        path.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
        path.chmod(0o600)

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        etcd = self._add(
            "etcd",
            [
                self.binary("etcd"),
                "--name=default",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool | None:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return True if json.loads(resp.read()).get("health") == "true" else None

        wait_until(healthy, timeout_s=self.timeout_s, what="etcd /health", component=etcd)

    def start_apiserver(self) -> None:
        """Start kube-apiserver (again, after `stop_apiserver`: same port, same etcd) and wait
        for /readyz."""
        pki = self.pki
        tokens = self.root / "tokens.csv"
        lines = [
            f'{token},rcpflow-admin-{i},rcpflow-admin-{i},"system:masters"'
            for i, token in enumerate([self.admin_token, *self.admin_tokens])
        ]
        lines += [f"{token},{user},{user}" for token, user in self.user_tokens.items()]
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)
        apiserver = self._add(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                f"--tls-cert-file={pki.apiserver_crt}",
                f"--tls-private-key-file={pki.apiserver_key}",
                f"--client-ca-file={pki.ca_crt}",
                f"--token-auth-file={tokens}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                # GKE adds the toleration of the google.com/tpu taint to pods asking for TPUs.
                "--enable-admission-plugins=ExtendedResourceToleration",
                "--allow-privileged=true",
                "--profiling=false",
                "--enable-priority-and-fairness=false",
                "--endpoint-reconciler-type=none",
            ],
        )
        context = ssl.create_default_context(cafile=str(pki.ca_crt))
        context.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))

        def ready() -> bool | None:
            url = f"{self.url}/readyz"
            with urllib.request.urlopen(url, timeout=5, context=context) as resp:
                return True if resp.status == 200 else None

        wait_until(
            ready, timeout_s=self.timeout_s, what="kube-apiserver /readyz", component=apiserver
        )

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver alone (SIGTERM, SIGKILL after the grace period)."""
        self.components["kube-apiserver"].stop()

    @property
    def jobset(self) -> Controller:
        return jobset(self.jobset_version)

    def _install_controller(self, controller: Controller, webhook_port: int) -> None:
        install(
            self.api,
            controller,
            bin_dir=self.bin_dir,
            webhook_port=webhook_port,
            ca_pem=self.pki.ca_crt.read_bytes(),
            wait_crd=self._wait_crd,
        )

    def _start_controller(
        self, controller: Controller, webhook_port: int, health_port: int
    ) -> None:
        config = self.root / f"{controller.name}-config.json"
        config.write_text(
            json.dumps(
                controller.configuration(
                    webhook_port=webhook_port,
                    health_port=health_port,
                    cert_dir=self.pki.webhook_dir,
                )
            )
        )
        kubeconfig = self.service_account_kubeconfig(
            controller.namespace, controller.service_account
        )
        component = self._add(
            controller.name,
            controller.argv(self.binary(controller.binary), config, kubeconfig),
            env={"POD_NAMESPACE": controller.namespace},
        )
        self._wait_http_ready(component, health_port, "/readyz")

    def _wait_crd(self, name: str) -> None:
        def established() -> bool | None:
            crd = self.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            ok = any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
            return True if ok else None

        wait_until(
            established,
            timeout_s=self.timeout_s,
            what=f"CRD {name} Established",
            component=self.components["kube-apiserver"],
        )

    def grant(self, role: str, rules: Sequence[Any], subject: Mapping[str, str]) -> None:
        """A ClusterRole `role` of `rules`, bound to `subject` (a ServiceAccount, a User)."""
        grant(self.api, role, rules, subject)

    def service_account_kubeconfig(self, namespace: str, account: str) -> Path:
        """A kubeconfig with a token of `account` (TokenRequest, one day): the identity a
        controller runs with, so that its ClusterRole is what it may do."""
        answer = self.api.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 86400},
            },
        )
        path = self.root / f"kubeconfig-{namespace}-{account}"
        self._write_kubeconfig(path, user={"token": answer["status"]["token"]})
        return path

    def _start_kube_controllers(self) -> None:
        kcm = self._add(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--controllers=job-controller,garbage-collector-controller,"
                "serviceaccount-controller,namespace-controller,"
                "root-ca-certificate-publisher-controller,pod-garbage-collector-controller,"
                "node-lifecycle-controller",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_crt}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                "--secure-port=0",
                "--concurrent-job-syncs=10",
            ],
        )
        scheduler = self._add(
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )

        def default_account() -> bool | None:
            self.api.get("/api/v1/namespaces/default/serviceaccounts/default")
            return True

        wait_until(
            default_account,
            timeout_s=self.timeout_s,
            what="the default service account (serviceaccount controller)",
            component=kcm,
        )
        time.sleep(0.5)
        if not scheduler.running():
            raise scheduler.failure("exited at start")

    def _wait_http_ready(self, component: Component, port: int, path: str) -> None:
        def ready() -> bool | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
                return True if resp.status == 200 else None

        wait_until(
            ready, timeout_s=self.timeout_s, what=f"{component.name} {path}", component=component
        )

    def _start_kwok(self) -> None:
        stages = self.root / "kwok-stages.yaml"
        stages.write_text("\n---\n".join(json.dumps(s) for s in kwok_stages()) + "\n")
        kwok = self._add(
            "kwok",
            [
                self.binary("kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.128.0.10",
                "--node-lease-duration-seconds=40",
            ],
        )
        nodes = tpu_nodes(self.pools)
        for node in nodes:
            self.api.request("POST", "/api/v1/nodes", node)

        def all_ready() -> bool | None:
            items = self.api.get("/api/v1/nodes")["items"]
            ready = {
                n["metadata"]["name"]
                for n in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (n.get("status") or {}).get("conditions") or []
                )
            }
            return True if all(n["metadata"]["name"] in ready for n in nodes) else None

        wait_until(all_ready, timeout_s=self.timeout_s, what="the TPU nodes Ready", component=kwok)

        def untainted() -> bool | None:
            # a new node is tainted not-ready (TaintNodesByCondition) until the node lifecycle
            # controller sees it Ready
            items = self.api.get("/api/v1/nodes")["items"]
            tainted = [
                n["metadata"]["name"]
                for n in items
                if any(
                    t.get("key", "").startswith("node.kubernetes.io/")
                    for t in n["spec"].get("taints") or []
                )
            ]
            return None if tainted else True

        wait_until(
            untainted,
            timeout_s=self.timeout_s,
            what="the TPU nodes' not-ready taints removed",
            component=self.components["kube-controller-manager"],
        )

    def _start_kueue(self) -> None:
        if not (self.bin_dir / KUEUE.binary).is_file():
            reason = self.bin_dir / "KUEUE_FAILED"
            why = reason.read_text()[-2000:] if reason.is_file() else "not built"
            raise BinariesMissing(f"Kueue's controller is not in {self.bin_dir}: {why}")
        self._install_controller(KUEUE, self.kueue_webhook_port)
        self._kueue_metrics_certs()
        self._start_controller(KUEUE, self.kueue_webhook_port, self.kueue_health_port)

    def _kueue_metrics_certs(self) -> None:
        """Kueue v0.17, without its internal cert management, reads its metrics server's
        certificate from a fixed path (KUEUE_METRICS_CERTS) and exits when it is missing, even
        with metrics off. Put the harness's webhook certificate there when nothing is (removed
        again by `stop`); where that cannot be written, BinariesMissing says so."""
        target = KUEUE_METRICS_CERTS
        if (target / "tls.crt").is_file():
            return
        try:
            target.mkdir(parents=True, exist_ok=True)
            for name in ("tls.crt", "tls.key"):
                shutil.copyfile(self.pki.webhook_dir / name, target / name)
                (target / name).chmod(0o600)
        except OSError as exc:
            raise BinariesMissing(
                f"Kueue's controller needs a certificate at {target} (a fixed path in Kueue "
                f"v0.17 when its internal cert management is off) and it cannot be written: {exc}"
            ) from exc
        self._created_kueue_certs = True

    # -- for tests: pods

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?{urllib.parse.urlencode({'labelSelector': selector})}" if selector else ""
        items: list[dict[str, Any]] = self.api.get(f"/api/v1/namespaces/{namespace}/pods{query}")[
            "items"
        ]
        return items

    def end_pod(self, namespace: str, name: str, exit_code: int) -> None:
        """Make kwok end the running pod with `exit_code` (annotation `EXIT_CODE_ANNOTATION`)."""
        self._annotate_pod(namespace, name, {EXIT_CODE_ANNOTATION: str(exit_code)})

    def disrupt_pod(
        self,
        namespace: str,
        name: str,
        reason: str = "PreemptionByScheduler",
        exit_code: int | None = None,
    ) -> None:
        """Make kwok fail the running pod as disrupted: the DisruptionTarget condition with
        `reason`, the container ended with `exit_code` (None: 143, SIGTERM)."""
        annotations = {DISRUPTION_ANNOTATION: reason}
        if exit_code is not None:
            annotations[EXIT_CODE_ANNOTATION] = str(exit_code)
        self._annotate_pod(namespace, name, annotations)

    def _annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.api.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
        )

    def wait_for(self, check: Callable[[], T | None], *, what: str, timeout_s: float = 60.0) -> T:
        """`wait_until` with the control plane's logs in the error when it times out."""
        try:
            return wait_until(check, timeout_s=timeout_s, what=what, interval_s=0.25)
        except ControlPlaneError as exc:
            tails = "\n".join(
                f"--- {c.name}: {c.log}\n{c.tail(8)}" for c in self.components.values()
            )
            raise ControlPlaneError(f"{exc}\n{tails}") from None
