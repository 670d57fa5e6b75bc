"""TPU v5p hosts as kwok simulates them: the Node objects GKE registers for a TPU node pool, and
kwok's stages (nodes Ready, a scheduled pod Running, a Running pod ended when a test annotates
it with an exit code or a disruption, a deleted pod removed)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

EXIT_CODE_ANNOTATION = "rcpflow.test/exit-code"
DISRUPTION_ANNOTATION = "rcpflow.test/disruption"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
TPU_RESOURCE = "google.com/tpu"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"


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


def _container_statuses(running: bool, state: str) -> str:
    """Every container of the pod in `state` (its lines under ``state:``), as of now."""
    flag = "true" if running else "false"
    return f"""containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: {flag}
  restartCount: 0
  started: {flag}
  state:
{state}{{{{ end }}}}
"""


_CONTAINERS_TERMINATED = "\n" + _container_statuses(
    False,
    """    terminated:
      exitCode: {{ $code }}
      finishedAt: {{ $now | Quote }}
      reason: {{ $reason | Quote }}
      startedAt: {{ $now | Quote }}
""",
)


def _condition(kind: str, status: bool, *extra: str) -> str:
    """One pod condition of a kwok status template, changed now; `extra`: its further lines
    (reason, message)."""
    lines = [
        "- lastTransitionTime: {{ $now | Quote }}",
        f'  status: "{status}"',
        f"  type: {kind}",
        *(f"  {line}" for line in extra),
    ]
    return "\n".join(lines) + "\n"


# Kept by a pod that has ended: it was initialised and scheduled.
_STILL_TRUE = _condition("Initialized", True) + _condition("PodScheduled", True)


def _ended(reason: str) -> str:
    """The conditions of a pod whose containers ended (`reason`: PodCompleted, PodFailed)."""
    not_ready = _condition("Ready", False, f"reason: {reason}")
    return not_ready + _condition("ContainersReady", False, f"reason: {reason}") + _STILL_TRUE


def _addresses(of: str) -> str:
    """The `of`IP and `of`IPs fields (host, pod) from the template variable $`of`IPs."""
    return (
        """{{ with $@IPs }}
@IP: {{ index . 0 | Quote }}
@IPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
"""
    ).replace("@", of)


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
    pod_ready = (
        "{{ $now := Now }}\nconditions:\n"
        + "".join(
            _condition(kind, True)
            for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        )
        + _container_statuses(True, "    running:\n      startedAt: {{ $now | Quote }}\n")
        + "{{ $hostIPs := NodeIPsWith .spec.nodeName }}\n"
        + _addresses("host")
        + "{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) "
        + '( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}\n'
        + _addresses("pod")
        + """phase: Running
startTime: {{ $now | Quote }}
"""
    )
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
"""
        + _ended("PodCompleted")
    )
    disruption = (
        """{{ $now := Now }}
{{ $code := or (index .metadata.annotations "@EXIT@") "143" }}
{{ $reason := "Error" }}
"""
        + _CONTAINERS_TERMINATED
        + "phase: Failed\nconditions:\n"
        + _condition(
            "DisruptionTarget",
            True,
            'reason: {{ index .metadata.annotations "@DISRUPTION@" | Quote }}',
            'message: "rcpflow test: the pod was disrupted"',
        )
        + _ended("PodFailed")
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
