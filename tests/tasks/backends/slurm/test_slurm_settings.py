"""SlurmSettings: the [slurm] table read into frozen dataclasses; a bad value names its key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tasks.backends.slurm.settings import SlurmJobShape, SlurmSettings, time_limit_seconds
from tasks.settings import SettingError, read_table

BASE = {"working_dir": "/shared/rcpflow", "log_dir": "/shared/rcpflow/logs"}


def read(**table: object) -> SlurmSettings:
    return read_table(SlurmSettings, {**BASE, **table}, "slurm")


def test_defaults_and_overrides() -> None:
    settings = read(train={"nodes": 4, "gpus_per_node": 8, "partition": "gpu"})
    assert settings.transport == "local"
    assert settings.fail_exit_codes == (2, 5)
    train = settings.train
    assert (train.nodes, train.gpus_per_node, train.partition, train.tasks) == (4, 8, "gpu", 4)
    assert train.max_restarts == 3 and train.signal_grace_s == 600  # kept from the default
    assert settings.evaluate.max_restarts == 2
    assert settings.shape("train") is train
    assert settings.export_env == () and read(export_env=["HTTP_PROXY"]).export_env == (
        "HTTP_PROXY",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.python = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ({"working_dir": "relative"}, "slurm.working_dir", "absolute"),
        ({"transport": "ssh"}, "slurm.ssh_conn_id", "SSH connection"),
        ({"transport": "rest", "rest_conn_id": "c"}, "slurm.rest_url", "URL"),
        ({"transport": "rest", "rest_url": "http://h:1"}, "slurm.rest_conn_id", "JWT"),
        ({"transport": "pigeon"}, "slurm.transport", "one of"),
        ({"poll_interval_s": 400}, "slurm.poll_interval_s", "MinJobAge"),
        ({"fail_exit_codes": [2, 143]}, "slurm.fail_exit_codes", "SIGTERM"),
        ({"fail_exit_codes": [1]}, "slurm.fail_exit_codes", "uncaught"),
        ({"train": {"nodes": True}}, "slurm.train.nodes", "must be int"),
        ({"export_env": ["AIRFLOW__CORE__FERNET_KEY"]}, "slurm.export_env[0]", "never leave"),
        ({"export_env": ["HTTP_PROXY", "a b"]}, "slurm.export_env[1]", "not a variable name"),
        ({"train": {"extra_sbatch_args": ["--export=ALL"]}}, "slurm.train.extra_sbatch_args[0]",
         "export_env"),
        ({"train": {"extra_sbatch_args": ["--comment=x"]}}, "slurm.train.extra_sbatch_args[0]",
         "comment"),
    ],
)  # fmt: skip
def test_a_bad_setting_names_its_key(table: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(SettingError) as caught:
        read(**table)
    assert caught.value.key == key, caught.value
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("role", "shape", "key", "words"),
    [
        ("train", {"nodes": 0}, "nodes", ">= 1"),
        ("train", {"gres": "gpu:4", "gpus_per_node": 4}, "gres", "not both"),
        ("train", {"time_limit": "1h"}, "time_limit", "sbatch --time"),
        ("train", {"time_limit": "10"}, "signal_grace_s", "not less than"),
        ("train", {"partition": "a b"}, "partition", "Slurm name"),
        ("train", {"mem": "lots"}, "mem", "--mem"),
        ("evaluate", {"extra_sbatch_args": ["--time=5"]}, "extra_sbatch_args[0]", "time_limit"),
        (
            "evaluate",
            {"extra_sbatch_args": ["--comment=a b"]},
            "extra_sbatch_args[0]",
            "whitespace",
        ),
        (
            "evaluate",
            {"extra_sbatch_args": ["exclusive"]},
            "extra_sbatch_args[0]",
            "one sbatch option",
        ),
        ("evaluate", {"extra_sbatch_args": ["-x=n1"]}, "extra_sbatch_args[0]", "long form"),
        ("evaluate", {"container_mounts": ["/a:/b"]}, "container_mounts", "container_image"),
        (
            "evaluate",
            {"container_image": "img", "container_mounts": ["a"]},
            "container_mounts[0]",
            "SRC:DST",
        ),
        ("train", {"secret_env": {"HF_TOKEN": {}}}, "secret_env.HF_TOKEN", "exactly one"),
        (
            "train",
            {"secret_env": {"HF_TOKEN": {"file": "rel"}}},
            "secret_env.HF_TOKEN.file",
            "absolute",
        ),
        (
            "train",
            {"secret_env": {"RCPFLOW_X": {"env": "A"}}},
            "secret_env.RCPFLOW_X",
            "set by rcpflow",
        ),
    ],
)
def test_a_bad_job_shape_names_its_key(
    role: str, shape: dict[str, object], key: str, words: str
) -> None:
    """As above, for a key of the [slurm.<role>] table: slurm.<role>.<key>."""
    test_a_bad_setting_names_its_key({role: shape}, f"slurm.{role}.{key}", words)


def test_good_extra_args_and_containers() -> None:
    shape = read_table(
        SlurmJobShape,
        {
            "extra_sbatch_args": ["--exclusive", "--segment=8", "--gpu-bind=closest"],
            "container_image": "nvcr.io#nvidia/pytorch:24.01-py3",
            "container_mounts": ["/lustre/data:/data", "/lustre/ckpt:/checkpoints"],
            "secret_env": {
                "HF_TOKEN": {"file": "/home/u/.hf_token"},
                "WANDB_API_KEY": {"env": "WK"},
            },
        },
    )
    assert shape.secret_env["HF_TOKEN"].file == "/home/u/.hf_token"
    assert shape.secret_env["WANDB_API_KEY"].env == "WK"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90", 5400),
        ("2:30", 150),
        ("1:00:00", 3600),
        ("1-2", 93600),
        ("1-0:30", 88200),
        ("2-00:00:01", 172801),
    ],
)
def test_time_limit_forms(value: str, seconds: int) -> None:
    assert time_limit_seconds(value) == seconds


def test_the_example_deployment_parses() -> None:
    from repo_paths import REPO

    import tasks.backends.registry  # noqa: F401  (registers the [slurm] table)
    from tasks.backend_api.protocol import driver_for
    from tasks.deployment import parse_deployment

    path = REPO / "docker" / "deployment.slurm.example.toml"
    deployment = parse_deployment(path.read_text(), source=str(path), base_dir=path.parent)
    settings = deployment.tables["slurm"]
    assert isinstance(settings, SlurmSettings)
    assert (settings.transport, settings.train.nodes, settings.train.gpus_per_node) == (
        "ssh",
        16,
        8,
    )
    assert settings.train.secret_env["HF_TOKEN"].file.endswith("hf_token")
    assert driver_for(deployment).name == "slurm"


def test_a_job_image_or_kubernetes_secret_on_slurm_names_the_slurm_setting() -> None:
    from pathlib import Path

    from tasks.backends.registry import driver_for
    from tasks.deployment import DeploymentError, parse_deployment

    text = (
        'backend = "slurm"\n[slurm]\nworking_dir = "/w"\nlog_dir = "/l"\n'
        '[jobs.train]\nimage = "img"\n'
    )
    with pytest.raises(DeploymentError, match=r"jobs\.train\.image.*slurm\.train\.container_image"):
        driver_for(parse_deployment(text, source="d.toml", base_dir=Path("/")))


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (
            '[jobs.evaluate]\ncommand = ["{python}", "e.py", "{checkpoint_path}"]\n',
            "checkpoint_path",
        ),
        ("[slurm.evaluate]\nnodes = 3\n", "slurm.evaluate.nodes=3"),
        (
            '[jobs.evaluate]\ncommand = ["{python}", "e.py", "{step}"]\n'
            'result = { format = "rcpflow-summary", path = "{checkpoint_path}/{step}.json" }\n',
            "jobs.evaluate.result.path uses checkpoint_path",
        ),
    ],
)
def test_evaluation_in_the_allocation_refuses_what_it_cannot_do(extra: str, words: str) -> None:
    from pathlib import Path

    import tasks.backends.registry  # noqa: F401  (registers the [slurm] table)
    from tasks.backend_api.protocol import driver_for
    from tasks.deployment import DeploymentError, parse_deployment

    text = (
        'backend = "slurm"\n[slurm]\nworking_dir = "/w"\nlog_dir = "/l"\n'
        "eval_in_training_allocation = true\n[slurm.train]\nnodes = 2\n" + extra
    )
    deployment = parse_deployment(text, source="d.toml", base_dir=Path("/"))
    with pytest.raises(DeploymentError, match="eval_in_training_allocation") as caught:
        driver_for(deployment)
    assert words in str(caught.value)


def test_a_foreign_result_is_imported_in_the_allocation_by_the_evaluate_steps_rule() -> None:
    """The rehearsal's evaluator (a Tunix-style tree) in the training's allocation: the batch
    script records each step's start (`rcpflow eval start`) and imports what the evaluation
    left since (`rcpflow eval import --since`); a failed import leaves the step to the DAG."""
    import subprocess

    from repo_paths import REPO

    import tasks.backends.registry  # noqa: F401  (registers the [slurm] table)
    from tasks.backend_api.protocol import driver_for
    from tasks.backends.slurm.driver import SlurmDriver
    from tasks.backends.slurm.in_allocation import in_allocation_eval, in_allocation_fields
    from tasks.backends.slurm.script import BatchJob, render_script
    from tasks.deployment import parse_deployment

    rehearsal = (REPO / "docker" / "deployment.rehearsal.toml").read_text()
    text = rehearsal.replace('backend = "local"', 'backend = "slurm"') + (
        '[slurm]\nworking_dir = "/w"\nlog_dir = "/l"\npython = "/py"\n'
        "eval_in_training_allocation = true\n"
    )
    deployment = parse_deployment(text, source="d.toml", base_dir=Path("/"))
    driver = driver_for(deployment)  # accepted: the import is the script's
    assert isinstance(driver, SlurmDriver)
    values: dict[str, str | int] = {
        "run_dir": "/runs/r1", "seed": 1, "val_start_at": 18, "max_steps": 30,
    }  # fmt: skip
    fields = driver.train_extra(values)  # what the run DAG's train_command returns
    assert fields is not None
    assert fields == in_allocation_fields(deployment.jobs.evaluate, driver.settings, values)
    assert (fields["result_format"], fields["result_path"]) == (
        "tunix-tree",
        "/runs/r1/rehearsal_eval",
    )
    then = in_allocation_eval(fields)
    job = BatchJob("n", ("/py",), driver.settings.train, "/w", "/l", then_evaluate=then)
    script = render_script(job)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    start = (
        'rcpflow_started="$(/py -m rcpflow eval start /runs/r1 /runs/r1/rehearsal_eval '
        '--step "$rcpflow_step" --format=tunix-tree)"'
    )
    imported = (
        "/py -m rcpflow eval import /runs/r1 /runs/r1/rehearsal_eval "
        '--step "$rcpflow_step" --format=tunix-tree --since "$rcpflow_started"'
    )
    assert start in script and imported in script, script
    # the import comes only after an evaluation that ended 0, and a failed one says so
    lines = script.splitlines()
    at = next(i for i, line in enumerate(lines) if imported in line)
    assert lines[at - 2].strip() == 'if [ "$rcpflow_eval_rc" -ne 0 ]; then'
    assert "left to the DAG's evaluate task" in lines[at + 1]


def test_the_nemo_rl_example_deployment_parses() -> None:
    """docker/deployment.nemo-rl.example.toml: the Slurm backend, NeMo-RL's result formats, and
    the trainer's env gets the run folder's MLLOG (`job_inputs.run_env`)."""
    from repo_paths import REPO

    import tasks.backends.registry  # noqa: F401  (registers the [slurm] table)
    from rcpflow.files.layout import RunLayout
    from tasks.backend_api.job_inputs import train_inputs
    from tasks.backend_api.protocol import driver_for
    from tasks.deployment import parse_deployment

    path = REPO / "docker" / "deployment.nemo-rl.example.toml"
    deployment = parse_deployment(path.read_text(), source=str(path), base_dir=path.parent)
    settings = deployment.tables["slurm"]
    assert isinstance(settings, SlurmSettings)
    assert (settings.transport, settings.train.nodes, settings.train.max_restarts) == ("ssh", 64, 0)
    assert driver_for(deployment).name == "slurm"
    train = deployment.jobs.train
    assert train.result.imported
    run_dir = f"{deployment.storage_root}/r1"
    values: dict[str, str | int] = {
        "run_dir": run_dir, "seed": 3, "global_batch_size": 1024, "max_steps": 40,
        "val_start_at": 18, "division": "closed",
    }  # fmt: skip
    inputs = train_inputs(train, values, settings.python)
    assert inputs["env"] == {"MLPERF_MLLOG_FILE": RunLayout(run_dir).mllog(3)}
    script = inputs["argv"][-1]
    assert "SEED=3 " in script and "SEED_BASE" not in script
    assert f"--container-mounts={RunLayout(run_dir).checkpoints_dir}:/checkpoint," in script
    assert "MLPERF_TARGET_ACCURACY=0.69 " in script
