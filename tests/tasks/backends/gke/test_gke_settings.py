"""GkeSettings: defaults describe the benchmark's TPU shapes; bad values name their key."""

from __future__ import annotations

import dataclasses
import re

import pytest
from repo_paths import REPO

from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeCluster, GkeSettings, TpuJobShape
from tasks.deployment import parse_deployment
from tasks.jobs.command import TRAIN_JOB
from tasks.settings import SettingError, read_table


def test_defaults_are_the_benchmark_shapes() -> None:
    settings = GkeSettings()
    train, evaluate = settings.train, settings.evaluate
    assert (train.accelerator, train.topology, train.slices) == ("tpu-v5p-slice", "4x4x8", 1)
    assert train.max_restarts >= 3  # training resumes from its newest checkpoint
    assert train.multi_host and not evaluate.multi_host
    assert settings.outage_budget_s >= 20 * 60
    assert settings.ttl_after_finished_s >= 100 * settings.poll_interval_s
    assert settings.fail_exit_codes == (2, 5)  # docs/exit-codes.md: the user errors
    assert (train.chips_per_slice * train.slices, train.hosts_per_slice) == (128, 32)
    assert (evaluate.topology, evaluate.slices, evaluate.hosts_per_slice) == ("2x2x1", 16, 1)
    assert evaluate.chips_per_slice * evaluate.slices == 64
    assert settings.shape("train") is train and settings.shape("evaluate") is evaluate


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GkeSettings().image = "other"  # type: ignore[misc]


def test_a_table_overrides_and_keeps_the_rest() -> None:
    settings = read_table(
        GkeSettings,
        {
            "project_id": "my-proj",
            "image": "us-docker.pkg.dev/my-proj/rcpflow/tpu:1",
            "impersonation_chain": ["sa@my-proj.iam.gserviceaccount.com"],
            "train": {"topology": "4x4x16", "max_restarts": 1},
            "evaluate": {"accelerator": "tpu-v6e-slice", "topology": "2x2", "chips_per_host": 4},
        },
    )
    assert settings.project_id == "my-proj"
    assert settings.impersonation_chain == ("sa@my-proj.iam.gserviceaccount.com",)
    assert (settings.train.slices, settings.train.topology, settings.train.max_restarts) == (
        1,
        "4x4x16",
        1,
    )
    assert settings.train.chips_per_slice * settings.train.slices == 256
    assert settings.train.termination_grace_period_s == 600  # kept from the default shape
    assert settings.evaluate.accelerator == "tpu-v6e-slice"
    assert settings.evaluate.slices == 16  # kept from the default evaluation shape
    assert settings.location == GkeSettings().location
    assert read_table(GkeSettings, {}, "gke") == GkeSettings()


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"trian": {}}, "gke: unknown key(s) trian"),
        ({"train": {"slice": 2}}, "gke.train: unknown key(s) slice"),
        ({"train": {"topology": "4x4"}}, "gke.train.topology: '4x4' is not a 3-D topology"),
        ({"train": {"topology": "4x0x8"}}, "gke.train.topology"),
        ({"train": {"accelerator": "v5p"}}, "gke.train.accelerator: unknown TPU accelerator"),
        ({"train": {"chips_per_host": 8}}, "gke.train.chips_per_host: 8 is not offered"),
        ({"evaluate": {"slices": 0}}, "gke.evaluate.slices: must be >= 1, got 0"),
        ({"evaluate": {"slices": "16"}}, "gke.evaluate.slices: must be int, got str '16'"),
        ({"evaluate": {"slices": True}}, "gke.evaluate.slices: must be int, got bool True"),
        ({"evaluate": {"max_restarts": -1}}, "gke.evaluate.max_restarts: must be >= 0"),
        (
            {"evaluate": {"accelerator": "tpu-v6e-slice", "topology": "2x2", "chips_per_host": 8}},
            "gke.evaluate: topology 2x2 has 4 chips, not a multiple of chips_per_host=8",
        ),
        ({"namespace": "Default"}, "gke.namespace: 'Default' is not a Kubernetes name"),
        ({"service_account": ""}, "gke.service_account: must be a non-empty string"),
        ({"image": "rcpflow tpu"}, "gke.image: 'rcpflow tpu' contains whitespace"),
        ({"cluster_name": None}, "gke.cluster_name: must be str, got NoneType None"),
        ({"poll_interval_s": 0}, "gke.poll_interval_s: must be > 0"),
        ({"poll_interval_s": "30"}, "gke.poll_interval_s: must be float, got str"),
        ({"use_dns_endpoint": "yes"}, "gke.use_dns_endpoint: must be bool, got str 'yes'"),
        ({"impersonation_chain": 3}, "gke.impersonation_chain: must be a list of str"),
        ({"impersonation_chain": ["a@b", 3]}, "gke.impersonation_chain: must be a list of str"),
        ({"impersonation_chain": [""]}, "gke.impersonation_chain: account emails must not be"),
        ({"train": "big"}, "gke.train: must be a table, got str"),
        ({"train": {"slices": 2}}, "gke.train.slices: 2 slices: multislice training is not"),
        ({"train": {"termination_grace_period_s": 0}}, "gke.train.termination_grace_period_s"),
        ({"fail_exit_codes": [2, 0]}, "gke.fail_exit_codes: exit codes are 1..255"),
        ({"fail_exit_codes": [256]}, "gke.fail_exit_codes: exit codes are 1..255"),
        ({"fail_exit_codes": "2"}, "gke.fail_exit_codes: must be a list of int"),
        ({"queue_name": "a queue"}, "gke.queue_name: 'a queue' is not a Kueue LocalQueue"),
        ({"priority_class": "High"}, "gke.priority_class: 'High' is not a PriorityClass"),
        ({"max_suspended_minutes": 0}, "gke.max_suspended_minutes: must be >= 1"),
        ({"ttl_after_finished_s": 300}, "gke.ttl_after_finished_s: 300 s is too close"),
        (
            {"poll_interval_s": 120, "ttl_after_finished_s": 1000},
            "gke.ttl_after_finished_s: 1000 s is too close",
        ),
        ({"outage_budget_s": 0}, "gke.outage_budget_s: must be > 0"),
        ({"run_retries": -1}, "gke.run_retries: must be >= 0"),
        ({"kubernetes_conn_id": " "}, "gke.kubernetes_conn_id: must be a non-empty string"),
        (
            {"kubernetes_conn_id": "k8s", "use_dns_endpoint": True},
            "gke.use_dns_endpoint: is a GKE lookup setting, unused when kubernetes_conn_id",
        ),
        (
            {"kubernetes_conn_id": "k8s", "impersonation_chain": ["a@b"]},
            "gke.impersonation_chain: is a GKE lookup setting",
        ),
    ],
)
def test_bad_values_name_the_key(mapping: dict, message: str) -> None:
    with pytest.raises(SettingError) as excinfo:
        read_table(GkeSettings, mapping, "gke")
    assert message in str(excinfo.value)


def test_direct_construction_validates_too() -> None:
    with pytest.raises(SettingError, match=r"^topology: '2x2x1x1'"):
        TpuJobShape(accelerator="tpu-v5p-slice", topology="2x2x1x1", slices=1, chips_per_host=4)
    with pytest.raises(SettingError, match=r"^namespace: 'under_score'"):
        GkeSettings(namespace="under_score")


def test_the_cluster_object_has_the_provider_mixins_fields() -> None:
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEOperatorMixin

    fields = {f.name for f in dataclasses.fields(GkeCluster)}
    # and the cncf-kubernetes connection that may stand in for the GKE lookup
    assert fields == set(GKEOperatorMixin.template_fields) | {"kubernetes_conn_id"}
    settings = GkeSettings(project_id="p", impersonation_chain=("a@b.iam.gserviceaccount.com",))
    assert all(getattr(settings.cluster, name) == getattr(settings, name) for name in fields)


def test_the_example_gke_deployment_renders_a_strictly_valid_jobset(strict_jobset) -> None:
    path = REPO / "docker" / "deployment.gke.example.toml"
    deployment = parse_deployment(path.read_text(), source=str(path), base_dir=path.parent)
    assert deployment.backend == "gke"
    gke = deployment.table("gke", GkeSettings)
    assert gke is not None
    train, evaluate = gke.train, gke.evaluate
    assert (train.chips_per_slice * train.slices, evaluate.chips_per_slice * evaluate.slices) == (
        128,
        64,
    )
    assert evaluate.slices == 16
    jobset = render_jobset(
        gke,
        role="train",
        dag_id="mlperf_grpo_run",
        run_id="scheduled__2026-05-01T00:00:00+00:00",
        job="train",
        command=TRAIN_JOB.render(
            {
                "python": "python",
                "run_dir": f"{deployment.storage_root}/seed_1",
                "seed": 1,
                "global_batch_size": 256,
                "max_steps": 60,
                "val_start_at": 18,
                "division": "closed",
            }
        ),
    )
    assert strict_jobset.errors(jobset) == []
    assert jobset["metadata"]["namespace"] == "mlperf"
    # the policy a production deployment wants, spelt out in the example
    assert re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", gke.image), gke.image
    assert gke.train.max_restarts >= 3 and deployment.eval_retries >= 1
    assert gke.queue_name and jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert gke.outage_budget_s >= 20 * 60


def test_the_watch_keys_are_named_as_on_slurm_and_an_older_name_is_refused() -> None:
    """``[gke]`` and ``[slurm]`` name the outage budget and the backoff ceiling alike; the
    names of an unreleased earlier version are refused, naming the key."""
    from tasks.backends.slurm.settings import SlurmSettings

    gke = {f.name for f in dataclasses.fields(GkeSettings)}
    slurm = {f.name for f in dataclasses.fields(SlurmSettings)}
    assert {"outage_budget_s", "backoff_max_s", "poll_interval_s"} <= gke & slurm
    new = read_table(GkeSettings, {"outage_budget_s": 300, "backoff_max_s": 7}, "gke")
    assert (new.outage_budget_s, new.backoff_max_s) == (300, 7)
    with pytest.raises(SettingError, match=r"gke: unknown key\(s\) api_error_budget_s"):
        read_table(GkeSettings, {"api_error_budget_s": 300}, "gke")
