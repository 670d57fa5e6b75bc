"""Deployment settings, the backends they choose, the job commands and the local job runner,
without running Airflow."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.settings import GkeSettings
from tasks.backends.local.driver import LocalDriver
from tasks.backends.registry import driver_for, form_defaults, registered
from tasks.deployment import (
    REPO_ROOT,
    DeploymentError,
    load_deployment,
    parse_deployment,
)
from tasks.jobs.command import (
    EVALUATE_JOB,
    PLACEHOLDERS,
    ROLES,
    TRAIN_JOB,
    JobCommand,
    JobCommandError,
)
from tasks.run.spec import RunSpec


def test_embedded_default_is_local_cpu_under_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RCPFLOW_DEPLOYMENT", raising=False)
    d = load_deployment()
    assert (d.backend, d.eval_window, d.schedule) == ("local", 1, None)
    assert d.storage_root == str(REPO_ROOT / "runs")
    assert d.job_env["JAX_PLATFORMS"] == "cpu"
    assert d.job_python == sys.executable


def test_a_file_overrides_and_resolves_relative_paths(tmp_path: Path) -> None:
    text = 'storage_root = "out"\neval_window = 3\nsubmission_schedule = "@weekly"\n'
    text += 'python = "venv/bin/python"\n'
    d = parse_deployment(text, source="f.toml", base_dir=tmp_path)
    assert d.storage_root == str(tmp_path / "out")
    assert (d.eval_window, d.schedule) == (3, "@weekly")
    assert d.job_python == str(tmp_path / "venv" / "bin" / "python")
    gcs = parse_deployment('storage_root = "gs://b/p/"\n', source="f.toml", base_dir=tmp_path)
    assert gcs.storage_root == "gs://b/p"


def test_the_gke_table_is_read_with_its_nested_shapes(tmp_path: Path) -> None:
    text = 'backend = "gke"\n[gke]\nimage = "i:1"\n[gke.train]\ntopology = "4x4x16"\n'
    d = parse_deployment(text, source="f.toml", base_dir=tmp_path)
    gke = d.table("gke", GkeSettings)
    assert gke is not None
    assert (gke.image, gke.train.slices, gke.train.topology) == ("i:1", 1, "4x4x16")
    assert gke.evaluate.slices == 16  # a table left out keeps its default shape


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "eval_windw = 2\n",
            "unknown key(s) eval_windw (allowed: allow_run_dirs_outside_root, backend,",
        ),
        ('source = "x"\n', "unknown key(s) source"),  # not a setting
        ('eval_window = "2"\n', "eval_window: must be int, got str '2'"),
        ("eval_window = true\n", "eval_window: must be int, got bool True"),
        ("eval_window = 0\n", "eval_window: must be >= 1, got 0"),
        ("eval_retries = -1\n", "eval_retries: must be >= 0, got -1"),
        ('storage_root = ""\n', "storage_root: must not be empty"),
        ('[gke]\ncluster_nam = "x"\n', "gke: unknown key(s) cluster_nam"),
        ('[gke.train]\ntopology = "4x4"\n', "gke.train.topology: '4x4' is not a 3-D topology"),
        ("[gke.evaluate]\nslices = 0\n", "gke.evaluate.slices: must be >= 1, got 0"),
        ("gke = 3\n", "gke: must be a table, got int"),
        ("[job_env]\nX = 1\n", "job_env.X: must be str, got int 1"),
        ("eval_window = \n", "not valid TOML"),
    ],
)
def test_bad_settings_name_the_file_and_the_key(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(DeploymentError) as refused:
        parse_deployment(text, source="f.toml", base_dir=tmp_path)
    assert str(refused.value).startswith("f.toml: ")
    assert named in str(refused.value)


def test_every_backend_name_has_a_backend_and_the_deployment_chooses_it(tmp_path: Path) -> None:
    backends = registered()
    # The names are the registry's: every package under tasks/backends registers its driver.
    assert set(backends) == {"local", "gke", "slurm"}
    assert all(cls.name == name for name, cls in backends.items())
    local = driver_for(parse_deployment("", source="f.toml", base_dir=tmp_path))
    assert isinstance(local, LocalDriver)
    text = 'backend = "gke"\n[gke]\nimage = "i:1"\n'
    gke = driver_for(parse_deployment(text, source="f.toml", base_dir=tmp_path))
    assert isinstance(gke, GkeDriver) and gke.settings.image == "i:1"


def test_the_gke_backend_needs_its_table(tmp_path: Path) -> None:
    deployment = parse_deployment('backend = "gke"\n', source="f.toml", base_dir=tmp_path)
    with pytest.raises(DeploymentError, match=r"^f.toml: backend 'gke' needs a \[gke\] table"):
        driver_for(deployment)


def _spec(**changes: object) -> RunSpec:
    fields = {
        "run_dir": "/r; rm -rf /",
        "seed": 1,
        "global_batch_size": 256,
        "max_steps": 40,
        "val_start_at": None,
        "division": "open",
    }
    return RunSpec.from_dict({**fields, **changes})


def test_the_default_commands_are_argument_lists_without_a_shell() -> None:
    argv = TRAIN_JOB.render({"python": "/py", **_spec().job_values()})
    assert argv[:3] == ["/py", "-m", "tpu_jobs.train"]
    assert argv[argv.index("--run-dir") + 1] == "/r; rm -rf /"  # one argument, never parsed
    assert argv[argv.index("--val-start-at") + 1] == "18"  # the recipe's ceil(2.5 + 3840/256)
    override = TRAIN_JOB.render({"python": "/py", **_spec(val_start_at=5).job_values()})
    assert override[override.index("--val-start-at") + 1] == "5"
    assert EVALUATE_JOB.render({"python": "p", "run_dir": "/r", "step": 18}) == [
        "p",
        "-m",
        "tpu_jobs.evaluate",
        "--run-dir",
        "/r",
        "--step",
        "18",
    ]
    for command in (TRAIN_JOB, EVALUATE_JOB):
        assert command.role in ROLES and command.placeholders <= PLACEHOLDERS[command.role]


def test_a_command_fills_each_item_on_its_own() -> None:
    command = JobCommand("evaluate", ("{python}", "--out={run_dir}/step_{step}", "{{literal}}"))
    values = {"python": "py", "run_dir": "/a b", "step": 3}
    assert command.render(values) == ["py", "--out=/a b/step_3", "{literal}"]
    assert command.render({**values, "run_dir": "{step}"})[1] == "--out={step}/step_3"


@pytest.mark.parametrize(
    ("role", "argv", "named"),
    [
        ("evaluate", ("{python}", "--x", "{sed}"), "argv[2] '{sed}': unknown placeholder {sed}"),
        (
            "evaluate",
            ("{python}", "{max_steps}"),
            "{max_steps} is a placeholder of train jobs, not of evaluate jobs",
        ),
        ("train", ("{python}", "{step}"), "{step} is a placeholder of evaluate jobs, not of train"),
        ("train", ("{seed!r}",), "a placeholder is a bare {name}, got {seed!r}"),
        ("train", ("{seed:>4}",), "a placeholder is a bare {name}, got {seed:>4}"),
        ("train", ("{}",), "a placeholder is a bare {name}"),
        ("train", ("{run_dir",), "argv[0] '{run_dir'"),
        ("train", (), "argv is empty"),
    ],
)
def test_malformed_commands_are_refused_naming_the_item(
    role: typing.Any, argv: tuple[str, ...], named: str
) -> None:
    with pytest.raises(JobCommandError) as refused:
        JobCommand(role, argv)
    assert named in str(refused.value)


def test_rendering_without_a_value_names_the_placeholder() -> None:
    with pytest.raises(JobCommandError, match="evaluate command: no value for step"):
        EVALUATE_JOB.render({"python": "p", "run_dir": "/r"})


def test_a_backend_table_nobody_registered_says_what_to_import(tmp_path: Path) -> None:
    # In a fresh interpreter that imported no backend, [gke] has no reader yet.
    code = (
        "from pathlib import Path\n"
        "from tasks.deployment import DeploymentError, parse_deployment\n"
        "try:\n"
        "    parse_deployment('[gke]\\nimage = \"i:1\"\\n', source='f.toml', base_dir=Path('.'))\n"
        "except DeploymentError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "f.toml: gke: no key of the deployment and no registered backend's settings table" in (
        proc.stdout
    )
    assert "registered: none; import tasks.backends.registry" in proc.stdout


def test_a_backend_nobody_registered_is_the_deployments_error(tmp_path: Path) -> None:
    deployment = parse_deployment('backend = "ray"\n', source="f.toml", base_dir=tmp_path)
    with pytest.raises(DeploymentError, match=r"^f.toml: backend: 'ray' is not a registered "):
        driver_for(deployment)
    with pytest.raises(DeploymentError, match=r"\(gke, local, slurm\)$"):
        form_defaults(deployment)


@pytest.mark.parametrize("name", ["", "GKE", "gke ", "a-b", "x" * 33, "gke\n"])
def test_a_backend_name_is_checked_whole(tmp_path: Path, name: str) -> None:
    with pytest.raises(DeploymentError, match=r"^f.toml: backend: .* is not a backend name"):
        parse_deployment(
            f"backend = {name!r}\n".replace("'", '"'), source="f.toml", base_dir=tmp_path
        )


@pytest.mark.parametrize(
    ("backend", "jobs", "refusal"),
    [
        (
            "local",
            '[jobs.train]\nimage = "i:1"\n',
            "f.toml: jobs.train.image: only the gke backend runs images (backend is 'local')",
        ),
        (
            "slurm",
            '[jobs.evaluate]\nimage = "i:1"\n',
            "f.toml: jobs.evaluate.image: only the gke backend runs images (backend is 'slurm'); "
            "on slurm give slurm.evaluate.container_image",
        ),
        (
            "slurm",
            '[jobs.train]\nsecret_env = { HF_TOKEN = { secret = "hf", key = "token" } }\n',
            "f.toml: jobs.train.secret_env: only the gke backend takes Secret envs "
            "(backend is 'slurm'); on slurm give slurm.train.secret_env",
        ),
    ],
)
def test_a_jobs_key_the_backend_does_not_run_is_refused(
    tmp_path: Path, backend: str, jobs: str, refusal: str
) -> None:
    text = f'backend = "{backend}"\n{jobs}'
    if backend == "slurm":
        text += '[slurm]\nworking_dir = "/w"\nlog_dir = "/l"\n'
    deployment = parse_deployment(text, source="f.toml", base_dir=tmp_path)
    with pytest.raises(DeploymentError) as refused:
        driver_for(deployment)
    assert str(refused.value) == refusal
