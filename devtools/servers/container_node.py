"""A real Kubernetes node on this machine for the real control plane of `devtools.k8s`: Debian's
containerd (its CRI) and a kubelet built for the control plane's version
(``../shared/k8s-bin/node-v1.36.3/``), started by hand and stopped by their PIDs, everything
under one fresh folder.

``with KubeNode(plane, images=[archive]) as node:`` registers a Node shaped like a GKE TPU v5p
host (the labels the GKE renderer's nodeSelector reads, ``google.com/tpu`` advertised as an
extended resource, the TPU taint) whose pods are real containers of the images loaded from the
``docker save`` archives (``ctr -n k8s.io image import``; pods use them with
imagePullPolicy IfNotPresent: nothing is ever pulled).

What this machine needs (docs/containers.md): containerd's CRI with
``restrict_oom_score_adj = true`` (root here lacks CAP_SYS_RESOURCE), the kubelet with the
``cgroupfs`` driver and ``failCgroupV1: false`` (cgroup v1, no systemd), a local pause image
(`container_images.pause_image`), and a network plugin for pods outside the host network: a
few lines (`LOOPBACK_CNI`) that bring ``lo`` up in the pod's namespace and nothing else, so a pod
has only loopback. Host-network pods (the multi-host JobSets) share the machine's loopback.
The kubelet serves on ``127.0.0.1`` (HTTPS, anonymous requests allowed: the API server of the
harness presents no client certificate), so ``kubectl logs`` through the API server works.

Stopping: the kubelet, then every container and sandbox containerd still runs (``ctr``), then
containerd; processes left in the node's cgroups and shims of its socket are killed by PID,
mounts under its folder unmounted, its cgroups removed and the host folders containerd
creates (``/run/containerd``, ``/var/run/netns``) removed when empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.kwok_nodes import (
    NODEPOOL_LABEL,
    TPU_ACCELERATOR_LABEL,
    TPU_RESOURCE,
    TPU_TOPOLOGY_LABEL,
)
from devtools.k8s.processes import Component, WorkFolder, wait_until
from devtools.servers.container_images import CACHE, mounts_under, remove_empty_dirs
from tasks.jobs.processes import Server, free_port

REPO = Path(__file__).resolve().parents[2]
NODE_BIN = Path(
    os.environ.get("RCPFLOW_K8S_NODE_BIN", str(REPO.parent / "shared" / "k8s-bin" / "node-v1.36.3"))
)
K8S_NAMESPACE = "k8s.io"  # containerd's namespace of the CRI
START_TIMEOUT_S = 90.0
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/var/run/netns")
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # one DNS label (RFC 1123)
# A CNI plugin of a few lines: the pod's network namespace gets its loopback up and nothing
# else. containerd's CRI calls a plugin named "loopback" (for lo) and the configured network
# (for eth0), and reads the pod's address from the eth0 result: both are this script, and the
# result names lo's address under the interface name asked for.
LOOPBACK_CNI = """#!/bin/sh
case "$CNI_COMMAND" in
ADD)
  nsenter --net="$CNI_NETNS" ip link set lo up || exit 1
  printf '{"cniVersion":"0.4.0","interfaces":[{"name":"%s","sandbox":"%s"}],'\\
'"ips":[{"version":"4","address":"127.0.0.1/8","interface":0}],"dns":{}}' \\
    "$CNI_IFNAME" "$CNI_NETNS" ;;
DEL|CHECK) ;;
VERSION) echo '{"cniVersion":"0.4.0","supportedVersions":["0.3.0","0.3.1","0.4.0"]}' ;;
esac
"""


class NodeError(RuntimeError):
    """The node could not start or do what was asked; the message names the step and a log."""


def kubelet_binary() -> Path | None:
    """The kubelet of ../shared/k8s-bin/node-v1.36.3 (None where that folder is absent)."""
    path = NODE_BIN / "kubelet"
    return path if path.is_file() else None


def _run(argv: Sequence[str], what: str, timeout_s: float = 300) -> str:
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NodeError(f"{what}: {exc}") from None
    if proc.returncode != 0:
        raise NodeError(f"{what} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


@dataclass
class KubeNode(WorkFolder, Server):
    """One kubelet + containerd node of `plane` (see the module doc). `labels` are added to
    the TPU host's; `tpu_chips` is the ``google.com/tpu`` capacity."""

    plane: ControlPlane
    name: str = ""
    pool: str = "tpu-v5p-real-a"
    topology: str = "2x2x1"
    tpu_chips: int = 4
    images: Sequence[Path] = ()
    pause_image: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    address: str = "127.0.0.1"
    cluster_dns: str | None = None
    workdir: Path | None = None
    timeout_s: float = START_TIMEOUT_S
    components: dict[str, Component] = field(default_factory=dict)
    _owns_workdir: bool = False
    _created: list[Path] = field(default_factory=list)
    _netns_before: set[str] = field(default_factory=set)
    # containerd's root under the cache (None: always one of the node's own)
    cache: Path | None = CACHE
    _content_root: Path | None = None
    _lock_handle: IO[str] | None = None

    def __post_init__(self) -> None:
        self.name = self.name or f"gke-{self.pool}-{uuid.uuid4().hex[:6]}"
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        self.cgroup_parent = f"rcpflow-node-{uuid.uuid4().hex[:8]}"

    # -- paths

    def not_started(self) -> Exception:
        return NodeError("the node is not started")

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    def node_labels(self) -> dict[str, str]:
        return {
            "node.kubernetes.io/instance-type": "ct5p-hightpu-4t",
            "cloud.google.com/machine-family": "ct5p",
            NODEPOOL_LABEL: self.pool,
            TPU_ACCELERATOR_LABEL: "tpu-v5p-slice",
            TPU_TOPOLOGY_LABEL: self.topology,
            **self.labels,
        }

    # -- start and stop

    def start(self) -> None:
        kubelet = kubelet_binary()
        if kubelet is None:
            raise NodeError(f"no kubelet at {NODE_BIN / 'kubelet'}")
        # short: containerd's sockets live under it (108-byte socket paths)
        self.make_workdir("rcpn-", "/tmp")
        for path in (Path("/run/containerd"), NETNS_DIR):
            if not path.exists():
                self._created.append(path)
        self._netns_before = set(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else set()
        self._content_root = self._claim_content_root()
        self._start_containerd()
        self._import_images()
        self._start_kubelet(kubelet)

    def _claim_content_root(self) -> Path:
        """containerd's root (images, layers): the cached one when no other node uses it (its
        images survive to the next run: no import, no unpack), else one of this node's own."""
        if self.cache is not None:
            self.cache.mkdir(parents=True, exist_ok=True)
            handle = (self.cache / "containerd-root.lock").open("w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
            else:
                self._lock_handle = handle
                return self.cache / "containerd-root"
        return self.root / "containerd" / "root"

    def _import_images(self) -> None:
        """The archives' images into containerd's k8s.io namespace, unless there already;
        other rcpflow images in a cached root are removed (their layers with them)."""
        wanted: set[str] = set()
        present = set((self.ctr("images", "list", "--quiet") or "").split())
        for archive in self.images:
            tags = {_full_name(t) for t in archive_tags(archive)}
            wanted |= tags
            if not tags <= present:
                self.ctr("image", "import", str(archive), timeout_s=900)
        for name in present - wanted:
            if name.startswith("docker.io/library/rcpflow-"):
                self.ctr("images", "remove", name, check=False)

    def _start_containerd(self) -> None:
        cni_bin = self.root / "cni" / "bin"
        cni_conf = self.root / "cni" / "conf"
        cni_bin.mkdir(parents=True)
        cni_conf.mkdir(parents=True)
        plugin = cni_bin / "rcpflow-loopback"
        plugin.write_text(LOOPBACK_CNI)
        plugin.chmod(0o755)
        (cni_bin / "loopback").symlink_to(plugin.name)
        (cni_conf / "10-loopback.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "rcpflow-loopback",
                    "plugins": [{"type": "rcpflow-loopback"}],
                }
            )
        )
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = self.root / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{self._content_root}"
state = "{self.root / "containerd" / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root / "containerd" / "opt"}"
[{cri}]
  sandbox_image = "{self.pause_image}"
  restrict_oom_score_adj = true
  enable_cdi = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"
"""
        )
        containerd = self._add(
            "containerd", [shutil.which("containerd") or "containerd", f"--config={config}"]
        )
        wait_until(
            lambda: True if self.ctr("version", check=False) is not None else None,
            timeout_s=self.timeout_s,
            what="containerd answering",
            component=containerd,
        )

    def _make_cgroup_root(self) -> None:
        """The kubelet's cgroupRoot in every cgroup v1 hierarchy (it must exist); a new cpuset
        gets its parent's CPUs and memory nodes (a cpuset without them takes no process)."""
        for hierarchy in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else []:
            if hierarchy.is_symlink() or not (hierarchy / "cgroup.procs").exists():
                continue
            if hierarchy.name == "unified":
                continue
            top = hierarchy / self.cgroup_parent
            top.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / name).exists():
                    (top / name).write_text((hierarchy / name).read_text())

    def _start_kubelet(self, kubelet: Path) -> None:
        pki = self.plane.pki
        self._make_cgroup_root()
        resolv = self.root / "resolv.conf"
        resolv.write_text(
            f"nameserver {self.cluster_dns}\noptions ndots:5\n"
            if self.cluster_dns
            else "nameserver 127.0.0.1\n"
        )
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.address,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_parent}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki.ca_crt)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            "registerWithTaints": [
                {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
            ],
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(self.pod_logs),
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "serializeImagePulls": False,
            "localStorageCapacityIsolation": False,
        }
        if self.cluster_dns:
            config["clusterDNS"] = [self.cluster_dns]
        config_file = self.root / "kubelet-config.json"
        config_file.write_text(json.dumps(config, indent=1))
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.node_labels().items()))
        kubelet_proc = self._add(
            "kubelet",
            [
                str(kubelet),
                f"--config={config_file}",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--root-dir={self.root / 'kubelet'}",
                f"--cert-dir={self.root / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.address}",
                f"--node-labels={labels}",
                "--v=1",
            ],
        )

        def ready() -> bool | None:
            node = self.plane.api.get(f"/api/v1/nodes/{self.name}")
            conditions = (node.get("status") or {}).get("conditions") or []
            ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            return True if ok else None

        wait_until(
            ready, timeout_s=self.timeout_s, what=f"node {self.name} Ready", component=kubelet_proc
        )
        self.set_tpu_chips(self.tpu_chips)
        # The kubelet refuses a loopback node IP ("nodeIP can't be loopback address") and then
        # leaves the addresses empty: the API server would have no address to reach it (logs)
        # and host-network pods no IP. Its status updates keep what is set here (the setter that
        # failed changes nothing). No Hostname address: the API server would try it first.
        self.plane.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": {"addresses": [{"type": "InternalIP", "address": self.address}]}},
            content_type="application/merge-patch+json",
        )

        def untainted() -> bool | None:
            node = self.plane.api.get(f"/api/v1/nodes/{self.name}")
            taints = node["spec"].get("taints") or []
            return None if any(t["key"].startswith("node.kubernetes.io/") for t in taints) else True

        wait_until(
            untainted,
            timeout_s=self.timeout_s,
            what=f"node {self.name}'s not-ready taint removed",
            component=kubelet_proc,
        )

    def set_tpu_chips(self, chips: int) -> None:
        """Advertise `chips` of ``google.com/tpu`` (an extended resource: the node status's
        capacity, as a device plugin would) and wait until the kubelet has made them
        allocatable (the scheduler reads that)."""
        self.plane.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": {"capacity": {TPU_RESOURCE: str(chips)}}},
            content_type="application/merge-patch+json",
        )
        self.tpu_chips = chips

        def allocatable() -> bool | None:
            status = self.plane.api.get(f"/api/v1/nodes/{self.name}")["status"]
            return True if status.get("allocatable", {}).get(TPU_RESOURCE) == str(chips) else None

        wait_until(
            allocatable,
            timeout_s=self.timeout_s,
            what=f"{chips} {TPU_RESOURCE} allocatable on {self.name}",
            component=self.components.get("kubelet"),
        )

    def relabel(self, labels: Mapping[str, str]) -> None:
        self.plane.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}",
            {"metadata": {"labels": dict(labels)}},
            content_type="application/merge-patch+json",
        )

    def stop(self) -> None:
        try:
            if "kubelet" in self.components:
                self.components["kubelet"].stop(grace_s=15)
            if "containerd" in self.components and self.components["containerd"].running():
                self._remove_containers()
            if "containerd" in self.components:
                self.components["containerd"].stop(grace_s=15)
            self._kill_leftovers()
            with contextlib.suppress(Exception):
                self.plane.api.request("DELETE", f"/api/v1/nodes/{self.name}")
        finally:
            if self.workdir is not None:
                for point in mounts_under([self.workdir]):
                    subprocess.run(["umount", "-l", point], check=False, capture_output=True)
            # the network namespaces of sandboxes that were not torn down (bind mounts)
            for name in set(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else set():
                if name.startswith("cni-") and name not in self._netns_before:
                    subprocess.run(
                        ["umount", str(NETNS_DIR / name)], check=False, capture_output=True
                    )
                    with contextlib.suppress(OSError):
                        (NETNS_DIR / name).unlink()
            for path in self._created:
                remove_empty_dirs(path)
            self._created.clear()
            self.remove_workdir()
            if self._lock_handle is not None:
                self._lock_handle.close()
                self._lock_handle = None

    def _remove_containers(self) -> None:
        for _ in range(2):
            tasks = self.ctr("tasks", "list", "-q", check=False) or ""
            for task in tasks.split():
                self.ctr("tasks", "kill", "--all", "--signal=SIGKILL", task, check=False)
            time.sleep(0.5)
            for task in tasks.split():
                self.ctr("tasks", "delete", "--force", task, check=False)
            containers = self.ctr("containers", "list", "-q", check=False) or ""
            for container in containers.split():
                self.ctr("containers", "delete", container, check=False)

    def cgroup_dirs(self) -> list[Path]:
        """The node's cgroup folders (every hierarchy), deepest first."""
        found: list[Path] = []
        if not CGROUP_ROOT.is_dir():
            return found
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / self.cgroup_parent
            if top.is_dir() and not top.is_symlink():
                found.extend(p for p in top.rglob("*") if p.is_dir())
                found.append(top)
        return sorted(set(found), key=lambda p: len(p.parts), reverse=True)

    def _kill_leftovers(self) -> None:
        pids: set[int] = set()
        for folder in self.cgroup_dirs():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                    if b"containerd-shim" in cmdline and str(self.socket).encode() in cmdline:
                        pids.add(int(entry))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        for folder in self.cgroup_dirs():
            while time.monotonic() < deadline:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.2)

    # -- helpers

    def _add(self, name: str, argv: Sequence[str]) -> Component:
        component = Component(name, argv, self.logs)
        self.components[name] = component
        component.start()
        return component

    def ctr(self, *args: str, check: bool = True, timeout_s: float = 60) -> str | None:
        """``ctr -n k8s.io ARGS`` against the node's containerd (None: it failed, unchecked)."""
        argv = ["ctr", f"--address={self.socket}", f"--namespace={K8S_NAMESPACE}", *args]
        try:
            return _run(argv, f"ctr {' '.join(args)}", timeout_s)
        except NodeError:
            if check:
                raise
            return None

    def tail(self, name: str = "kubelet", lines: int = 30) -> str:
        component = self.components.get(name)
        return component.tail(lines) if component else "(not started)"


@dataclass
class ClusterDns(WorkFolder, Server):
    """Cluster DNS on a loopback address for the pods of `plane`: CoreDNS (its kubernetes
    plugin, ``cluster.local``) on ``address:53``, and the EndpointSlice controller (a
    kube-controller-manager of that one controller: the harness's runs without it) that gives
    CoreDNS the addresses of a headless Service's pods, e.g. the JobSet's
    ``<jobset>-slice-0-0.<jobset>`` of a multi-host training. Names outside the cluster are
    refused (no forwarding: nothing leaves the machine).

    The API server refuses EndpointSlice addresses in 127.0.0.0/8, so a host-network pod of
    this loopback node never gets its ``<hostname>.<subdomain>.<namespace>.svc.cluster.local``
    record from them: those names (a pod's hostname in its subdomain: four labels below
    ``svc.cluster.local``) are answered with `pod_address`, the one node's address, which is
    what the EndpointSlice would hold. Service names go to the kubernetes plugin as usual."""

    plane: ControlPlane
    address: str = ""
    pod_address: str = "127.0.0.1"
    workdir: Path | None = None
    timeout_s: float = START_TIMEOUT_S
    components: dict[str, Component] = field(default_factory=dict)
    _owns_workdir: bool = False

    def __post_init__(self) -> None:
        # 127.0.53.x: port 53 of 127.0.0.1 may be another resolver's
        self.address = self.address or f"127.0.53.{2 + int(uuid.uuid4().int % 250)}"

    def start(self) -> None:
        coredns = NODE_BIN / "coredns"
        if not coredns.is_file():
            raise NodeError(f"no CoreDNS at {coredns}")
        self.make_workdir("rcpflow-dns-")
        logs = self.logs
        health = free_port()
        corefile = self.root / "Corefile"
        corefile.write_text(
            f"""cluster.local:53 {{
    bind {self.address}
    health 127.0.0.1:{health}
    template IN A cluster.local {{
        match "^{_LABEL}[.]{_LABEL}[.]{_LABEL}[.]svc[.]cluster[.]local[.]$"
        answer "{{{{ .Name }}}} 5 IN A {self.pod_address}"
        fallthrough
    }}
    kubernetes cluster.local {{
        kubeconfig {self.plane.kubeconfig}
    }}
}}
.:53 {{
    bind {self.address}
    template ANY ANY {{
        rcode REFUSED
    }}
}}
"""
        )
        slices = Component(
            "endpointslice-controller",
            [
                self.plane.binary("kube-controller-manager"),
                f"--kubeconfig={self.plane.kubeconfig}",
                "--controllers=endpointslice-controller",
                "--leader-elect=false",
                "--secure-port=0",
            ],
            logs,
        )
        self.components[slices.name] = slices
        slices.start()
        dns = Component("coredns", [str(coredns), f"-conf={corefile}"], logs)
        self.components[dns.name] = dns
        dns.start()

        def healthy() -> bool | None:
            url = f"http://127.0.0.1:{health}/health"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return True if resp.status == 200 else None

        wait_until(healthy, timeout_s=self.timeout_s, what="CoreDNS /health", component=dns)
        time.sleep(0.5)
        if not slices.running():
            raise slices.failure("exited at start")

    def stop(self) -> None:
        for component in reversed(list(self.components.values())):
            component.stop()
        self.remove_workdir()


def archive_tags(archive: Path) -> list[str]:
    """The image names a ``docker save`` archive holds (its manifest.json's RepoTags)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise NodeError(f"{archive}: no manifest.json (not a docker save archive)")
        return [tag for image in json.load(member) for tag in image.get("RepoTags") or []]


def _full_name(tag: str) -> str:
    """A docker tag as containerd names it (``rcpflow-tpu:x`` -> docker.io/library/...)."""
    first = tag.split("/", 1)[0]
    if "/" not in tag:
        return f"docker.io/library/{tag}"
    if "." in first or ":" in first or first == "localhost":
        return tag
    return f"docker.io/{tag}"
