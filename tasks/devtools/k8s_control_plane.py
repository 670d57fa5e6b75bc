"""A real Kubernetes control plane on 127.0.0.1 for tests and for a person: etcd, kube-apiserver,
kube-controller-manager (the Job, garbage-collector, service-account and namespace
controllers), kube-scheduler, the JobSet controller with its webhooks, kwok simulating TPU v5p
hosts, and optionally Kueue's controller. The binaries are built from the Go modules under
``tests/k8s/controlplane/`` (``make k8s-bin``; docs/k8s-control-plane.md).

    python -m tasks.devtools.k8s_control_plane [--jobset v0.10.1] [--kueue] [--build]

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

import argparse
import base64
import contextlib
import copy
import datetime
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tasks.jobs.processes import Server, free_port, stop_processes

ROOT = Path(__file__).resolve().parents[2]
CONTROLPLANE_DIR = ROOT / "tests" / "k8s" / "controlplane"
BUILD_SCRIPT = CONTROLPLANE_DIR / "build.sh"
SHARED_BIN = ROOT.parent / "shared" / "k8s-bin"
CACHE_BIN = ROOT / ".cache" / "k8s-bin"
BIN_ENV = "RCPFLOW_K8S_BIN"  # a folder of binaries to use instead (what build.sh makes)

KUBE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
JOBSET_VERSIONS = ("v0.10.1", "v0.12.0")
# Only its config/components (CRD) is copied, for tests of the version gate: older than v0.10.
OLDER_JOBSET_CRD = "v0.9.1"
OLDEST_JOBSET = JOBSET_VERSIONS[0]
NEWEST_JOBSET = JOBSET_VERSIONS[-1]

EXIT_CODE_ANNOTATION = "rcpflow.test/exit-code"
DISRUPTION_ANNOTATION = "rcpflow.test/disruption"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
TPU_RESOURCE = "google.com/tpu"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
JOBSET_NAMESPACE = "jobset-system"
JOBSET_SERVICE_ACCOUNT = "jobset-controller-manager"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_SERVICE_ACCOUNT = "kueue-controller-manager"
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.64.0.0/14"

START_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 25

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component did not build, start or answer; the message names it (and its log tail)."""


class BinariesMissing(ControlPlaneError):
    """No built control plane for these pins; the message says where it was looked for and
    the command that builds it."""


# --------------------------------------------------------------------------- the binaries


def pins_hash() -> str:
    """The hash build.sh names its output folder by (its pins: go.mod/go.sum/main.go, itself)."""
    try:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--hash"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise ControlPlaneError(f"{BUILD_SCRIPT} --hash failed: {exc}") from exc
    if len(out) != 16:
        raise ControlPlaneError(f"{BUILD_SCRIPT} --hash printed {out!r}, not a 16-digit hash")
    return out


def candidate_dirs(hash_: str | None = None) -> list[Path]:
    """Where binaries are looked for, in order: $RCPFLOW_K8S_BIN, ../shared/k8s-bin/<hash>,
    .cache/k8s-bin/<hash>."""
    found = [Path(os.environ[BIN_ENV])] if os.environ.get(BIN_ENV) else []
    h = hash_ or pins_hash()
    return [*found, SHARED_BIN / h, CACHE_BIN / h]


def find_binaries(hash_: str | None = None) -> Path | None:
    """The first complete folder of `candidate_dirs`, or None."""
    for folder in candidate_dirs(hash_):
        if (folder / "COMPLETE").is_file() and all((folder / b).is_file() for b in KUBE_BINARIES):
            return folder
    return None


def build_binaries(out_root: Path | None = None) -> Path:
    """Run build.sh (tens of minutes from a cold Go cache; its progress on stderr) and return
    the folder it built."""
    argv = ["bash", str(BUILD_SCRIPT)]
    if out_root is not None:
        argv += ["--out", str(out_root)]
    try:
        done = subprocess.run(argv, check=False, stdout=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ControlPlaneError(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
    if done.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed (exit {done.returncode}); see its stderr")
    return Path(done.stdout.strip().splitlines()[-1])


def binaries(*, build: bool = False) -> Path:
    """The binaries folder: found (`find_binaries`), else built when `build` and Go is there,
    else `BinariesMissing` saying where they were looked for and how to build them."""
    hash_ = pins_hash()
    found = find_binaries(hash_)
    if found is not None:
        return found
    looked = ", ".join(str(p) for p in candidate_dirs(hash_))
    go = shutil.which("go") or next(
        (g for g in ("/usr/local/go/bin/go",) if Path(g).is_file()), None
    )
    if build and go is not None:
        return build_binaries()
    why = "no Go toolchain" if go is None else "not built"
    raise BinariesMissing(
        f"no Kubernetes control-plane binaries for pins {hash_} ({why}; looked in {looked}); "
        "build them with `make k8s-bin` (tests/k8s/controlplane/build.sh; about an hour from "
        "cold Go caches on 2 busy cores, 9 GB of caches) or put a build in "
        f"{SHARED_BIN}/{hash_} (build.sh --out {SHARED_BIN}); docs/k8s-control-plane.md"
    )


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class _Pki:
    ca_crt: Path
    ca_key: Path
    apiserver_crt: Path
    apiserver_key: Path
    admin_crt: Path
    admin_key: Path
    webhook_dir: Path  # tls.crt / tls.key for 127.0.0.1 (controller-runtime's names)
    sa_key: Path
    sa_pub: Path


def _make_pki(folder: Path) -> _Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=7))

    def key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    def write(name: str, data: bytes) -> Path:
        path = folder / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rcpflow-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        cn: str,
        orgs: Sequence[str],
        *,
        server: bool,
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
    ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    api_crt, api_key = leaf(
        "kube-apiserver",
        (),
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", "10.0.0.1"),
    )
    admin_crt, admin_key = leaf("rcpflow-admin", ("system:masters",), server=False)
    hook_crt, hook_key = leaf("webhooks", (), server=True, dns=("localhost",), ips=("127.0.0.1",))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    webhook_dir = folder / "webhook"
    webhook_dir.mkdir(exist_ok=True)
    (webhook_dir / "tls.crt").write_bytes(hook_crt)
    (webhook_dir / "tls.key").write_bytes(hook_key)
    return _Pki(
        ca_crt=write("ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
        ca_key=write("ca.key", key_pem(ca_key)),
        apiserver_crt=write("apiserver.crt", api_crt),
        apiserver_key=write("apiserver.key", api_key),
        admin_crt=write("admin.crt", admin_crt),
        admin_key=write("admin.key", admin_key),
        webhook_dir=webhook_dir,
        sa_key=write("sa.key", key_pem(sa)),
        sa_pub=write(
            "sa.pub",
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        ),
    )


# --------------------------------------------------------------------------- processes


class Component:
    """One process of the control plane: started in its own session with its output in
    ``<logs>/<name>.log``, stopped by its PID."""

    def __init__(
        self, name: str, argv: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log_dir / f"{name}.log"
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            log.write(f"--- start: {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    start_new_session=True,
                )
            except OSError as exc:
                raise ControlPlaneError(f"{self.name}: cannot start {self.argv[0]}: {exc}") from exc

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.process is not None:
            stop_processes([self.process], first=signal.SIGTERM, grace_s=grace_s, group=True)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ControlPlaneError:
        state = "running"
        if self.process is None:
            state = "not started"
        elif self.process.poll() is not None:
            state = f"exited with {self.process.returncode}"
        return ControlPlaneError(
            f"{self.name} ({state}): {what}; last lines of {self.log}:\n{self.tail()}"
        )


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    component: Component | None = None,
    interval_s: float = 0.2,
) -> T:
    """Poll `check` until it returns something not None; on timeout (or when `component` dies)
    ControlPlaneError naming `what`, the component and its log tail. Exceptions of `check`
    count as not yet (the last one is in the error)."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            result = check()
        except Exception as exc:  # any failure of a probe is "not yet"
            last = exc
            result = None
        if result is not None:
            return result
        if component is not None and component.process is not None and not component.running():
            raise component.failure(f"exited while waiting for {what} (last probe: {last})")
        if time.monotonic() >= deadline:
            message = f"{what}: not within {timeout_s:.0f}s (last probe: {last})"
            if component is not None:
                raise component.failure(message)
            raise ControlPlaneError(message)
        time.sleep(interval_s)


# --------------------------------------------------------------------------- the API


class ApiError(ControlPlaneError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Kind:
    group_version: str
    plural: str
    namespaced: bool


# What the harness itself applies (manifests of the controllers, nodes, its own objects).
KINDS: dict[str, Kind] = {
    "Namespace": Kind("v1", "namespaces", False),
    "ServiceAccount": Kind("v1", "serviceaccounts", True),
    "Secret": Kind("v1", "secrets", True),
    "ConfigMap": Kind("v1", "configmaps", True),
    "Service": Kind("v1", "services", True),
    "Node": Kind("v1", "nodes", False),
    "Pod": Kind("v1", "pods", True),
    "CustomResourceDefinition": Kind("apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "ClusterRole": Kind("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": Kind("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": Kind(
        "admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False
    ),
    "ValidatingWebhookConfiguration": Kind(
        "admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", False
    ),
    "APIService": Kind("apiregistration.k8s.io/v1", "apiservices", False),
    "PriorityClass": Kind("scheduling.k8s.io/v1", "priorityclasses", False),
    "JobSet": Kind("jobset.x-k8s.io/v1alpha2", "jobsets", True),
    "ResourceFlavor": Kind("kueue.x-k8s.io/v1beta2", "resourceflavors", False),
    "ClusterQueue": Kind("kueue.x-k8s.io/v1beta2", "clusterqueues", False),
    "LocalQueue": Kind("kueue.x-k8s.io/v1beta2", "localqueues", True),
}


class Api:
    """A small client of the API server (stdlib only): JSON in and out, the admin certificate."""

    def __init__(self, url: str, pki: _Pki, token: str | None = None) -> None:
        self.url = url
        self.context = ssl.create_default_context(cafile=str(pki.ca_crt))
        self.token = token
        if token is None:
            self.context.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, method, path, exc.read().decode(errors="replace")) from exc
        text = raw.decode()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    @staticmethod
    def path_of(obj: Mapping[str, Any], *, with_name: bool = True) -> str:
        kind = KINDS.get(str(obj.get("kind")))
        if kind is None:
            raise ControlPlaneError(f"the harness does not know the kind {obj.get('kind')!r}")
        metadata = obj.get("metadata") or {}
        base = "/api/v1" if kind.group_version == "v1" else f"/apis/{kind.group_version}"
        if kind.namespaced:
            base += f"/namespaces/{metadata.get('namespace') or 'default'}"
        base += f"/{kind.plural}"
        return f"{base}/{metadata['name']}" if with_name else base

    def apply(self, obj: Mapping[str, Any], manager: str = "rcpflow-harness") -> Any:
        """Server-side apply of `obj` (created or updated)."""
        query = urllib.parse.urlencode({"fieldManager": manager, "force": "true"})
        return self.request(
            "PATCH",
            f"{self.path_of(obj)}?{query}",
            obj,
            content_type="application/apply-patch+yaml",
        )

    def delete(self, obj: Mapping[str, Any]) -> None:
        with contextlib.suppress(ApiError):
            self.request("DELETE", self.path_of(obj))


# --------------------------------------------------------------------------- nodes and kwok


@dataclass(frozen=True)
class TpuNodePool:
    """A GKE TPU v5p node pool: `hosts` nodes of 4 chips, one slice of `topology`."""

    name: str
    topology: str
    hosts: int
    zone: str = "us-east5-a"


DEFAULT_POOLS = (
    TpuNodePool("tpu-v5p-2x2x1-a", "2x2x1", 1),
    TpuNodePool("tpu-v5p-2x2x1-b", "2x2x1", 1),
    TpuNodePool("tpu-v5p-2x2x2-a", "2x2x2", 2),
)


def tpu_nodes(pools: Iterable[TpuNodePool]) -> list[dict[str, Any]]:
    """Node objects as GKE registers TPU v5p hosts (machine type ct5p-hightpu-4t: 208 vCPUs,
    448 GiB, 4 chips), with the taint GKE puts on TPU pools; kwok manages them."""
    nodes = []
    for pool in pools:
        for i in range(pool.hosts):
            name = f"gke-{pool.name}-{i}"
            capacity = {
                "cpu": "208",
                "memory": "459276288Ki",
                "pods": "110",
                "ephemeral-storage": "100Gi",
                TPU_RESOURCE: "4",
            }
            allocatable = {**capacity, "cpu": "207", "memory": "440000000Ki"}
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "node.kubernetes.io/instance-type": "ct5p-hightpu-4t",
                            "topology.kubernetes.io/zone": pool.zone,
                            "cloud.google.com/machine-family": "ct5p",
                            NODEPOOL_LABEL: pool.name,
                            TPU_ACCELERATOR_LABEL: "tpu-v5p-slice",
                            TPU_TOPOLOGY_LABEL: pool.topology,
                            "type": "kwok",
                        },
                    },
                    "spec": {
                        "taints": [
                            {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
                        ]
                    },
                    "status": {"capacity": capacity, "allocatable": allocatable},
                }
            )
    return nodes


_NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}

_CONTAINERS_TERMINATED = """
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: {{ $code }}
      finishedAt: {{ $now | Quote }}
      reason: {{ $reason | Quote }}
      startedAt: {{ $now | Quote }}
{{ end }}
"""


def kwok_stages() -> list[dict[str, Any]]:
    """The kwok Stages: nodes initialised Ready; a scheduled pod Running; a Running pod
    terminated when annotated with `EXIT_CODE_ANNOTATION` (phase Succeeded for 0, Failed
    otherwise) or `DISRUPTION_ANNOTATION` (Failed, exit 143 unless an exit code is given too,
    with the DisruptionTarget condition); a deleted pod removed."""

    def stage(
        name: str, kind: str, selector: list[dict[str, Any]], nxt: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": name},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": kind},
                "selector": {"matchExpressions": selector},
                "next": nxt,
            },
        }

    node_init = """{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
- address: {{ NodeIP | Quote }}
  type: InternalIP
- address: {{ .metadata.name | Quote }}
  type: Hostname
allocatable:
{{ YAML .status.allocatable 1 }}
capacity:
{{ YAML .status.capacity 1 }}
nodeInfo:
  architecture: amd64
  bootID: ""
  containerRuntimeVersion: kwok
  kernelVersion: kwok
  kubeProxyVersion: kwok
  kubeletVersion: kwok
  machineID: ""
  operatingSystem: linux
  osImage: ""
  systemUUID: ""
phase: Running
"""
    pod_ready = """{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodScheduled
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ $hostIPs := NodeIPsWith .spec.nodeName }}
{{ with $hostIPs }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
{{ with $podIPs }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""
    exit_code = (
        """{{ $now := Now }}
{{ $code := index .metadata.annotations "@EXIT@" }}
{{ $reason := "Error" }}
{{ if eq $code "0" }}{{ $reason = "Completed" }}{{ end }}
"""
        + _CONTAINERS_TERMINATED
        + """{{ if eq $code "0" }}
phase: Succeeded
{{ else }}
phase: Failed
{{ end }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
  reason: PodCompleted
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: ContainersReady
  reason: PodCompleted
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodScheduled
"""
    )
    disruption = (
        """{{ $now := Now }}
{{ $code := or (index .metadata.annotations "@EXIT@") "143" }}
{{ $reason := "Error" }}
"""
        + _CONTAINERS_TERMINATED
        + """phase: Failed
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: DisruptionTarget
  reason: {{ index .metadata.annotations "@DISRUPTION@" | Quote }}
  message: "rcpflow test: the pod was disrupted"
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
  reason: PodFailed
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: ContainersReady
  reason: PodFailed
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodScheduled
"""
    )
    exit_code, disruption = (
        t.replace("@EXIT@", EXIT_CODE_ANNOTATION).replace("@DISRUPTION@", DISRUPTION_ANNOTATION)
        for t in (exit_code, disruption)
    )
    running = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
    return [
        stage(
            "node-initialize",
            "Node",
            [
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "NotIn",
                    "values": ["True"],
                }
            ],
            {"statusTemplate": node_init},
        ),
        stage(
            "pod-ready",
            "Pod",
            [
                _NOT_DELETED,
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "NotIn",
                    "values": ["True"],
                },
            ],
            {"statusTemplate": pod_ready},
        ),
        # Before the exit stage: a disrupted pod is a disruption whatever its exit code.
        stage(
            "pod-disrupted",
            "Pod",
            [
                _NOT_DELETED,
                running,
                {"key": f'.metadata.annotations["{DISRUPTION_ANNOTATION}"]', "operator": "Exists"},
            ],
            {"statusTemplate": disruption},
        ),
        stage(
            "pod-exit",
            "Pod",
            [
                _NOT_DELETED,
                running,
                {"key": f'.metadata.annotations["{EXIT_CODE_ANNOTATION}"]', "operator": "Exists"},
                {
                    "key": f'.metadata.annotations["{DISRUPTION_ANNOTATION}"]',
                    "operator": "DoesNotExist",
                },
            ],
            {"statusTemplate": exit_code},
        ),
        stage(
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"finalizers": {"empty": True}, "delete": True},
        ),
    ]


# --------------------------------------------------------------------------- manifests


def _load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(path.read_text(), Loader=loader) if isinstance(d, dict)]


def _json_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """RFC 6902 add / replace / remove (what the controllers' kustomize patches use)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        action = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if action == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif action == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif action == "remove":
                del parent[index]
            else:
                raise ControlPlaneError(f"unsupported JSON patch op {action!r}")
        elif action in ("add", "replace"):
            parent[last] = copy.deepcopy(op["value"])
        elif action == "remove":
            del parent[last]
        else:
            raise ControlPlaneError(f"unsupported JSON patch op {action!r}")
    return doc


def controller_manifests(config_dir: Path, prefix: str) -> dict[str, Any]:
    """The CRDs, the manager ClusterRole's rules and the webhook configurations of a
    kubebuilder-laid-out controller's ``config/components`` (JobSet, Kueue), with the
    kustomize patches of the webhooks applied and names given `prefix` as its kustomization
    does."""
    if not config_dir.is_dir():
        raise ControlPlaneError(f"{config_dir} is missing (build.sh copies it beside the binary)")
    crds = []
    for path in sorted((config_dir / "crd" / "bases").glob("*.yaml")):
        crds += [
            d for d in _load_yaml_documents(path) if d.get("kind") == "CustomResourceDefinition"
        ]
    rules: list[Any] = []
    role = config_dir / "rbac" / "role.yaml"
    for doc in _load_yaml_documents(role):
        if doc.get("kind") == "ClusterRole":
            rules += doc.get("rules") or []
    # Roles in the controller's own namespace (Kueue's secrets, leader election), as the RBAC
    # kustomization lists them.
    namespaced_rules: list[Any] = []
    rbac = _load_yaml_documents(config_dir / "rbac" / "kustomization.yaml")
    for resource in (rbac[0].get("resources") or []) if rbac else []:
        path = config_dir / "rbac" / str(resource)
        if path.is_file():
            for doc in _load_yaml_documents(path):
                if doc.get("kind") == "Role":
                    namespaced_rules += doc.get("rules") or []
    webhooks: list[dict[str, Any]] = []
    manifests = config_dir / "webhook" / "manifests.yaml"
    if manifests.is_file():
        docs = _load_yaml_documents(manifests)
        kustomization = _load_yaml_documents(config_dir / "webhook" / "kustomization.yaml")
        for entry in (kustomization[0].get("patches") or []) if kustomization else []:
            target = entry.get("target") or {}
            patch_path = config_dir / "webhook" / str(entry.get("path"))
            if not patch_path.is_file():
                continue
            import yaml

            ops = yaml.safe_load(patch_path.read_text())
            if not isinstance(ops, list):
                continue  # a strategic-merge patch: not needed here
            docs = [
                _json_patch(d, ops)
                if d.get("kind") == target.get("kind")
                and d["metadata"]["name"] == target.get("name")
                else d
                for d in docs
            ]
        for doc in docs:
            doc = copy.deepcopy(doc)
            doc["metadata"]["name"] = prefix + doc["metadata"]["name"]
            webhooks.append(doc)
    return {
        "crds": crds,
        "rules": rules,
        "namespaced_rules": namespaced_rules,
        "webhooks": webhooks,
    }


def local_webhooks(
    webhook_configs: Sequence[Mapping[str, Any]], port: int, ca_pem: bytes
) -> list[dict[str, Any]]:
    """The webhook configurations with every service reference replaced by the controller's
    address on 127.0.0.1 and our CA."""
    out: list[dict[str, Any]] = []
    ca = base64.b64encode(ca_pem).decode()
    for original in webhook_configs:
        config = copy.deepcopy(dict(original))
        for hook in config.get("webhooks") or []:
            service = hook["clientConfig"].get("service") or {}
            path = service.get("path", "/")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            hook.setdefault("timeoutSeconds", 10)
        out.append(config)
    return out


# --------------------------------------------------------------------------- the control plane


@dataclass
class ControlPlane(Server):
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
        self._pki: _Pki | None = None
        self._created_kueue_certs = False
        self.admin_token = base64.urlsafe_b64encode(os.urandom(24)).decode()

    # -- paths and clients

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def root(self) -> Path:
        if self.workdir is None:
            raise ControlPlaneError("the control plane is not started")
        return self.workdir

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def api(self) -> Api:
        if self._api is None:
            raise ControlPlaneError("the control plane is not started")
        return self._api

    @property
    def pki(self) -> _Pki:
        if self._pki is None:
            raise ControlPlaneError("the control plane is not started")
        return self._pki

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
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="rcpflow-k8s-"))
            self._owns_workdir = True
        self.logs.mkdir(parents=True, exist_ok=True)
        self._pki = _make_pki(self.root / "pki")
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
        self._install_jobset()
        self._start_kube_controllers()
        self._start_jobset()
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
        if self._owns_workdir and self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

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

    def _install_jobset(self) -> None:
        api = self.api
        manifests = controller_manifests(
            self.bin_dir / f"jobset-{self.jobset_version}-config", prefix="jobset-"
        )
        for crd in manifests["crds"]:
            api.apply(crd)
        for crd in manifests["crds"]:
            self._wait_crd(crd["metadata"]["name"])
        self._service_account_objects(
            JOBSET_NAMESPACE,
            JOBSET_SERVICE_ACCOUNT,
            "jobset-manager-role",
            manifests["rules"],
            manifests["namespaced_rules"],
        )
        for config in local_webhooks(
            manifests["webhooks"], self.jobset_webhook_port, self.pki.ca_crt.read_bytes()
        ):
            api.apply(config)

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
        self.api.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": list(rules),
            }
        )
        self.api.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [dict(subject)],
            }
        )

    def _service_account_objects(
        self,
        namespace: str,
        account: str,
        role: str,
        rules: Sequence[Any],
        namespaced_rules: Sequence[Any] = (),
    ) -> None:
        api = self.api
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        api.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": namespace},
            }
        )
        self.grant(role, rules, {"kind": "ServiceAccount", "name": account, "namespace": namespace})
        if namespaced_rules:
            api.apply(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": role, "namespace": namespace},
                    "rules": list(namespaced_rules),
                }
            )
            api.apply(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": role, "namespace": namespace},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": role,
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
                    ],
                }
            )

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

    def _start_jobset(self) -> None:
        config = self.root / "jobset-config.json"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                    "kind": "Configuration",
                    "leaderElection": {"leaderElect": False},
                    "internalCertManagement": {"enable": False},
                    "webhook": {
                        "port": self.jobset_webhook_port,
                        "host": "127.0.0.1",
                        "certDir": str(self.pki.webhook_dir),
                    },
                    "metrics": {"bindAddress": "0"},
                    "health": {"healthProbeBindAddress": f"127.0.0.1:{self.jobset_health_port}"},
                }
            )
        )
        kubeconfig = self.service_account_kubeconfig(JOBSET_NAMESPACE, JOBSET_SERVICE_ACCOUNT)
        jobset = self._add(
            "jobset",
            [
                self.binary(f"jobset-{self.jobset_version}"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                "--zap-log-level=info",
                "--zap-devel=false",
            ],
            env={"POD_NAMESPACE": JOBSET_NAMESPACE},
        )
        self._wait_http_ready(jobset, self.jobset_health_port, "/readyz")

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
        if not (self.bin_dir / "kueue").is_file():
            reason = self.bin_dir / "KUEUE_FAILED"
            why = reason.read_text()[-2000:] if reason.is_file() else "not built"
            raise BinariesMissing(f"Kueue's controller is not in {self.bin_dir}: {why}")
        manifests = controller_manifests(self.bin_dir / "kueue-config", prefix="kueue-")
        for crd in manifests["crds"]:
            crd.get("spec", {}).pop("conversion", None)
            self.api.apply(crd)
        for crd in manifests["crds"]:
            self._wait_crd(crd["metadata"]["name"])
        self._service_account_objects(
            KUEUE_NAMESPACE,
            KUEUE_SERVICE_ACCOUNT,
            "kueue-manager-role",
            manifests["rules"],
            manifests["namespaced_rules"],
        )
        for config in local_webhooks(
            manifests["webhooks"], self.kueue_webhook_port, self.pki.ca_crt.read_bytes()
        ):
            self.api.apply(config)
        kueue_config = self.root / "kueue-config.json"
        kueue_config.write_text(
            json.dumps(
                {
                    "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                    "kind": "Configuration",
                    "namespace": KUEUE_NAMESPACE,
                    "leaderElection": {"leaderElect": False},
                    "internalCertManagement": {"enable": False},
                    "webhook": {
                        "port": self.kueue_webhook_port,
                        "host": "127.0.0.1",
                        "certDir": str(self.pki.webhook_dir),
                    },
                    "metrics": {"bindAddress": "0"},
                    "health": {"healthProbeBindAddress": f"127.0.0.1:{self.kueue_health_port}"},
                    "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
                    # its aggregated visibility API server is not installed here
                    "featureGates": {"VisibilityOnDemand": False},
                }
            )
        )
        self._kueue_metrics_certs()
        kubeconfig = self.service_account_kubeconfig(KUEUE_NAMESPACE, KUEUE_SERVICE_ACCOUNT)
        kueue = self._add(
            "kueue",
            [
                self.binary("kueue"),
                f"--config={kueue_config}",
                f"--kubeconfig={kubeconfig}",
                "--zap-log-level=info",
            ],
            env={"POD_NAMESPACE": KUEUE_NAMESPACE},
        )
        self._wait_http_ready(kueue, self.kueue_health_port, "/readyz")

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


# --------------------------------------------------------------------------- for a person


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tasks.devtools.k8s_control_plane",
        description="Start a local Kubernetes control plane with JobSet and TPU v5p nodes "
        "(kwok) until Ctrl-C.",
    )
    parser.add_argument("--jobset", default=NEWEST_JOBSET, choices=JOBSET_VERSIONS)
    parser.add_argument("--kueue", action="store_true", help="also start Kueue's controller")
    parser.add_argument(
        "--build", action="store_true", help="build the binaries when none are found (slow)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs)")
    args = parser.parse_args(argv)
    try:
        bin_dir = binaries(build=args.build)
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C is KeyboardInterrupt even where the shell started us with SIGINT ignored (`&`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    plane = ControlPlane(
        bin_dir, jobset_version=args.jobset, kueue=args.kueue, keep_workdir=args.keep
    )
    try:
        with plane:
            print(f"binaries: {bin_dir}")
            print(f"API server: {plane.url}")
            for name, pid in plane.pids().items():
                print(f"  {name}: pid {pid}, log {plane.logs / (name + '.log')}")
            print(f"kubeconfig: {plane.kubeconfig}")
            print(f"export KUBECONFIG={plane.kubeconfig}")
            print("Ctrl-C stops everything.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while not stop.wait(1.0):
                    dead = [c.name for c in plane.components.values() if not c.running()]
                    if dead:
                        print(f"error: {', '.join(dead)} exited; stopping", file=sys.stderr)
                        return 1
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # during the start: what was started is stopped already
        print("interrupted; stopped", file=sys.stderr)
        return 130
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
