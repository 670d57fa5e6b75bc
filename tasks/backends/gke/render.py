"""Render the JobSet (jobset.x-k8s.io/v1alpha2) that runs one rcpflow job on TPU slices.

One replicated job ``slice`` with one child Job per TPU slice; each Job is Indexed with one pod
per TPU host, pinned to the slice shape by the GKE TPU node labels and asking for its chips as
``google.com/tpu``. The container command is the job's argument list: no shell.

Failure policy (the exit-code contract of docs/exit-codes.md, as JobSet and xpk practice have
it): each child Job fails on its first pod failure (backoffLimit 0) and its podFailurePolicy
says why; the JobSet's failurePolicy then restarts everything without counting for a
disruption (the pod condition DisruptionTarget: preemption, eviction, maintenance) or a SIGTERM
exit (143), fails at once for the deterministic user errors (`GkeSettings.fail_exit_codes`),
and restarts counting against maxRestarts for anything else (exit 1 and every other code, an
OOM kill). The JobSet rules tell the pod rules apart by ``onJobFailureMessagePatterns``
(JobSet v0.10; `tasks.backends.gke.crd` refuses an older cluster).
A multi-host slice's pods share the host network (TPU ICI/DCN setup as GKE documents it); the
RCPFLOW_COORDINATOR_ADDRESS / _NUM_PROCESSES / _PROCESS_ID variables are what
`tpu_jobs.rcp.distributed` reads to form a `jax.distributed` system. Training is one system
whose process 0 is found through ``spec.coordinator`` (the JobSet controller writes its DNS
name into each pod's ``jobset.sigs.k8s.io/coordinator`` annotation); an evaluation worker (one
slice) is one system of its own, whose process 0 is pod 0 of its Job, by its JobSet hostname.

Every ``$`` of a command item and of a plain env value is doubled: Kubernetes expands
``$(VAR)`` there and turns ``$$`` into ``$``, so each item reaches the process as it was
given, whatever it contains. Secrets are references (``secretKeyRef``), never values.

Names are deterministic per (DAG, run, job), so a retried task finds the JobSet it created
before; the spec hash annotation tells whether that JobSet is the same job. The
``rcpflow.dev/run`` label finds everything of one DAG run. Pure standard library.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tasks.backend_api.exit_policy import codes_deciding
from tasks.backends.gke.settings import GkeSettings, TpuJobShape
from tasks.jobs.command import ROLES, Role
from tasks.jobs.templates import SecretKeyRef

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
JOBSET_KIND = "JobSet"
JOBSET_PLURAL = "jobsets"

REPLICATED_JOB = "slice"
CONTAINER = "job"
# Leaves room for the child names JobSet derives from it (see _check_child_names).
# JobSet (v0.10+) labels every pod of a training with a coordinator
# '<name>-slice-0-0.<name>' (jobset.sigs.k8s.io/coordinator), a label value of <= 63 characters:
# 2 x 26 + 11 = 63. Found by the real JobSet webhook (tests/tasks/backends/gke/real/).
MAX_NAME_LENGTH = 26

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_DAG = "rcpflow.dev/dag"
LABEL_RUN = "rcpflow.dev/run"
LABEL_JOB = "rcpflow.dev/job"
ANNOTATION_DAG_ID = "rcpflow.dev/dag-id"
ANNOTATION_RUN_ID = "rcpflow.dev/run-id"
ANNOTATION_SPEC_HASH = "rcpflow.dev/spec-hash"
# One slice per node pool: the pods of a multi-host slice must share its ICI network.
ANNOTATION_EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
# Set by the JobSet controller (v0.6+) on every pod when spec.coordinator is set: the
# coordinator pod's stable DNS name.
JOBSET_COORDINATOR_ANNOTATION = "jobset.sigs.k8s.io/coordinator"
# Set by the JobSet controller on every pod: which child Job (= which slice) it belongs to.
JOBSET_JOB_INDEX_ANNOTATION = "jobset.sigs.k8s.io/job-index"
# Also on every pod: the JobSet's uid and how often it was restarted. Together they name one
# launch of the job, shared by all its pods and new on a restart or a re-created JobSet, so the
# sharded evaluator can tell this launch's shard files from an earlier one's.
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"

# Kueue: the LocalQueue a JobSet is submitted to (Kueue suspends it until admitted).
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Set by the Job controller on the pods of an Indexed Job: the pod's index in its Job.
JOB_COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# Set by the JobSet controller on its pods; selects every pod of one JobSet.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The multi-host environment (read by tpu_jobs.distributed) and jax.distributed's usual port.
COORDINATOR_ADDRESS_ENV = "RCPFLOW_COORDINATOR_ADDRESS"
COORDINATOR_HOST_ENV = "RCPFLOW_COORDINATOR_HOST"
NUM_PROCESSES_ENV = "RCPFLOW_NUM_PROCESSES"
PROCESS_ID_ENV = "RCPFLOW_PROCESS_ID"
COORDINATOR_PORT = 8476
# The Job controller's failure message for a podFailurePolicy FailJob rule names the rule's
# index ("... matching FailJob rule at index 0"); the JobSet rules tell them apart by it.
POD_RULE_DISRUPTION = 0
POD_RULE_SIGTERM = 1
POD_RULE_APPLICATION_EXIT = 2
JOB_FAILURE_POD_FAILURE_POLICY = "PodFailurePolicy"

_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # matched whole (fullmatch)


class JobSetConflictError(RuntimeError):
    """A JobSet with the wanted name exists but was rendered from a different spec."""


def jobset_name(dag_id: str, run_id: str, job: str) -> str:
    """DNS-1035 name (<= MAX_NAME_LENGTH chars) for `job` (e.g. ``train``, ``eval-18``) of one
    DAG run: readable prefix from dag and job, then a hash of all three, so it is unique per
    (dag_id, run_id, job) and the same on every call."""
    for what, value in (("dag_id", dag_id), ("run_id", run_id), ("job", job)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"jobset_name: {what} must be a non-empty string, got {value!r}")
    digest = _digest(dag_id, run_id, job)[:8]
    dag = _slug(dag_id)[:8].strip("-")
    if dag and not dag[0].isalpha():
        dag = "r" + dag[:7].strip("-")
    parts = [p for p in (dag, _slug(job)[:8].strip("-")) if p]
    name = "-".join([*parts, digest])
    if not name[0].isalpha():
        name = "r" + name
    return name


def run_label(dag_id: str, run_id: str) -> str:
    """Value of the ``rcpflow.dev/run`` label: exact per DAG run (run ids do not fit a label)."""
    return _digest(dag_id, run_id)[:16]


def render_jobset(
    settings: GkeSettings,
    *,
    role: Role,
    dag_id: str,
    run_id: str,
    job: str,
    command: Sequence[str],
    image: str | None = None,
    env: Mapping[str, str] | None = None,
    secret_env: Mapping[str, SecretKeyRef] | None = None,
) -> dict[str, Any]:
    """The JobSet object that runs `command` (an argument list) as `role`, on the TPU shape
    `settings` gives that role, named by `jobset_name`; in `image` (None: the settings' image)
    with `env` (literal values) and `secret_env` (Secret references) added to the variables
    rcpflow sets.

    The items are passed to the process as they are (no shell, and no Kubernetes ``$(VAR)``
    expansion: every ``$`` is escaped). Raises ValueError naming the bad item, or when
    JobSet's derived pod names would not fit. The object carries env values: never log it or
    return it as an XCom (`jobset_ref` is what may be shown).
    """
    if role not in ROLES:
        raise ValueError(f"render_jobset: role must be one of {ROLES}, got {role!r}")
    if isinstance(command, str) or not isinstance(command, Sequence) or not command:
        raise ValueError("render_jobset: command must be a non-empty list of strings")
    for i, arg in enumerate(command):
        if not isinstance(arg, str):
            raise ValueError(
                f"render_jobset: command[{i}] must be a string, got {type(arg).__name__} {arg!r}"
            )
        if "\x00" in arg:
            raise ValueError(f"render_jobset: command[{i}] contains a NUL character")
    shape = settings.shape(role)
    name = jobset_name(dag_id, run_id, job)
    _check_child_names(name, shape)

    labels = {
        LABEL_MANAGED_BY: "rcpflow",
        LABEL_COMPONENT: role,
        LABEL_DAG: _label_value(dag_id),
        LABEL_RUN: run_label(dag_id, run_id),
        LABEL_JOB: _label_value(job),
    }
    container = {
        "name": CONTAINER,
        "image": settings.image if image is None else image,
        # Kubernetes expands $(VAR) in command args; a Param value can never read the pod's
        # environment.
        "command": [kubernetes_literal(a) for a in command],
        "env": [
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "RCPFLOW_NUM_SLICES", "value": str(shape.slices)},
            {
                "name": "RCPFLOW_SLICE_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{JOBSET_JOB_INDEX_ANNOTATION}']"
                    }
                },
            },
            {
                "name": "RCPFLOW_JOBSET_UID",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_UID_LABEL}']"}},
            },
            {
                "name": "RCPFLOW_RESTART_ATTEMPT",
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_RESTART_ATTEMPT_LABEL}']"}
                },
            },
            # Kubernetes expands $(VAR) from the variables defined above it.
            {
                "name": "RCPFLOW_ATTEMPT_ID",
                "value": "$(RCPFLOW_JOBSET_UID)/$(RCPFLOW_RESTART_ATTEMPT)",
            },
            *({"name": k, "value": kubernetes_literal(v)} for k, v in sorted((env or {}).items())),
            *(
                {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
                for k, ref in sorted((secret_env or {}).items())
            ),
            *(_distributed_env(shape, role, name) if shape.multi_host else []),
        ],
        # Requests make the pod Burstable rather than BestEffort (evicted first under node
        # pressure); no CPU or memory limit, so the job is never throttled or OOM-killed below
        # what the host has.
        "resources": {
            "requests": {"cpu": shape.cpu_request, "memory": shape.memory_request},
            "limits": {"google.com/tpu": shape.chips_per_host},
        },
    }
    if settings.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in settings.volume_mounts]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": settings.service_account,
        # Restarts are the JobSet's failurePolicy (all slices together), never per pod.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": shape.termination_grace_period_s,
        "nodeSelector": {
            **settings.node_selector,
            "cloud.google.com/gke-tpu-accelerator": shape.accelerator,
            "cloud.google.com/gke-tpu-topology": shape.topology,
        },
        "containers": [container],
    }
    if settings.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in settings.tolerations]
    if settings.volumes:
        pod_spec["volumes"] = json.loads(json.dumps(settings.volumes))
    if shape.multi_host:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if settings.priority_class is not None:
        pod_spec["priorityClassName"] = settings.priority_class
    job_spec: dict[str, Any] = {
        "parallelism": shape.hosts_per_slice,
        "completions": shape.hosts_per_slice,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": _pod_failure_policy(settings),
        "template": {
            "metadata": {
                "labels": dict(labels),
                **(
                    {"annotations": dict(settings.pod_annotations)}
                    if settings.pod_annotations
                    else {}
                ),
            },
            "spec": pod_spec,
        },
    }
    spec: dict[str, Any] = {
        "failurePolicy": _failure_policy(settings, shape),
        "ttlSecondsAfterFinished": settings.ttl_after_finished_s,
        "replicatedJobs": [
            {
                "name": REPLICATED_JOB,
                "replicas": shape.slices,
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": job_spec,
                },
            }
        ],
    }
    if settings.queue_name is not None:
        # Kueue admits it by unsuspending; created running, a JobSet whose namespace Kueue
        # does not manage (or with Kueue's JobSet integration off) would run unqueued.
        spec["suspend"] = True
    if shape.multi_host:
        # Pods resolve each other as <name>-slice-<job>-<index>.<name> (JobSet's headless
        # service), also before they are ready: process 0 must be reachable while it waits.
        spec["network"] = {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    if shape.multi_host and role == "train":
        # One slice (settings refuse multislice): process 0 is pod 0 of Job 0.
        spec["coordinator"] = {"replicatedJob": REPLICATED_JOB, "jobIndex": 0, "podIndex": 0}
    annotations = {ANNOTATION_DAG_ID: dag_id, ANNOTATION_RUN_ID: run_id}
    if shape.multi_host:
        annotations[ANNOTATION_EXCLUSIVE_TOPOLOGY] = GKE_NODEPOOL_LABEL
    jobset_labels = dict(labels)
    if settings.queue_name is not None:
        jobset_labels[LABEL_KUEUE_QUEUE] = settings.queue_name
    return with_spec_hash(
        {
            "apiVersion": JOBSET_API_VERSION,
            "kind": JOBSET_KIND,
            "metadata": {
                "name": name,
                "namespace": settings.namespace,
                "labels": jobset_labels,
                "annotations": annotations,
            },
            "spec": spec,
        }
    )


def _pod_failure_policy(settings: GkeSettings) -> dict[str, Any]:
    # Rule order matters: the JobSet rules below match the index in the Job's failure message,
    # and the Job controller applies the first rule that matches (a disrupted pod is a
    # disruption whatever its exit code).
    uncounted = codes_deciding("restart_uncounted", settings.fail_exit_codes)
    fail_now = codes_deciding("fail_now", settings.fail_exit_codes)
    rules: list[dict[str, Any]] = [
        {
            "action": "FailJob",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": uncounted},
        },
    ]
    if fail_now:
        rules.append(
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": fail_now,
                },
            }
        )
    return {"rules": rules}


def _failure_policy(settings: GkeSettings, shape: TpuJobShape) -> dict[str, Any]:
    rules: list[dict[str, Any]] = [
        {
            "name": "disruption",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": [JOB_FAILURE_POD_FAILURE_POLICY],
            "onJobFailureMessagePatterns": [
                _rule_pattern(POD_RULE_DISRUPTION),
                _rule_pattern(POD_RULE_SIGTERM),
            ],
        }
    ]
    if settings.fail_exit_codes:
        rules.append(
            {
                "name": "userError",
                "action": "FailJobSet",
                "onJobFailureReasons": [JOB_FAILURE_POD_FAILURE_POLICY],
                "onJobFailureMessagePatterns": [_rule_pattern(POD_RULE_APPLICATION_EXIT)],
            }
        )
    # No rule matched (BackoffLimitExceeded: exit 1, any other code, an OOM kill): the
    # JobSet's default, RestartJobSet, counted.
    return {"maxRestarts": shape.max_restarts, "rules": rules}


def _rule_pattern(index: int) -> str:
    # The index ends the message (kubernetes pkg/controller/job/pod_failure_policy.go); "$"
    # keeps index 1 from matching a rule 10.
    return f"matching FailJob rule at index {index}$"


def _distributed_env(shape: TpuJobShape, role: Role, name: str) -> list[dict[str, Any]]:
    if role == "train":
        # One slice (settings refuse multislice): process 0 is pod 0 of Job 0 (spec.coordinator).
        annotation = f"metadata.annotations['{JOBSET_COORDINATOR_ANNOTATION}']"
        host: dict[str, Any] = {
            "name": COORDINATOR_HOST_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": annotation}},
        }
    else:
        # One system per worker (slice): process 0 is pod 0 of this pod's own Job, by the
        # hostname JobSet gives it (<jobset>-<replicated job>-<job index>-<pod index>, in the
        # subdomain <jobset>); RCPFLOW_SLICE_INDEX is defined above.
        host = {
            "name": COORDINATOR_HOST_ENV,
            "value": f"{name}-{REPLICATED_JOB}-$(RCPFLOW_SLICE_INDEX)-0.{name}",
        }
    return [
        host,
        # Kubernetes expands $(VAR) from the variables defined above it.
        {"name": COORDINATOR_ADDRESS_ENV, "value": f"$({COORDINATOR_HOST_ENV}):{COORDINATOR_PORT}"},
        {"name": NUM_PROCESSES_ENV, "value": str(shape.hosts_per_slice)},
        {
            "name": PROCESS_ID_ENV,
            "valueFrom": {
                "fieldRef": {
                    "fieldPath": f"metadata.annotations['{JOB_COMPLETION_INDEX_ANNOTATION}']"
                }
            },
        },
    ]


def kubernetes_literal(text: str) -> str:
    """`text` escaped for a container's command, args or env value: Kubernetes expands
    ``$(VAR)`` there and reads ``$$`` as one ``$``, so doubling every ``$`` makes the process
    get `text` exactly."""
    return text.replace("$", "$$")


def spec_hash(spec: Mapping[str, Any]) -> str:
    """Stable hash of a JobSet spec as rendered (before the cluster adds defaults)."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_spec_hash(jobset: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `jobset` whose ``rcpflow.dev/spec-hash`` annotation is the hash of its spec."""
    stamped = json.loads(json.dumps(jobset))
    metadata = stamped.setdefault("metadata", {})
    metadata.setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(stamped["spec"])
    return stamped


def jobset_ref(jobset: Mapping[str, Any]) -> dict[str, str]:
    """``{"name", "namespace"}`` of a JobSet object, after checking it is one (apiVersion,
    kind, spec, metadata.name/namespace); ValueError naming what is missing."""
    if not isinstance(jobset, Mapping):
        raise ValueError(f"expected a JobSet object (a dict), got {type(jobset).__name__}")
    if jobset.get("apiVersion") != JOBSET_API_VERSION or jobset.get("kind") != JOBSET_KIND:
        raise ValueError(
            f"expected apiVersion {JOBSET_API_VERSION} kind {JOBSET_KIND}, got "
            f"{jobset.get('apiVersion')!r} {jobset.get('kind')!r}"
        )
    if not isinstance(jobset.get("spec"), Mapping):
        raise ValueError("JobSet has no spec")
    metadata = jobset.get("metadata")
    if not isinstance(metadata, Mapping):
        raise ValueError("JobSet has no metadata")
    ref = {}
    for key in ("name", "namespace"):
        value = metadata.get(key)
        if not isinstance(value, str) or not value:
            raise ValueError(f"JobSet metadata.{key} must be set (render_jobset sets it)")
        ref[key] = value
    return ref


def check_adoptable(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> None:
    """Allow reusing `existing` (found under the wanted name) only if it was created from the
    same spec; otherwise JobSetConflictError saying which JobSet and both hashes."""
    ref = jobset_ref(wanted)
    want = spec_hash(wanted["spec"])
    metadata = existing.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    have = annotations.get(ANNOTATION_SPEC_HASH) if isinstance(annotations, Mapping) else None
    if have != want:
        raise JobSetConflictError(
            f"JobSet {ref['namespace']}/{ref['name']} already exists but was not rendered from "
            f"this spec ({ANNOTATION_SPEC_HASH} {have!r}, wanted {want!r}); delete it or change "
            "the job before running again"
        )


def _check_child_names(name: str, shape: TpuJobShape) -> None:
    # The JobSet webhook refuses a JobSet whose child Job or pod names (name-slice-<job>-<pod>
    # plus a 5-char random suffix) would not be DNS-1035 labels of <= 63 characters.
    job_name = f"{name}-{REPLICATED_JOB}-{shape.slices - 1}"
    pod_name = f"{job_name}-{shape.hosts_per_slice - 1}-abcde"
    if not _DNS1035_LABEL.fullmatch(name) or len(pod_name) > 63:
        raise ValueError(
            f"JobSet name {name!r} with {shape.slices} slices x {shape.hosts_per_slice} hosts "
            f"gives pod names like {pod_name!r} ({len(pod_name)} chars); JobSet requires <= 63"
        )
    # and, with spec.coordinator, the pods' coordinator label (a label value: <= 63)
    coordinator = f"{name}-{REPLICATED_JOB}-0-0.{name}"
    if shape.multi_host and len(coordinator) > 63:
        raise ValueError(
            f"JobSet name {name!r} gives the coordinator label {coordinator!r} "
            f"({len(coordinator)} chars); JobSet requires <= 63"
        )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _label_value(text: str) -> str:
    # Label values: <= 63 chars of [A-Za-z0-9._-], starting and ending alphanumeric.
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()
