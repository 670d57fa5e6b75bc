"""The containers of kwok's pods, run here as local processes.

kwok moves pods through their states without a kubelet, so on its nodes nothing runs and a job
writes no file. `PodRunner` stands in for the kubelets of one namespace of a `ControlPlane`:
when kwok has a pod Running, it starts the pod's container (command and args, with
Kubernetes' ``$(VAR)`` expansion; env from the pod spec: values, field references, Secret keys)
as a process in `workdir`; when the process ends, kwok ends the pod with that exit code
(`ControlPlane.end_pod`), so the JobSet controller sees what the job really did. A pod that
is deleted, or ended by someone else (a disruption), has its process stopped as a kubelet
would: SIGTERM, then SIGKILL after the pod's termination grace period. A test can hold the pods
of one JobSet (`hold`): Running to the cluster but not started here until `release`, as a
job held pending by its scheduler. The image is ignored:
the process runs with this machine's interpreter first on PATH (``python`` in a command is the
venv's). Each process's output goes to ``<log_dir>/<namespace>.<pod>.log``.

Used by the whole-submission test on the real control plane
(tests/tasks/backends/gke/real/test_real_submission.py).
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.k8s.client import ApiError
from devtools.k8s.control_plane import ControlPlane
from tasks.jobs.processes import send_signal

POLL_S = 0.2
# A pod's grace period as the runner applies it, at most this (a training pod asks for minutes).
MAX_GRACE_S = 30.0
# metadata.labels['key'] / metadata.annotations['key'] of a fieldRef's fieldPath.
_FIELD_PATH_MAP = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


class PodSpecError(ValueError):
    """A pod whose container this runner cannot start (as a kubelet reports
    CreateContainerConfigError): named, and the pod left Running."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of a container's command, args and env values: ``$(NAME)`` is the
    variable's value when it is defined, else left as written; ``$$`` is ``$``; any other ``$``
    is itself."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass
class _Running:
    pod: str
    process: subprocess.Popen[bytes]
    grace_s: float
    killed_at: float | None = None  # monotonic deadline for SIGKILL once SIGTERM was sent


@dataclass
class PodRunner:
    """``with PodRunner(plane, namespace, workdir) as runner:`` kubelets for `namespace`.

    `exits` is every ended process as (pod name, exit code), in order; `errors` each pod this
    runner could not start, named (`PodSpecError`)."""

    plane: ControlPlane
    namespace: str
    workdir: Path
    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    exits: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _running: dict[str, _Running] = field(default_factory=dict)  # pod uid ->
    _done: set[str] = field(default_factory=set)  # pod uids started once
    _held: set[str] = field(default_factory=set)  # JobSet names whose pods wait for release
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PodRunner:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="kwok-pods", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop watching and kill every process still running (no exit code is reported)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for run in self._running.values():
            send_signal(run.process.pid, signal.SIGKILL, group=True)
            run.process.wait(timeout=10)
        self._running.clear()

    def hold(self, jobset: str) -> None:
        """Start no pod of the JobSet `jobset` until `release`."""
        self._held.add(f"{jobset}-")

    def release(self, jobset: str) -> None:
        """Start the pods of `jobset` as any other's."""
        self._held.discard(f"{jobset}-")

    def running(self) -> list[str]:
        """The pods whose process runs now."""
        return sorted(run.pod for run in self._running.values())

    # -- the loop

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                pods = self.plane.pods(self.namespace)
            except (ApiError, OSError):
                continue  # the API server may be restarting: the processes go on
            self._step(pods)

    def _step(self, pods: list[dict[str, Any]]) -> None:
        by_uid = {p["metadata"]["uid"]: p for p in pods}
        for uid, pod in by_uid.items():
            phase = (pod.get("status") or {}).get("phase")
            if uid in self._done or phase != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            if any(pod["metadata"]["name"].startswith(held) for held in set(self._held)):
                continue
            self._done.add(uid)
            try:
                self._start(uid, pod)
            except PodSpecError as exc:
                self.errors.append(f"{self.namespace}/{pod['metadata']['name']}: {exc}")
        for uid, run in list(self._running.items()):
            current = by_uid.get(uid)
            code = run.process.poll()
            if code is not None:
                del self._running[uid]
                code = 128 - code if code < 0 else code  # killed by signal N: 128 + N
                self.exits.append((run.pod, code))
                if current is not None and run.killed_at is None:
                    self._end(run.pod, code)
                continue
            gone = current is None or current["metadata"].get("deletionTimestamp")
            ended = current is not None and (current.get("status") or {}).get("phase") != "Running"
            if (gone or ended) and run.killed_at is None:
                send_signal(run.process.pid, signal.SIGTERM, group=True)
                run.killed_at = time.monotonic() + run.grace_s
            elif run.killed_at is not None and time.monotonic() > run.killed_at:
                send_signal(run.process.pid, signal.SIGKILL, group=True)

    def _end(self, pod: str, code: int) -> None:
        try:
            self.plane.end_pod(self.namespace, pod, code)
        except ApiError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to end
                raise

    def _start(self, uid: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        (container,) = pod["spec"]["containers"]
        env = self._container_env(pod, container)
        argv = [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
        if not argv:
            raise PodSpecError("the container has no command (the image's entrypoint is unknown)")
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        with open(self.log_dir / f"{self.namespace}.{name}.log", "ab") as log:
            process = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env={**self._base_env(), **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group: stopped whole, as a container is
            )
        self._running[uid] = _Running(name, process, min(grace, MAX_GRACE_S))

    def _base_env(self) -> dict[str, str]:
        interpreter = str(Path(sys.executable).parent)
        return {
            "PATH": f"{interpreter}{os.pathsep}{os.environ.get('PATH', '')}",
            "HOME": os.environ.get("HOME", "/"),
            **self.env,
        }

    def _container_env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in container.get("env", []):
            name = item["name"]
            if "value" in item:
                env[name] = expand(item["value"], env)
            elif "valueFrom" in item:
                env[name] = self._value_from(pod, name, item["valueFrom"])
            else:
                env[name] = ""
        return env

    def _value_from(self, pod: dict[str, Any], name: str, source: dict[str, Any]) -> str:
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            meta = pod["metadata"]
            plain = {
                "metadata.name": meta["name"],
                "metadata.namespace": meta["namespace"],
                "metadata.uid": meta["uid"],
                "spec.nodeName": pod["spec"].get("nodeName", ""),
            }
            if path in plain:
                return str(plain[path])
            match = _FIELD_PATH_MAP.fullmatch(path)
            if match:
                return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
            raise PodSpecError(f"env {name}: fieldRef {path!r} is not one this runner reads")
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            try:
                secret = self.plane.api.get(
                    f"/api/v1/namespaces/{self.namespace}/secrets/{ref['name']}"
                )
            except ApiError as exc:
                raise PodSpecError(f"env {name}: Secret {ref['name']!r}: {exc}") from exc
            data = secret.get("data") or {}
            if ref["key"] not in data:
                raise PodSpecError(f"env {name}: Secret {ref['name']!r} has no key {ref['key']!r}")
            return base64.b64decode(data[ref["key"]]).decode()
        raise PodSpecError(f"env {name}: valueFrom {sorted(source)} is not one this runner reads")
