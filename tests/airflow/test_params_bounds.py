"""Every integer Param has rcpflow's bounds, in the form (the JSON schema a REST trigger is
validated against) and in ``plan``; every setting is a finite number; run folders stay under
the storage root unless the deployment allows others."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import run_dag_test, submission_params, write_deployment

from rcpflow import recipe
from tasks.backends import registry  # noqa: F401  (registers the [gke] table)
from tasks.deployment import DeploymentError, parse_deployment
from tasks.names import DEFERRED_EVAL_DAG_ID, RUN_DAG_ID, SUBMISSION_DAG_ID
from tasks.run.spec import ParamError, check_under_root, run_spec
from tasks.submission.spec import submission_spec

HUGE = (2**63, 2**64)  # the probe's values: beyond rcpflow's reader, beyond msgspec's ints
RUN = {
    "run_dir": "/data/runs/r1",
    "seed": 1,
    "global_batch_size": 256,
    "max_steps": 40,
    "val_start_at": None,
    "division": "open",
    "eval_schedule": "after_training",
    "eval_window": 1,
}
LOCAL = {"backend": "local", "source": "<embedded default>"}


def _submission(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return submission_params(tmp_path / "root", **changes)


@pytest.fixture(scope="module")
def serialized(dagbag: Any) -> dict[str, Any]:
    """Each DAG as the API server holds it: a trigger's conf is validated against these."""
    from airflow.serialization.serialized_objects import DagSerialization

    return {
        dag_id: DagSerialization.from_dict(DagSerialization.to_dict(dagbag.get_dag(dag_id)))
        for dag_id in (RUN_DAG_ID, SUBMISSION_DAG_ID, DEFERRED_EVAL_DAG_ID)
    }


def _integer_schemas(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The integer schemas in a Param's schema (itself, or its array's items)."""
    kinds = schema.get("type")
    found = (
        [schema] if kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds) else []
    )
    if isinstance(schema.get("items"), dict):
        found += _integer_schemas(schema["items"])
    return found


def test_every_integer_param_of_every_dag_has_a_minimum_and_a_maximum(
    serialized: dict[str, Any],
) -> None:
    counted = 0
    for dag_id, dag in serialized.items():
        for name, param in dag.params.items():
            for schema in _integer_schemas(param.schema):
                counted += 1
                assert "minimum" in schema and "maximum" in schema, f"{dag_id}: {name}"
                assert schema["maximum"] < 2**63, f"{dag_id}: {name}"
    assert counted >= 8  # each DAG: the 3 training Params and the seed(s)


@pytest.mark.parametrize(
    ("dag_id", "name", "at_bound", "beyond"),
    [
        (RUN_DAG_ID, "max_steps", recipe.MAX_STEPS_LIMIT, (recipe.MAX_STEPS_LIMIT + 1, *HUGE)),
        (SUBMISSION_DAG_ID, "max_steps", recipe.MAX_STEPS_LIMIT, HUGE),
        (RUN_DAG_ID, "val_start_at", 40, (recipe.MAX_STEPS_LIMIT + 1, *HUGE)),
        (RUN_DAG_ID, "seed", recipe.MAX_SEED, (recipe.MAX_SEED + 1, *HUGE)),
        (
            RUN_DAG_ID,
            "global_batch_size",
            recipe.MAX_GLOBAL_BATCH_SIZE,
            (recipe.MAX_GLOBAL_BATCH_SIZE + 16, 2**64),
        ),
        (SUBMISSION_DAG_ID, "seeds", [1, 2, recipe.MAX_SEED], ([1, 2, 2**63], [1, 2, 2**64])),
    ],
)
def test_a_trigger_beyond_a_bound_is_refused_naming_the_param(
    serialized: dict[str, Any], dag_id: str, name: str, at_bound: Any, beyond: tuple[Any, ...]
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    params = serialized[dag_id].params
    base = {"run_dir": "/data/runs/r1"} if dag_id == RUN_DAG_ID else {}
    params.deep_merge({**base, name: at_bound}).validate()  # the bound itself is fine
    for value in beyond:
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {name}:"):
            params.deep_merge({**base, name: value}).validate()


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("max_steps", 2**63, "max_steps: must be an integer in 1..100000"),
        ("max_steps", 2**64, "max_steps: must be an integer in 1..100000"),
        ("max_steps", 100_001, "max_steps: must be an integer in 1..100000"),
        ("val_start_at", 2**64, "val_start_at: must be an integer in 1..100000"),
        ("seed", 2**32, f"seed: must be an integer in 0..{recipe.MAX_SEED}"),
        ("global_batch_size", 2**64, "global_batch_size: must be an integer in 1..1048576"),
        ("global_batch_size", 2**20 + 16, "global_batch_size: must be an integer in 1..1048576"),
    ],
)
def test_plan_refuses_a_value_beyond_a_bound_naming_the_param(
    name: str, value: int, named: str
) -> None:
    with pytest.raises(ParamError) as refused:
        run_spec({**RUN, name: value})
    assert str(refused.value).startswith(named)
    assert run_spec({**RUN, "max_steps": recipe.MAX_STEPS_LIMIT}).max_steps == 100_000


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"max_steps": 2**63}, "max_steps: must be an integer in 1..100000"),
        ({"max_steps": 2**64}, "max_steps: must be an integer in 1..100000"),
        ({"seeds": [1, 2, 2**64]}, "seeds: must be a list of integers in 0.."),
    ],
)
def test_the_submission_plan_refuses_them_too(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ParamError) as refused:
        submission_spec(_submission(tmp_path, **changes), run_id="r", **LOCAL)
    assert str(refused.value).startswith(named)


def test_the_form_defaults_table_is_bounded_by_the_same_limit(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match=r"form_defaults\.max_steps: must be in 1\.\.100000"):
        parse_deployment("[form_defaults]\nmax_steps = 100001\n", source="f", base_dir=tmp_path)


@pytest.mark.parametrize("word", ["nan", "inf", "-inf", "+nan"])
@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("checkpoint_poll_seconds = {}\n", "checkpoint_poll_seconds"),
        (
            'backend = "gke"\n[gke]\nproject_id = "p"\ncluster_name = "c"\nimage = "i:1"\n'
            "poll_interval_s = {}\n",
            "gke.poll_interval_s",
        ),
        (
            'backend = "gke"\n[gke]\nproject_id = "p"\ncluster_name = "c"\nimage = "i:1"\n'
            "outage_budget_s = {}\n",
            "gke.outage_budget_s",
        ),
    ],
)
def test_a_non_finite_setting_is_refused_naming_the_table_and_key(
    tmp_path: Path, toml: str, key: str, word: str
) -> None:
    with pytest.raises(DeploymentError) as refused:
        parse_deployment(toml.format(word), source="d.toml", base_dir=tmp_path)
    value = float(word)
    assert not math.isfinite(value)
    assert str(refused.value) == f"d.toml: {key}: must be a finite number, got {value!r}"


def _deployment(tmp_path: Path, **settings: Any) -> Any:
    lines = [f'storage_root = "{tmp_path / "root"}"']
    lines += [f"{k} = {str(v).lower()}" for k, v in settings.items()]
    return parse_deployment("\n".join(lines) + "\n", source="d.toml", base_dir=tmp_path)


def test_a_run_dir_under_the_storage_root_is_accepted(tmp_path: Path) -> None:
    deployment = _deployment(tmp_path)
    inside = str(tmp_path / "root" / "sub" / "runs" / "seed_1")
    assert check_under_root("run_dir", inside, deployment) == inside


@pytest.mark.parametrize(
    "where",
    [
        "elsewhere/run",  # outside
        "root-other/run",  # a sibling whose name starts like the root
        "root",  # the root itself is not a run folder
        "root/link/run",  # a link under the root to a folder outside it
    ],
)
def test_a_run_dir_outside_the_storage_root_is_refused_in_one_line(
    tmp_path: Path, where: str
) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "root" / "link")
    deployment = _deployment(tmp_path)
    path = str(tmp_path / where)
    with pytest.raises(ParamError) as refused:
        check_under_root("run_dir", path, deployment)
    message = str(refused.value)
    assert message == (
        f"run_dir: {path} is outside this deployment's storage root {tmp_path / 'root'} "
        "(from d.toml); choose a folder under it, or set allow_run_dirs_outside_root = true "
        "in the deployment"
    )
    allowed = _deployment(tmp_path, allow_run_dirs_outside_root=True)
    assert check_under_root("run_dir", path, allowed) == path


def test_gs_run_dirs_are_confined_by_prefix(tmp_path: Path) -> None:
    deployment = parse_deployment('storage_root = "gs://b/runs"\n', source="d", base_dir=tmp_path)
    assert check_under_root("run_dir", "gs://b/runs/s/runs/seed_1", deployment)
    for outside in ("gs://b/runs-x/r", "gs://other/runs/r", "/local/r"):
        with pytest.raises(ParamError, match=f"^run_dir: {outside} is outside"):
            check_under_root("run_dir", outside, deployment)


@pytest.mark.timeout(300)
def test_the_run_deferred_eval_and_submission_plans_refuse_a_run_dir_outside_the_root(
    airflow_db: str, tmp_path: Path
) -> None:
    deployment = write_deployment(
        tmp_path / "d.toml",
        storage_root=str(tmp_path / "root"),
        allow_run_dirs_outside_root=False,
    )
    outside = tmp_path / "elsewhere" / "run"
    run_spec({**RUN, "run_dir": str(outside)})  # fine but for where it is
    result = run_dag_test(RUN_DAG_ID, {**RUN, "run_dir": str(outside)}, deployment)
    assert result.state == "failed"
    assert result.states[("plan", -1)] == "failed"
    assert not outside.exists()  # nothing was written

    result = run_dag_test(DEFERRED_EVAL_DAG_ID, {"run_dir": str(outside)}, deployment)
    assert result.state == "failed"
    assert result.states[("existing_run", -1)] == "failed"

    # A submission's storage_root Param outside the deployment's: its runs would be outside.
    conf = _submission(tmp_path, storage_root=str(tmp_path / "elsewhere"))
    submission_spec(conf, run_id="r", **LOCAL)  # fine but for where it is
    result = run_dag_test(SUBMISSION_DAG_ID, conf, deployment)
    assert result.state == "failed"
    assert result.states[("plan", -1)] == "failed"
    assert result.states[("seed_triggers", -1)] == "upstream_failed"
    assert not (tmp_path / "elsewhere").exists()
