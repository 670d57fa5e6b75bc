"""dag.test() of mlperf_grpo_run with the MaxText deployment (docker/deployment.maxtext.toml): the
job templates run MaxText's trainer and evaluator (tpu_jobs/maxtext/) in MaxText's own
environment (a Python 3.13 venv in a Debian 13 root, devtools/servers/maxtext_env.py) on the
local backend, to a compliant log: native scanned checkpoints every step from the validation
start, each evaluated through MaxText's own scanned -> unscanned conversion.

As in tests/tpu_jobs/maxtext/, the environment is built here if it is missing (as root, about 2
minutes; ``make system-packages`` builds it first), and the test is skipped, naming what is
missing, only where it can be neither built nor entered (not root, no debootstrap).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
import pytest
from airflow_harness import REPO, failures, launched_jobs, recording_python, run_dag_test
from etils import epath
from maxtext_ready import ensure_maxtext_env
from passing_runs import check_passed

from devtools.servers import maxtext_env
from tasks.deployment import parse_deployment
from tpu_jobs.maxtext.checkpoints import items_path, read_record
from tpu_jobs.maxtext.config import PARAM_SCAN_AXIS, ModelConfig
from tpu_jobs.rcp.checkpoint_format import COMMIT_MARKER

MAXTEXT_DEPLOYMENT = REPO / "docker" / "deployment.maxtext.toml"
TRAIN, EVALUATE = "tpu_jobs.maxtext.train", "tpu_jobs.maxtext.evaluate"
# Seed 0 of the MaxText job (the default model, gbs 256, the open rate) passes pass@4 > 0.69 at
# step 19 (docs/maxtext.md: 0.661 at step 18, 0.697 at 19, evaluated through MaxText's
# conversion): one evaluation below the target, one above; step 20, the last, is left to skip
# (the smallest run that shows all three; each evaluation is a MaxText process of ~10 s).
SEED, GBS, VAL_START, MAX_STEPS = 0, 256, 18, 20
MAXTEXT_RUN = {
    "seed": SEED,
    "global_batch_size": GBS,
    "max_steps": MAX_STEPS,
    "val_start_at": VAL_START,
    "division": "open",
}


@pytest.fixture(scope="module")
def maxtext_python() -> Path:
    """MaxText's job Python (the wrapper `devtools.servers.maxtext_env` writes), the
    environment built first if missing, as for tests/tpu_jobs/maxtext/ (`maxtext_ready`)."""
    ensure_maxtext_env()
    return maxtext_env.write_wrapper()


def saved_param_shapes(step_folder: str) -> dict[str, Any]:
    """The shapes and dtypes of a MaxText step folder's parameters (``params.params.<tree>`` of
    ``items/``), from Orbax's metadata: no array is read."""
    reader = ocp.PyTreeCheckpointer()
    tree = reader.metadata(epath.Path(items_path(step_folder))).item_metadata.tree
    return jax.tree.map(lambda m: (tuple(m.shape), str(m.dtype)), tree["params"]["params"])


def test_the_maxtext_deployment_runs_the_maxtext_jobs_in_their_environment() -> None:
    d = parse_deployment(
        MAXTEXT_DEPLOYMENT.read_text(),
        source=str(MAXTEXT_DEPLOYMENT),
        base_dir=MAXTEXT_DEPLOYMENT.parent,
    )
    assert d.backend == "local" and d.storage_root == str(REPO / "runs")
    assert Path(d.python) == maxtext_env.wrapper_path().resolve()  # not the Airflow side's Python
    assert d.jobs.train.command[:3] == ("{python}", "-m", TRAIN)
    assert d.jobs.evaluate.command[:3] == ("{python}", "-m", EVALUATE)
    assert d.jobs.evaluate.result.format == "rcpflow"  # the evaluator writes rcpflow's summary


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_run_dag_with_the_maxtext_jobs_ends_compliant(
    airflow_db: str, tmp_path: Path, run_dir: Path, maxtext_python: Path
) -> None:
    # The jobs' arguments recorded (airflow_harness), then MaxText's Python runs the job.
    python, record = recording_python(
        tmp_path, before_run=f"os.execv({str(maxtext_python)!r}, ['python', *sys.argv[1:]])\n"
    )
    # The shipped file, with only the interpreter swapped for the recording one and run_dir in
    # the test's temp dir, outside the file's storage root.
    shipped = MAXTEXT_DEPLOYMENT.read_text()
    text, swapped = re.subn(r"(?m)^python = .*$", f'python = "{python}"', shipped)
    assert swapped == 1
    deployment = tmp_path / "deployment.toml"
    deployment.write_text("allow_run_dirs_outside_root = true\n" + text)

    result = run_dag_test("mlperf_grpo_run", {**MAXTEXT_RUN, "run_dir": str(run_dir)}, deployment)

    assert result.state == "success", failures(result)
    jobs = [j.split() for j in launched_jobs(record)]
    assert all(j[:2] in (["-m", TRAIN], ["-m", EVALUATE]) for j in jobs), jobs
    assert sum(j[1] == TRAIN for j in jobs) == 1
    evaluated = [int(j[j.index("--step") + 1]) for j in jobs if j[1] == EVALUATE]
    assert len(evaluated) == len(set(evaluated))  # no checkpoint evaluated twice

    first, last = VAL_START, MAX_STEPS
    passed, rows = check_passed(
        result, run_dir, seed=SEED, gbs=GBS, first=first, evaluated=evaluated
    )
    assert first < passed <= last  # it learns: a step below the target first
    # A checkpoint per update from the validation start (training may stop early, after the
    # stop request that the passing step brings, but not before that step).
    assert [r.step for r in rows] == list(range(first, rows[-1].step + 1))
    assert rows[-1].step >= passed
    # MaxText's own step folders, committed, scanned (MaxText's `scan_layers` in the metadata,
    # read_record refuses others), each holding the record of its row's update and weights.
    for r in rows:
        assert r.checkpoint_path == str(run_dir / "checkpoints" / str(r.step))
        assert Path(r.checkpoint_path, COMMIT_MARKER).exists()
        assert Path(items_path(r.checkpoint_path)).is_dir()
        rec = read_record(r.checkpoint_path)
        assert (rec.step, rec.timestamp_ms) == (r.step, r.timestamp_ms)
        assert rec.weights_fingerprint == r.weights_fingerprint
    assert len({r.weights_fingerprint for r in rows}) == len(rows)  # every update changed them
    # MaxText's scanned layout on disk: the decoder's layers stacked into one `layers` subtree,
    # the layer index on axis 1 (param_scan_axis), float32 as trained.
    model = ModelConfig.from_json(read_record(rows[-1].checkpoint_path).model, "record")
    n, emb, mlp = model.num_layers, model.emb_dim, model.mlp_dim
    params = saved_param_shapes(rows[-1].checkpoint_path)
    assert PARAM_SCAN_AXIS == 1 and not [k for k in params["decoder"] if k.startswith("layers_")]
    stacked = jax.tree.leaves(params["decoder"]["layers"], is_leaf=lambda x: isinstance(x, tuple))
    assert stacked and all(shape[PARAM_SCAN_AXIS] == n for shape, _ in stacked)
    assert params["decoder"]["layers"]["mlp"]["wi_0"]["kernel"] == ((emb, n, mlp), "float32")
    assert params["decoder"]["layers"]["pre_self_attention_layer_norm"]["scale"] == (
        (emb, n),
        "float32",
    )
    assert params["decoder"]["decoder_norm"]["scale"] == ((emb,), "float32")  # not stacked
    # instances for steps after the passing one are skipped unless they ran first
    states = result.mapped("evaluation.checkpoint.evaluate")
    assert len(states) == last - first + 1
    by_step = dict(zip(range(first, last + 1), states, strict=True))
    assert all(by_step[s] == "success" for s in range(first, passed + 1))
    assert all(by_step[s] in ("skipped", "success") for s in range(passed + 1, last + 1))
