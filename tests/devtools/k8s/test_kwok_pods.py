"""The pod runner's reading of a pod spec: Kubernetes' `$(VAR)` expansion and the container env
of a pod rendered by the GKE backend. Its processes against kwok are run by
tests/tasks/backends/gke/real/test_real_submission.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtools.k8s.kwok_pods import PodRunner, PodSpecError, expand
from tasks.backends.gke.render import kubernetes_literal, render_jobset
from tasks.backends.gke.settings import GkeSettings

ENV = {"A": "1", "B": "x y"}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)", "1"),
        ("a$(A)b$(B)", "a1bx y"),
        ("$(C)", "$(C)"),  # undefined: left as written
        ("$$(A)", "$(A)"),  # escaped
        ("$$$(A)", "$1"),
        ("$", "$"),
        ("a$b", "a$b"),
        ("$(A", "$(A"),  # unclosed
        ("$$", "$"),
    ],
)
def test_expansion_is_kubernetes(text: str, expanded: str) -> None:
    assert expand(text, ENV) == expanded


@given(st.text())
def test_a_rendered_literal_reaches_the_process_unchanged(text: str) -> None:
    assert expand(kubernetes_literal(text), ENV) == text


def _pod(template: dict[str, Any]) -> dict[str, Any]:
    """A pod as the JobSet controller makes it from `template`: its labels and annotations."""
    metadata = {
        "name": "js-slice-0-0-abcde",
        "namespace": "ns",
        "uid": "pod-uid",
        "labels": {
            "jobset.sigs.k8s.io/jobset-uid": "jobset-uid",
            "jobset.sigs.k8s.io/restart-attempt": "2",
        },
        "annotations": {
            "jobset.sigs.k8s.io/job-index": "0",
            "batch.kubernetes.io/job-completion-index": "0",
        },
    }
    return {"metadata": metadata, "spec": template["spec"]}


def test_the_container_env_of_a_rendered_pod(tmp_path: Path) -> None:
    settings = GkeSettings()
    jobset = render_jobset(
        settings,
        role="evaluate",
        dag_id="d",
        run_id="r",
        job="eval-3",
        command=["python", "-m", "x", "--token", "$(HOME)"],
        env={"PLAIN": "a$(RCPFLOW_SLICE_INDEX)b"},
    )
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod = _pod(template)
    runner = PodRunner(plane=None, namespace="ns", workdir=tmp_path, log_dir=tmp_path)  # type: ignore[arg-type]
    (container,) = pod["spec"]["containers"]
    env = runner._container_env(pod, container)
    assert env["RCPFLOW_SLICE_INDEX"] == "0"
    assert env["RCPFLOW_NUM_SLICES"] == str(settings.evaluate.slices)
    assert env["PLAIN"] == "a$(RCPFLOW_SLICE_INDEX)b"  # a Param value is never expanded
    argv = [expand(a, env) for a in container["command"]]
    assert argv == ["python", "-m", "x", "--token", "$(HOME)"]


def test_a_field_it_cannot_read_is_named(tmp_path: Path) -> None:
    runner = PodRunner(plane=None, namespace="ns", workdir=tmp_path, log_dir=tmp_path)  # type: ignore[arg-type]
    pod = _pod({"spec": {}})
    container = {"env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}
    with pytest.raises(PodSpecError, match=r"env IP: fieldRef 'status.podIP'"):
        runner._container_env(pod, container)


def test_a_held_jobsets_pods_start_only_once_released(tmp_path: Path) -> None:
    runner = PodRunner(plane=None, namespace="ns", workdir=tmp_path, log_dir=tmp_path)  # type: ignore[arg-type]
    spec = {"containers": [{"name": "c", "command": ["sleep", "30"]}]}

    def pod(name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "uid": name},
            "spec": spec,
            "status": {"phase": "Running"},
        }

    runner.hold("js")
    pods = [pod("js-slice-0-0-abcde"), pod("jsx-slice-0-0-abcde")]  # a longer name is not held
    try:
        runner._step(pods)
        assert runner.running() == ["jsx-slice-0-0-abcde"]
        runner._step(pods)  # still held on the next look
        assert runner.running() == ["jsx-slice-0-0-abcde"]
        runner.release("js")
        runner._step(pods)
        assert runner.running() == ["js-slice-0-0-abcde", "jsx-slice-0-0-abcde"]
    finally:
        runner.stop()
