"""Secrets by reference (``[jobs.*.secret_env]``, credential-looking ``env`` names refused, no
env value in an XCom, a template field or a log line), and what the deployment adds to every
pod (requests, node selectors, tolerations, volumes), checked against the JobSet CRD schema."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_task import FakeTI

from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings
from tasks.deployment import DeploymentError, parse_deployment
from tasks.jobs.templates import SecretKeyRef, TrainJob
from tasks.settings import SettingError, read_table

GKE = """
backend = "gke"
storage_root = "gs://b/runs"
[gke]
image = "example.com/rcpflow-tpu:1"
"""


def _pod(jobset: dict[str, Any]) -> dict[str, Any]:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _render(settings: GkeSettings, role: str = "train", **kwargs: Any) -> dict[str, Any]:
    return render_jobset(
        settings, role=role, dag_id="d", run_id="r",  # type: ignore[arg-type]
        job="train" if role == "train" else "eval-1", command=["python", "-m", "x"], **kwargs,
    )  # fmt: skip


# --- secret_env --------------------------------------------------------------------------


def test_secret_env_is_parsed_and_rendered_as_secret_key_refs(strict_jobset) -> None:
    text = (
        GKE
        + """
[jobs.train]
env = { XLA_FLAGS = "--xla_foo" }
secret_env = { HF_TOKEN = { secret = "hf-credentials", key = "token" } }
"""
    )
    deployment = parse_deployment(text, source="t.toml", base_dir=Path("."))
    job = deployment.jobs.train
    assert job.secret_env == {"HF_TOKEN": SecretKeyRef("hf-credentials", "token")}
    gke = deployment.table("gke", GkeSettings)
    assert gke is not None
    jobset = _render(gke, env=job.env, secret_env=job.secret_env)
    assert strict_jobset.errors(jobset) == []
    env = _pod(jobset)["containers"][0]["env"]
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-credentials", "key": "token"}},
    } in env


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
     "GOOGLE_APPLICATION_CREDENTIALS", "API_KEY", "KEY", "MY_APIKEY", "GITHUB_TOKENS",
     "hf_token", "CLIENT_SECRET_FILE"],
)  # fmt: skip
def test_a_credential_looking_env_name_is_refused_with_a_pointer(name: str) -> None:
    text = GKE + f'\n[jobs.train]\nenv = {{ {name} = "hunter2" }}\n'
    with pytest.raises(DeploymentError) as excinfo:
        parse_deployment(text, source="t.toml", base_dir=Path("."))
    message = str(excinfo.value)
    assert message.startswith(f"t.toml: jobs.train.env.{name}: looks like a credential")
    assert f'secret_env = {{ {name} = {{ secret = "<Secret name>", key = "<key>" }} }}' in message
    assert "secret_env" in message and "hunter2" not in message


@pytest.mark.parametrize(
    "name", ["XLA_FLAGS", "MONKEY_MODE", "KEYBOARD", "TOKENIZERS_PARALLELISM", "KEYSTONE_URL"]
)
def test_ordinary_names_are_not_credentials(name: str) -> None:
    assert TrainJob(env={name: "1"}).env[name] == "1"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("secret_env = { HF_TOKEN = { secret = 'Bad_Name', key = 't' } }",
         "jobs.train.secret_env.HF_TOKEN.secret: 'Bad_Name' is not a Kubernetes Secret name"),
        ("secret_env = { HF_TOKEN = { secret = 's', key = 'a/b' } }",
         "jobs.train.secret_env.HF_TOKEN.key: 'a/b' is not a Secret key"),
        ("secret_env = { HF_TOKEN = { secret = 's', key = '..token' } }",
         "jobs.train.secret_env.HF_TOKEN.key: '..token' is not a Secret key"),
        ("secret_env = { HF_TOKEN = { secret = 's' } }",
         "jobs.train.secret_env.HF_TOKEN.key: is required"),
        ("secret_env = { RCPFLOW_X = { secret = 's', key = 'k' } }",
         "jobs.train.secret_env.RCPFLOW_X: is set by rcpflow itself"),
        ("secret_env = { HF_TOKEN = 's/k' }", "jobs.train.secret_env.HF_TOKEN: must be a table"),
    ],
)  # fmt: skip
def test_bad_secret_env_names_its_key(table: str, message: str) -> None:
    with pytest.raises(DeploymentError) as excinfo:
        parse_deployment(GKE + f"\n[jobs.train]\n{table}\n", source="t.toml", base_dir=Path("."))
    assert message in str(excinfo.value)


def test_secret_env_is_the_gke_backends_only() -> None:
    text = """
backend = "local"
storage_root = "runs"
[jobs.train]
secret_env = { HF_TOKEN = { secret = "s", key = "k" } }
"""
    from tasks.backends.registry import driver_for

    # The deployment is read; the backend it names refuses what it does not run.
    deployment = parse_deployment(text, source="t.toml", base_dir=Path("."))
    with pytest.raises(DeploymentError) as refused:
        driver_for(deployment)
    assert str(refused.value) == (
        "t.toml: jobs.train.secret_env: only the gke backend takes Secret envs (backend is 'local')"
    )


def test_no_env_value_reaches_an_xcom_a_template_field_or_a_log(
    fake_gke, recorded_status, caplog, capsys
) -> None:
    """The training task group end to end against the stand-in API: the command task, the
    run operator (create, defer, the trigger, resume) and the teardown. The env value is on
    the cluster (the JobSet needs it) and nowhere in Airflow."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    from tasks.backend_api.job_operator import RunJobOperator
    from tasks.backend_api.teardown import CancelRecordedJobs
    from tasks.backends.gke.driver import GkeDriver

    sentinel = "sentinel-value-7f3a"
    settings = GkeSettings(use_dns_endpoint=True, poll_interval_s=0.01)
    job = TrainJob(env={"XLA_FLAGS": sentinel}, secret_env={"HF_TOKEN": SecretKeyRef("hf", "t")})
    fake_gke.statuses = [None, recorded_status("status_succeeded.json")["status"]]
    driver = GkeDriver(settings, secret_envs={"train": job.secret_env})
    op = RunJobOperator(
        task_id="train.job.run", driver=driver, role="train", label="train",
        argv=["python", "-m", "tpu_jobs.train"], env=driver.job_env(job),
    )  # fmt: skip
    ti = FakeTI(task_id="train.job.run")
    ctx: Any = {"ti": ti, "dag_run": SimpleNamespace(dag_id="d", run_id="r")}
    caplog.set_level(logging.DEBUG)
    seen: list[Any] = []
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    trigger = deferred.value.trigger
    seen.append(trigger.serialize())

    async def run() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    [event] = asyncio.run(run())
    seen += [event, op.execute_complete(ctx, event), ti.pushed]
    seen += [{f: getattr(op, f) for f in op.template_fields}]  # what the UI renders
    teardown = CancelRecordedJobs(driver=driver, run_task_id="train.job.run")
    seen.append(teardown.execute({"ti": ti}))

    # the JobSet had ended (nothing to cancel); the teardown removed it
    assert seen[2]["outcome"] == "succeeded" and seen[-1][0]["cancelled"] is False
    assert fake_gke.objects == {}
    [created] = fake_gke.created
    assert sentinel in json.dumps(created)  # the cluster has it
    assert '"secretKeyRef": {"name": "hf", "key": "t"}' in json.dumps(created)
    out = capsys.readouterr()
    airflow_side = json.dumps(seen, default=str) + caplog.text + out.out + out.err
    assert sentinel not in airflow_side
    assert "XLA_FLAGS" not in json.dumps(seen, default=str)


# --- what the deployment adds to every pod ------------------------------------------------

EXTRAS = {
    "node_selector": {"cloud.google.com/gke-spot": "true"},
    "tolerations": [
        {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
         "effect": "NoSchedule"},
    ],
    "volumes": [
        {"name": "data", "csi": {"driver": "gcsfuse.csi.storage.gke.io",
                                 "volumeAttributes": {"bucketName": "b", "mountOptions": "ro"}}},
        {"name": "creds", "secret": {"secretName": "eval-creds"}},
    ],
    "volume_mounts": [
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
    ],
    "pod_annotations": {"gke-gcsfuse/volumes": "true"},
    "train": {"cpu_request": "200", "memory_request": "400Gi"},
}  # fmt: skip


@pytest.mark.parametrize("role", ["train", "evaluate"])
def test_pod_extras_and_requests_are_rendered_and_pass_the_schema(
    role: str, strict_jobset, lenient_jobset
) -> None:
    settings = read_table(GkeSettings, EXTRAS, "gke")
    jobset = _render(settings, role)
    assert strict_jobset.errors(jobset) == [] and lenient_jobset.errors(jobset) == []
    pod = _pod(jobset)
    container = pod["containers"][0]
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == settings.shape(role).topology  # type: ignore[arg-type]
    assert pod["tolerations"] == EXTRAS["tolerations"]
    assert pod["volumes"] == EXTRAS["volumes"]
    assert container["volumeMounts"] == EXTRAS["volume_mounts"]
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    want = {"train": ("200", "400Gi"), "evaluate": ("8", "32Gi")}[role]
    assert container["resources"] == {
        "requests": {"cpu": want[0], "memory": want[1]},
        "limits": {"google.com/tpu": 4},
    }


def test_requests_by_default_so_no_pod_is_best_effort(strict_jobset) -> None:
    for role in ("train", "evaluate"):
        requests = _pod(_render(GkeSettings(), role))["containers"][0]["resources"]["requests"]
        assert set(requests) == {"cpu", "memory"}


def test_a_misspelt_extra_fails_the_schema(strict_jobset) -> None:
    # the parse-time checks are structural; the schema (and the cluster's strict create)
    # catch a misspelt Kubernetes field
    bad = read_table(GkeSettings, {"volumes": [{"name": "v", "secrett": {"secretName": "s"}}]})
    errors = strict_jobset.errors(_render(bad))
    assert any("secrett" in e for e in errors), errors


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"node_selector": {"cloud.google.com/gke-tpu-topology": "2x2x1"}},
         "gke.node_selector.cloud.google.com/gke-tpu-topology: is set from the job's TPU shape"),
        ({"tolerations": [{"key": "k", "efect": "NoSchedule"}]},
         "gke.tolerations[0]: a Toleration"),
        ({"volumes": [{"name": "v"}]}, "gke.volumes[0]: a Volume needs a 'name'"),
        ({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]},
         "gke.volumes[1].name: 'v' is given twice"),
        ({"volume_mounts": [{"name": "x", "mountPath": "/x"}]},
         "gke.volume_mounts[0].name: 'x' is not one of gke.volumes"),
        ({"volumes": [{"name": "v", "emptyDir": {}}], "volume_mounts": [{"name": "v",
          "mountPath": "rel"}]}, "gke.volume_mounts[0].mountPath: must be an absolute path"),
        ({"volumes": {"name": "v"}}, "gke.volumes: must be a list of dict"),
        ({"train": {"cpu_request": "lots"}}, "gke.train.cpu_request: 'lots' is not a CPU"),
        ({"evaluate": {"memory_request": "32 GB"}}, "gke.evaluate.memory_request: '32 GB' is"),
    ],
)  # fmt: skip
def test_bad_pod_extras_name_their_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingError) as excinfo:
        read_table(GkeSettings, table, "gke")
    assert message in str(excinfo.value)
