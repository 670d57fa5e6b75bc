"""The failure, queueing and multi-host policy of rendered JobSets: podFailurePolicy and the
JobSet failurePolicy rules (checked against the failure messages the Job controller writes),
Kueue labels, grace period, TTL, host networking and the distributed environment."""

from __future__ import annotations

import re
from typing import Any

import pytest
from job_contract import documented_actions

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


GKE_ACTIONS = {
    "success": None,
    "restart, counted": "RestartJobSet",
    "restart, not counted": "RestartJobSetAndIgnoreMaxRestarts",
    "fail at once": "FailJobSet",
}


def test_the_documented_contract_has_every_code() -> None:
    contract = documented_actions("GKE")
    assert set(contract) == {"0", "1", "2", "3", "4", "5", "143", "other"}
    assert set(contract.values()) <= set(GKE_ACTIONS)


@pytest.mark.parametrize("role", ["train", "evaluate"])
def test_the_rendered_policy_does_what_docs_exit_codes_says(role: str) -> None:
    jobset = _render(GkeSettings(), role)
    contract = documented_actions("GKE")
    for code, column in contract.items():
        if code == "0":
            continue
        codes = [134, 137, 139, 6, 255] if code == "other" else [int(code)]
        for exit_code in codes:
            want = GKE_ACTIONS[column]
            assert _outcome(jobset, exit_code=exit_code) == want, (exit_code, column)
            # a disrupted pod (preempted, evicted) restarts free whatever its exit code
            assert (
                _outcome(jobset, exit_code=exit_code, disrupted=True)
                == "RestartJobSetAndIgnoreMaxRestarts"
            )
    assert _pod(jobset)["restartPolicy"] == "Never"  # podFailurePolicy requires it


def test_uncaught_exceptions_restart_and_user_errors_fail() -> None:
    # the three cases the contract exists for, spelt out
    jobset = _render(GkeSettings())
    assert _outcome(jobset, exit_code=1) == "RestartJobSet"  # traceback, XLA error, storage
    assert _outcome(jobset, exit_code=2) == "FailJobSet"  # bad flags, another run's checkpoints
    assert _outcome(jobset, exit_code=5) == "FailJobSet"  # invalid input
    assert _outcome(jobset, exit_code=143) == "RestartJobSetAndIgnoreMaxRestarts"  # SIGTERM


def test_failure_policy_rules_as_rendered() -> None:
    jobset = _render(GkeSettings())
    assert jobset["spec"]["failurePolicy"] == {
        "maxRestarts": 3,
        "rules": [
            {
                "name": "disruption",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": [
                    "matching FailJob rule at index 0$",
                    "matching FailJob rule at index 1$",
                ],
            },
            {
                "name": "userError",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": ["matching FailJob rule at index 2$"],
            },
        ],
    }
    rules = _job(jobset)["podFailurePolicy"]["rules"]
    assert [r["onExitCodes"]["values"] for r in rules[1:]] == [[143], [2, 5]]


def test_a_rule_pattern_matches_only_its_own_index() -> None:
    jobset = _render(GkeSettings())
    policy = jobset["spec"]["failurePolicy"]
    assert _jobset_action(policy, "PodFailurePolicy", _exit_message(9, 12)) == "RestartJobSet"
    assert _jobset_action(policy, "PodFailurePolicy", _exit_message(9, 2)) == "FailJobSet"


def test_no_fail_exit_codes_means_every_crash_restarts(strict_jobset) -> None:
    jobset = _render(read_table(GkeSettings, {"fail_exit_codes": []}))
    assert strict_jobset.errors(jobset) == []
    assert len(_job(jobset)["podFailurePolicy"]["rules"]) == 2
    assert _outcome(jobset, exit_code=2) == "RestartJobSet"
    assert _outcome(jobset, exit_code=143) == "RestartJobSetAndIgnoreMaxRestarts"
    assert _outcome(jobset, exit_code=9, disrupted=True) == "RestartJobSetAndIgnoreMaxRestarts"


@pytest.mark.parametrize(
    ("codes", "message"),
    [([1, 2], "1 is Python's exit code for any uncaught exception"), ([143], "143 is SIGTERM")],
)
def test_codes_that_must_restart_cannot_fail_at_once(codes: list[int], message: str) -> None:
    from tasks.settings import SettingError

    with pytest.raises(SettingError, match=f"gke.fail_exit_codes: {message}"):
        read_table(GkeSettings, {"fail_exit_codes": codes}, "gke")


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
    assert "suspend" not in plain["spec"]

    settings = read_table(GkeSettings, {"queue_name": "tpu-queue", "priority_class": "batch-high"})
    for role in ("train", "evaluate"):
        jobset = _render(settings, role)
        assert strict_jobset.errors(jobset) == []
        # Kueue reads the queue from the JobSet's own labels and admits all its pods at once.
        assert jobset["metadata"]["labels"][LABEL_KUEUE_QUEUE] == "tpu-queue"
        assert LABEL_KUEUE_QUEUE not in _job(jobset)["template"]["metadata"]["labels"]
        assert _pod(jobset)["priorityClassName"] == "batch-high"
        # created suspended: Kueue admits it; never running unqueued
        assert jobset["spec"]["suspend"] is True


def test_multi_host_training_gets_host_network_and_the_distributed_env() -> None:
    settings = GkeSettings()
    train = _render(settings)
    pod = _pod(train)
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert train["spec"]["network"] == {
        "enableDNSHostnames": True,
        "publishNotReadyAddresses": True,
    }
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    # Process 0 is pod 0 of job 0: spec.coordinator, whose DNS name the JobSet controller
    # writes into each pod's annotation; the address expands from it.
    assert train["spec"]["coordinator"] == {"replicatedJob": "slice", "jobIndex": 0, "podIndex": 0}
    assert env["RCPFLOW_COORDINATOR_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/coordinator']"
    )
    assert env[COORDINATOR_ADDRESS_ENV]["value"] == "$(RCPFLOW_COORDINATOR_HOST):8476"
    names = [e["name"] for e in pod["containers"][0]["env"]]
    assert names.index("RCPFLOW_COORDINATOR_HOST") < names.index(COORDINATOR_ADDRESS_ENV)
    assert env[NUM_PROCESSES_ENV]["value"] == "32"
    assert env[PROCESS_ID_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )

    evaluate = _render(settings, "evaluate")  # 16 single-host workers: independent processes
    pod = _pod(evaluate)
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    assert "network" not in evaluate["spec"] and "coordinator" not in evaluate["spec"]
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
