"""The failure, queueing and multi-host policy of rendered JobSets: podFailurePolicy and the
JobSet failurePolicy rules (checked against the failure messages the Job controller writes),
Kueue labels, grace period, TTL, host networking and the distributed environment."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tasks.backends.gke.render import (
    COORDINATOR_ADDRESS_ENV,
    LABEL_KUEUE_QUEUE,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    render_jobset,
)
from tasks.backends.gke.settings import GkeSettings
from tasks.settings import read_table

RUN_ID = "manual__2026-05-01T12:00:00+00:00"


def _render(settings: GkeSettings, role: str = "train") -> dict[str, Any]:
    return render_jobset(
        settings,
        role=role,  # type: ignore[arg-type]
        dag_id="mlperf_grpo_run",
        run_id=RUN_ID,
        job="train" if role == "train" else "eval-18",
        command=["python", "-m", f"tpu_jobs.{role}"],
    )


def _job(jobset: dict[str, Any]) -> dict[str, Any]:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]


def _pod(jobset: dict[str, Any]) -> dict[str, Any]:
    return _job(jobset)["template"]["spec"]


# The Job controller's failure messages (kubernetes pkg/controller/job, pod_failure_policy.go)
# and reasons, as the JobSet controller sees them on the failed child Job.
def _exit_message(code: int, rule: int) -> str:
    return (
        f"Container job for pod mlperf/t-slice-0-3-abcde failed with exit code {code} "
        f"matching FailJob rule at index {rule}"
    )


DISRUPTION_MESSAGE = (
    "Pod mlperf/t-slice-0-7-fghij has condition DisruptionTarget matching FailJob rule at index 0"
)


def _pod_rule_action(pod_policy: dict[str, Any], *, exit_code: int, disrupted: bool) -> tuple:
    """(action, rule index) of the first podFailurePolicy rule matching a failed pod, as the
    Job controller picks it; ("Count", None) when none matches."""
    for i, rule in enumerate(pod_policy["rules"]):
        if "onPodConditions" in rule:
            if disrupted and any(
                c == {"type": "DisruptionTarget", "status": "True"} for c in rule["onPodConditions"]
            ):
                return rule["action"], i
        else:
            req = rule["onExitCodes"]
            inside = exit_code in req["values"]
            if req["containerName"] == "job" and inside == (req["operator"] == "In"):
                return rule["action"], i
    return "Count", None


def _jobset_action(failure_policy: dict[str, Any], reason: str, message: str) -> str:
    """The JobSet controller's choice: the first rule whose reasons and message patterns both
    match (an empty list matches anything); RestartJobSet when none does."""
    for rule in failure_policy.get("rules", []):
        reasons = rule.get("onJobFailureReasons", [])
        patterns = rule.get("onJobFailureMessagePatterns", [])
        if (not reasons or reason in reasons) and (
            not patterns or any(re.search(p, message) for p in patterns)
        ):
            return str(rule["action"])
    return "RestartJobSet"


def _outcome(jobset: dict[str, Any], *, exit_code: int, disrupted: bool = False) -> str:
    """What happens to the JobSet when one pod fails so (backoffLimit 0: one failure ends the
    child Job)."""
    job = _job(jobset)
    assert job["backoffLimit"] == 0
    action, index = _pod_rule_action(
        job["podFailurePolicy"], exit_code=exit_code, disrupted=disrupted
    )
    if action == "FailJob":
        reason = "PodFailurePolicy"
        message = DISRUPTION_MESSAGE if disrupted else _exit_message(exit_code, index)
    else:
        assert action == "Count"
        reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    return _jobset_action(jobset["spec"]["failurePolicy"], reason, message)


@pytest.mark.parametrize("role", ["train", "evaluate"])
def test_disruption_restarts_free_app_errors_fail_crashes_count(role: str) -> None:
    jobset = _render(GkeSettings(), role)
    assert _outcome(jobset, exit_code=143, disrupted=True) == "RestartJobSetAndIgnoreMaxRestarts"
    assert _outcome(jobset, exit_code=2) == "FailJobSet"  # bad arguments
    assert _outcome(jobset, exit_code=1) == "FailJobSet"  # invalid input / traceback
    for crash in (134, 137, 139, 143):  # abort (peer lost), OOM kill, segfault, SIGTERM
        assert _outcome(jobset, exit_code=crash) == "RestartJobSet"
    assert _pod(jobset)["restartPolicy"] == "Never"  # podFailurePolicy requires it


def test_failure_policy_rules_as_rendered() -> None:
    jobset = _render(GkeSettings())
    assert jobset["spec"]["failurePolicy"] == {
        "maxRestarts": 3,
        "rules": [
            {
                "name": "disruption",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": ["matching FailJob rule at index 0"],
            },
            {
                "name": "applicationExit",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": ["matching FailJob rule at index 1"],
            },
        ],
    }
    assert _job(jobset)["podFailurePolicy"]["rules"][1]["onExitCodes"] == {
        "containerName": "job",
        "operator": "In",
        "values": [1, 2],
    }


def test_no_fail_exit_codes_means_every_crash_restarts(strict_jobset) -> None:
    jobset = _render(read_table(GkeSettings, {"fail_exit_codes": []}))
    assert strict_jobset.errors(jobset) == []
    assert len(_job(jobset)["podFailurePolicy"]["rules"]) == 1
    assert _outcome(jobset, exit_code=2) == "RestartJobSet"
    assert _outcome(jobset, exit_code=9, disrupted=True) == "RestartJobSetAndIgnoreMaxRestarts"


def test_grace_period_ttl_and_restarts_by_role() -> None:
    settings = GkeSettings()
    train, evaluate = _render(settings), _render(settings, "evaluate")
    assert _pod(train)["terminationGracePeriodSeconds"] == 600
    assert _pod(evaluate)["terminationGracePeriodSeconds"] == 60
    assert evaluate["spec"]["failurePolicy"]["maxRestarts"] == 2
    for jobset in (train, evaluate):
        assert jobset["spec"]["ttlSecondsAfterFinished"] == 86400
        assert jobset["spec"]["ttlSecondsAfterFinished"] > 100 * settings.poll_interval_s


def test_kueue_queue_and_priority_class(strict_jobset) -> None:
    plain = _render(GkeSettings(), "evaluate")
    assert LABEL_KUEUE_QUEUE not in plain["metadata"]["labels"]
    assert "priorityClassName" not in _pod(plain)

    settings = read_table(GkeSettings, {"queue_name": "tpu-queue", "priority_class": "batch-high"})
    for role in ("train", "evaluate"):
        jobset = _render(settings, role)
        assert strict_jobset.errors(jobset) == []
        # Kueue reads the queue from the JobSet's own labels and admits all its pods at once.
        assert jobset["metadata"]["labels"][LABEL_KUEUE_QUEUE] == "tpu-queue"
        assert LABEL_KUEUE_QUEUE not in _job(jobset)["template"]["metadata"]["labels"]
        assert _pod(jobset)["priorityClassName"] == "batch-high"


def test_multi_host_training_gets_host_network_and_the_distributed_env() -> None:
    settings = GkeSettings()
    train = _render(settings)
    name = train["metadata"]["name"]
    pod = _pod(train)
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert train["spec"]["network"] == {
        "enableDNSHostnames": True,
        "publishNotReadyAddresses": True,
    }
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    # Process 0 is pod 0 of job 0, by the JobSet's DNS name for it.
    assert env[COORDINATOR_ADDRESS_ENV]["value"] == f"{name}-slice-0-0.{name}:8476"
    assert env[NUM_PROCESSES_ENV]["value"] == "32"
    assert env[PROCESS_ID_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )

    evaluate = _render(settings, "evaluate")  # 16 single-host workers: independent processes
    pod = _pod(evaluate)
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    assert "network" not in evaluate["spec"]
    names = {e["name"] for e in pod["containers"][0]["env"]}
    assert not names & {COORDINATOR_ADDRESS_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV}


def test_the_rendered_env_is_what_the_trainer_reads() -> None:
    # tasks cannot import tpu_jobs (layering), so the names are kept in step by this test.
    pytest.importorskip("jax")
    from tpu_jobs.rcp import distributed

    assert (
        distributed.COORDINATOR_ADDRESS_ENV,
        distributed.NUM_PROCESSES_ENV,
        distributed.PROCESS_ID_ENV,
    ) == (COORDINATOR_ADDRESS_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV)


def test_single_host_training_is_one_process() -> None:
    settings = read_table(GkeSettings, {"train": {"topology": "2x2x1"}})
    pod = _pod(_render(settings))
    assert "hostNetwork" not in pod
    assert COORDINATOR_ADDRESS_ENV not in {e["name"] for e in pod["containers"][0]["env"]}
