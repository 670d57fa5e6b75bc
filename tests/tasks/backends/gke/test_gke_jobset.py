"""Rendered JobSets: valid against the JobSet CRD schema (strict), TPU placement, argument-list
commands, deterministic names and the adoption check."""

from __future__ import annotations

import json
import re

import pytest

from tasks.backends.gke.render import (
    ANNOTATION_EXCLUSIVE_TOPOLOGY,
    ANNOTATION_SPEC_HASH,
    LABEL_RUN,
    MAX_NAME_LENGTH,
    JobSetConflictError,
    check_adoptable,
    jobset_name,
    jobset_ref,
    render_jobset,
    run_label,
    with_spec_hash,
)
from tasks.backends.gke.settings import GkeSettings, TpuJobShape
from tasks.settings import read_table

RUN_ID = "manual__2026-05-01T12:00:00.123456+00:00"
TRAIN = ["python", "-m", "tpu_jobs.train"]
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _train(settings: GkeSettings, **overrides: object) -> dict:
    kwargs = {
        "role": "train",
        "dag_id": "mlperf_grpo_run",
        "run_id": RUN_ID,
        "job": "train",
        "command": [*TRAIN, "--run-dir", "gs://b/runs/seed_1", "--seed", "1", "--max-steps", "40"],
    }
    kwargs.update(overrides)
    return render_jobset(settings, **kwargs)  # type: ignore[arg-type]


def _eval(settings: GkeSettings, step: int = 18) -> dict:
    return render_jobset(
        settings,
        role="evaluate",
        dag_id="mlperf_grpo_run",
        run_id=RUN_ID,
        job=f"eval-{step}",
        command=[
            "python",
            "-m",
            "tpu_jobs.evaluate",
            "--run-dir",
            "gs://b/runs/s1",
            "--step",
            str(step),
        ],
    )


def _pod(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


SHAPES = {
    "default": GkeSettings(),
    "single-host-train-queued": read_table(
        GkeSettings,
        {
            "queue_name": "tpu-v5p-queue",
            "priority_class": "high-priority",
            "fail_exit_codes": [],
            "train": {"topology": "2x2x1", "max_restarts": 5, "termination_grace_period_s": 30},
        },
    ),
    "v6e": read_table(
        GkeSettings,
        {
            "train": {"accelerator": "tpu-v6e-slice", "topology": "8x16", "chips_per_host": 4},
            "evaluate": {"accelerator": "tpu-v6e-slice", "topology": "1x1", "chips_per_host": 1},
        },
    ),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_rendered_jobsets_pass_the_crd_schema(name: str, strict_jobset, lenient_jobset) -> None:
    settings = SHAPES[name]
    for jobset in (_train(settings), _eval(settings)):
        assert strict_jobset.errors(jobset) == []
        assert lenient_jobset.errors(jobset) == []


def test_misspelt_or_mistyped_fields_fail_validation(strict_jobset, lenient_jobset) -> None:
    good = _train(GkeSettings())
    assert strict_jobset.errors(good) == []

    misspelt = json.loads(json.dumps(good))
    pod = _pod(misspelt)
    pod["nodeSelecter"] = pod.pop("nodeSelector")
    errors = strict_jobset.errors(misspelt)
    assert any("nodeSelecter" in e for e in errors), errors
    # The CRD as shipped would let it through: Kubernetes prunes unknown fields silently.
    assert lenient_jobset.errors(misspelt) == []

    misplaced = json.loads(json.dumps(good))
    misplaced["spec"]["maxRestarts"] = misplaced["spec"].pop("failurePolicy")["maxRestarts"]
    assert any("maxRestarts" in e for e in strict_jobset.errors(misplaced))

    mistyped = json.loads(json.dumps(good))
    mistyped["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = "32"
    assert strict_jobset.errors(mistyped) and lenient_jobset.errors(mistyped)

    bad_label = json.loads(json.dumps(good))
    bad_label["metadata"]["labels"]["rcpflow.dev/run"] = RUN_ID  # ':' and '+' are not allowed
    assert any("labels" in e for e in strict_jobset.errors(bad_label))


def test_tpu_placement_and_sizes() -> None:
    settings = GkeSettings()
    train, evaluate = _train(settings), _eval(settings)

    rjob = train["spec"]["replicatedJobs"][0]
    assert rjob["replicas"] == 1
    assert rjob["template"]["spec"]["parallelism"] == rjob["template"]["spec"]["completions"] == 32
    assert rjob["template"]["spec"]["completionMode"] == "Indexed"
    assert _pod(train)["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "4x4x8",
    }
    assert _pod(train)["containers"][0]["resources"]["limits"] == {"google.com/tpu": 4}
    assert train["spec"]["failurePolicy"]["maxRestarts"] == 3
    # A multi-host slice must sit in one node pool; single-host workers need not.
    assert train["metadata"]["annotations"][ANNOTATION_EXCLUSIVE_TOPOLOGY] == (
        "cloud.google.com/gke-nodepool"
    )

    erjob = evaluate["spec"]["replicatedJobs"][0]
    assert erjob["replicas"] == 16
    assert erjob["template"]["spec"]["parallelism"] == 1
    assert _pod(evaluate)["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x1"
    assert ANNOTATION_EXCLUSIVE_TOPOLOGY not in evaluate["metadata"]["annotations"]
    env = {e["name"]: e for e in _pod(evaluate)["containers"][0]["env"]}
    assert env["RCPFLOW_NUM_SLICES"]["value"] == "16"
    assert "job-index" in env["RCPFLOW_SLICE_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]


def kubernetes_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a container's command/args item or env value, by the
    documented rules (Kubernetes API reference, Container.command / EnvVar.value): a variable
    reference $(VAR_NAME) is replaced by the variable's value; a reference to a variable that
    does not exist stays unchanged; "$$" is an escape and yields a single "$", so $$(VAR_NAME)
    gives the literal "$(VAR_NAME)". Written here from those rules, not from our renderer: a
    "$" followed by anything else (or by nothing, or an unclosed "$(") is kept as it is."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def test_the_expansion_rules_as_written() -> None:
    env = {"HF_TOKEN": "hf_secret", "A": "1"}
    assert kubernetes_expand("$(HF_TOKEN)", env) == "hf_secret"  # the attack
    assert kubernetes_expand("$$(HF_TOKEN)", env) == "$(HF_TOKEN)"
    assert kubernetes_expand("$$$(HF_TOKEN)", env) == "$hf_secret"  # the old escaping's hole
    assert kubernetes_expand("$(NOPE) $ $x $( a$", env) == "$(NOPE) $ $x $( a$"


# What a Param value may contain: every way of writing a reference or an escape.
NASTY = [
    "$(HF_TOKEN)", "$$(HF_TOKEN)", "$$$(HF_TOKEN)", "$$$$(HF_TOKEN)", "a$(HF_TOKEN)b",
    "$(HF_TOKEN", "$", "$$", "$$$", "x$", "$x", "$()", "$(A)$(A)", "$$(A)$(A)$$", "(HF_TOKEN)",
    "/tmp/x; rm -rf / #", "a b\n'c'", "$(PATH)/../$(HOME)", "", "${HF_TOKEN}", "$$${A}",
]  # fmt: skip


@pytest.mark.parametrize("value", NASTY)
def test_a_param_value_reaches_the_pod_verbatim(value: str) -> None:
    jobset = _train(GkeSettings(), command=[*TRAIN, "--note", value])
    container = _pod(jobset)["containers"][0]
    # the pod's environment as Kubernetes resolves it, secrets included
    pod_env = {"HF_TOKEN": "hf_secret", "A": "1", "PATH": "/bin", "HOME": "/root"}
    for item in container["env"]:
        if "value" in item:
            pod_env[item["name"]] = kubernetes_expand(item["value"], pod_env)
    assert [kubernetes_expand(a, pod_env) for a in container["command"]] == [
        *TRAIN, "--note", value,
    ]  # fmt: skip
    assert "args" not in container
    # a plain env value too
    jobset = _train(GkeSettings(), env={"NOTE": value})
    [item] = [e for e in _pod(jobset)["containers"][0]["env"] if e["name"] == "NOTE"]
    assert kubernetes_expand(item["value"], pod_env) == value


def test_rcpflows_own_references_still_expand() -> None:
    env = {e["name"]: e for e in _pod(_train(GkeSettings()))["containers"][0]["env"]}
    resolved = {"RCPFLOW_JOBSET_UID": "u-1", "RCPFLOW_RESTART_ATTEMPT": "2"}
    assert kubernetes_expand(env["RCPFLOW_ATTEMPT_ID"]["value"], resolved) == "u-1/2"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"command": [*TRAIN, "--seed", 1]}, "command[4] must be a string, got int 1"),
        ({"command": "python -m tpu_jobs.train"}, "command must be a non-empty list of strings"),
        ({"command": []}, "command must be a non-empty list of strings"),
        ({"command": ["a\x00b"]}, "command[0] contains a NUL"),
        ({"role": "eval"}, "role must be one of"),
        ({"run_id": ""}, "run_id must be a non-empty string"),
    ],
)
def test_bad_job_input_is_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        _train(GkeSettings(), **overrides)
    assert message in str(excinfo.value)


def test_names_are_dns_safe_deterministic_and_distinct() -> None:
    names = {
        jobset_name("mlperf_grpo_run", RUN_ID, "train"),
        jobset_name("mlperf_grpo_run", RUN_ID, "eval-18"),
        jobset_name("mlperf_grpo_run", RUN_ID + "x", "train"),
        jobset_name("mlperf_grpo_deferred_eval", RUN_ID, "eval-18"),
        jobset_name("9" * 200, "r" * 300, "E" * 90),
        jobset_name("___", "r", "---"),
    }
    assert len(names) == 6
    for name in names:
        assert DNS1035.fullmatch(name) and len(name) <= MAX_NAME_LENGTH, name
        # the coordinator label JobSet writes on a training's pods fits a label value
        assert len(f"{name}-slice-0-0.{name}") <= 63, name
    assert jobset_name("mlperf_grpo_run", RUN_ID, "train") == "mlperf-g-train-61da75ec"


def test_rendering_is_byte_identical_across_calls() -> None:
    settings = GkeSettings()
    first = json.dumps(_eval(settings), sort_keys=True)
    assert json.dumps(_eval(settings), sort_keys=True) == first
    assert _eval(settings)["metadata"]["labels"][LABEL_RUN] == run_label("mlperf_grpo_run", RUN_ID)


def test_child_names_that_would_not_fit_are_refused() -> None:
    from tasks.backends.gke.render import _check_child_names

    # Names are at most 26 characters, so every shape fits; the guard still refuses a longer
    # name: a pod name (name + "-slice-0-<host>-xxxxx") or the coordinator label JobSet writes
    # on a multi-host training's pods ("<name>-slice-0-0.<name>") over 63 characters.
    huge = TpuJobShape(
        accelerator="tpu-v5p-slice", topology="10000x10000x4000", slices=1, chips_per_host=4
    )
    with pytest.raises(ValueError, match=r"\(64 chars\); JobSet requires <= 63"):
        _check_child_names("a" * 38, huge)
    multi_host = GkeSettings().train
    assert multi_host.multi_host
    with pytest.raises(ValueError, match=r"coordinator label .* \(65 chars\)"):
        _check_child_names("a" * 27, multi_host)
    _check_child_names("a" * MAX_NAME_LENGTH, multi_host)  # the longest name fits
    long_names = {"dag_id": "averylongdagidentifier", "job": "evaluationstep100"}
    _train(GkeSettings(train=huge), **long_names)  # long ids still render: the name is cut


def test_adoption_only_of_the_same_spec() -> None:
    wanted = _eval(GkeSettings())
    assert with_spec_hash(wanted) == wanted
    check_adoptable(json.loads(json.dumps(wanted)), wanted)

    other = _eval(GkeSettings(image="rcpflow-tpu:other"))
    assert other["metadata"]["name"] == wanted["metadata"]["name"]
    with pytest.raises(JobSetConflictError, match=r"default/mlperf-g-eval-18-.*spec-hash"):
        check_adoptable(other, wanted)
    with pytest.raises(JobSetConflictError):
        check_adoptable({"metadata": {"name": wanted["metadata"]["name"]}}, wanted)

    edited = json.loads(json.dumps(wanted))
    edited["spec"]["failurePolicy"]["maxRestarts"] = 5
    restamped = with_spec_hash(edited)
    assert (
        restamped["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        != wanted["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    )


def test_jobset_ref_checks_the_object() -> None:
    jobset = _train(GkeSettings(namespace="mlperf"))
    assert jobset_ref(jobset) == {"name": jobset["metadata"]["name"], "namespace": "mlperf"}
    with pytest.raises(ValueError, match="apiVersion"):
        jobset_ref({**jobset, "apiVersion": "batch/v1"})
    with pytest.raises(ValueError, match=r"metadata\.namespace"):
        jobset_ref({**jobset, "metadata": {"name": "x"}})
    with pytest.raises(ValueError, match="got list"):
        jobset_ref([jobset])  # type: ignore[arg-type]
