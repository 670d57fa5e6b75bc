"""docker/deployment.nemo-rl.example.toml against the reference's launcher: its training job,
rendered by the real deployment parser and job inputs, run as the launcher runs it against a
stand-in run_and_time.sh (tests/foreign/launcher/) that requires what the real one requires
(SEED, the /checkpoint/${_experiment_index:-01} mount, MLPERF_TARGET_ACCURACY defaulting to
1.0); rcpflow then reads what it wrote: the MLLOG rcpflow named and the step_<N>/ tree at the
deployment's result path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from foreign.deployment import HERE
from repo_paths import REPO

import tasks.backends.registry  # noqa: F401  (registers the [slurm] table the example has)
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.nemo_rl import NemoRLError
from rcpflow.trainer.nemo_rl_import import import_checkpoint_tree
from tasks.backend_api.job_inputs import train_inputs
from tasks.deployment import parse_deployment
from tasks.run.train_result import checkpoint_root

EXAMPLE = REPO / "docker" / "deployment.nemo-rl.example.toml"
LAUNCHER = HERE / "launcher"  # the stand-ins of run_and_time.sh and of srun with Pyxis
SEED = 2


def _launch(
    tmp_path: Path, edit=lambda script: script
) -> tuple[str, str, subprocess.CompletedProcess[str]]:
    """The example's training job for seed SEED of a run under `tmp_path` (its script passed
    through `edit`), run as Slurm runs the batch step's first task: the run folder, the tree
    the deployment's result names, the process."""
    deployment = parse_deployment(EXAMPLE.read_text(), source=str(EXAMPLE), base_dir=EXAMPLE.parent)
    run_dir = str(tmp_path / "run")
    values: dict[str, str | int] = {
        "run_dir": run_dir, "seed": SEED, "global_batch_size": 16, "max_steps": 6,
        "val_start_at": 2, "division": "open",
    }  # fmt: skip
    inputs = train_inputs(deployment.jobs.train, values, sys.executable)
    argv = [*inputs["argv"][:-1], edit(inputs["argv"][-1])]
    env = {
        **os.environ,
        **inputs["env"],
        "PATH": f"{LAUNCHER}{os.pathsep}{os.environ['PATH']}",
        "SLURM_PROCID": "0",
        "STANDIN_PYTHON": sys.executable,
    }
    os.makedirs(os.path.dirname(RunLayout(run_dir).mllog(SEED)), exist_ok=True)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    root = checkpoint_root(run_dir, SEED, deployment.jobs.train.result)
    assert root is not None
    return run_dir, root, p


def test_the_example_runs_the_launcher_and_rcpflow_reads_what_it_wrote(tmp_path: Path) -> None:
    run_dir, root, p = _launch(tmp_path)
    assert p.returncode == 0, p.stderr
    layout = RunLayout(run_dir)
    assert root == f"{layout.checkpoints_dir}/01"  # /checkpoint/${_experiment_index:-01}
    found = import_checkpoint_tree(
        run_dir, root, seed=SEED, val_start_at=2, eval_schedule="after_training"
    )
    assert found.added == (2, 3, 4, 5, 6)
    rows = load(layout.manifest).rows
    assert rows[0].checkpoint_path == f"{root}/step_2" and rows[0].seed == SEED
    assert rows[0].mllog_file == layout.mllog(SEED) and rows[0].target_accuracy == 0.69


@pytest.mark.parametrize(
    ("drop", "said"),
    [
        ("SEED={seed} ", "SEED is not set"),
        ("/checkpoint,", "no container mount at /checkpoint"),
    ],
)
def test_without_what_the_launcher_requires_it_fails_naming_it(
    tmp_path: Path, drop: str, said: str
) -> None:
    rendered = drop.replace("{seed}", str(SEED))
    _, _, p = _launch(tmp_path, lambda script: script.replace(rendered, ""))
    assert p.returncode != 0 and said in p.stderr, p.stderr


def test_without_the_target_the_launchers_default_is_refused_at_import(tmp_path: Path) -> None:
    run_dir, root, p = _launch(tmp_path, lambda s: s.replace("MLPERF_TARGET_ACCURACY=0.69 ", ""))
    assert p.returncode == 0, p.stderr
    with pytest.raises(NemoRLError, match=r"target_accuracy"):
        import_checkpoint_tree(run_dir, root, seed=SEED, val_start_at=2)
