"""mlperf_grpo_submission refuses bad Params by name, before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from airflow_harness import run_dag_test, submission_params

from tasks.run.spec import ParamError
from tasks.submission.spec import submission_spec

LOCAL = {"backend": "local", "source": "<embedded default>"}


def _params(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return submission_params(tmp_path / "root", **changes)


def test_good_params_give_one_run_per_seed(tmp_path: Path) -> None:
    spec = submission_spec(_params(tmp_path), run_id="r", **LOCAL)
    triggers = spec.triggers()
    assert [t["trigger_run_id"] for t in triggers] == ["s1__seed_1", "s1__seed_2", "s1__seed_3"]
    assert [t["conf"]["run_dir"] for t in triggers] == [
        str(tmp_path / "root" / "s1" / "runs" / f"seed_{s}") for s in (1, 2, 3)
    ]
    assert {t["conf"]["division"] for t in triggers} == {"open"}
    assert {(t["conf"]["eval_schedule"], t["conf"]["eval_window"]) for t in triggers} == {
        ("after_training", 1)
    }


def test_the_schedule_and_window_go_to_every_run(tmp_path: Path) -> None:
    params = _params(tmp_path, eval_schedule="during_training", eval_window=10)
    spec = submission_spec(params, run_id="r", **LOCAL)
    confs = [t["conf"] for t in spec.triggers()]
    assert {(c["eval_schedule"], c["eval_window"]) for c in confs} == {("during_training", 10)}


def test_submission_name_defaults_to_a_safe_form_of_the_run_id(tmp_path: Path) -> None:
    params = _params(tmp_path, submission_name=None)
    spec = submission_spec(params, run_id="manual__2026-01-02T03:04:05+00:00", **LOCAL)
    assert spec.name == "manual__2026-01-02T03_04_05_00_00"


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"seeds": [1, 2, 1]}, "seeds: seed(s) [1] repeated"),
        ({"seeds": [1, 2]}, "seeds: a qwen35_397b_grpo submission has 3 runs"),
        ({"global_batch_size": 100}, "global_batch_size must be a positive multiple of 16"),
        ({"target": 0.7}, "target: MLPerf 6.1.0 fixes"),
        ({"backend": "gke"}, "backend: this Airflow deployment runs jobs on 'local'"),
        ({"val_start_at": 41}, "val_start_at: validation would start at step 41"),
        ({"storage_root": "relative/dir"}, "storage_root: 'relative/dir' must be an absolute"),
        ({"submission_name": "../up"}, "submission_name: '../up' must match"),
        ({"system": {"colour": "red"}}, "system: unknown field(s) colour"),
        ({"system": {"status": "made up"}}, "system: system description: status must be one of"),
        ({"eval_schedule": "sometimes"}, "eval_schedule: must be one of"),
        ({"eval_window": 0}, "eval_window: must be an integer in 1..64, got 0"),
        ({"eval_window": 65}, "eval_window: must be an integer in 1..64, got 65"),
    ],
)
def test_bad_params_are_refused_naming_the_param(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ParamError) as refused:
        submission_spec(_params(tmp_path, **changes), run_id="r", **LOCAL)
    assert named in str(refused.value)


def test_a_backend_whose_jobs_run_elsewhere_needs_a_system_description(tmp_path: Path) -> None:
    gke = {"backend": "gke", "source": "d.toml"}
    with pytest.raises(ParamError, match="system: on gke the defaults would describe"):
        submission_spec(_params(tmp_path, backend="gke"), run_id="r", **gke)
    named = _params(tmp_path, backend="gke", system={"system_name": "tpu-v5p-128"})
    assert submission_spec(named, run_id="r", **gke).backend == "gke"


@pytest.mark.timeout(300)
def test_a_cross_field_problem_fails_the_first_task_before_anything_runs(
    airflow_db: str, tmp_path: Path
) -> None:
    # In the JSON schema each value is fine; only together are they wrong (validation would
    # start after the last step), which the `plan` task catches.
    conf = _params(tmp_path, val_start_at=41)
    result = run_dag_test("mlperf_grpo_submission", conf)

    assert result.state == "failed"
    assert result.states[("plan", -1)] == "failed"
    assert result.states[("seed_triggers", -1)] == "upstream_failed"
    assert not any(
        t.startswith("run_seed") for t, _ in result.states if result.states[(t, _)] == "success"
    )
    assert not (tmp_path / "root").exists()  # nothing was written


GKE_TOML = 'backend = "gke"\n[gke]\nproject_id = "p"\ncluster_name = "c"\nimage = "i:1"\n'


def _forms(toml: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from tasks.backend_api.protocol import form_defaults
    from tasks.deployment import parse_deployment
    from tasks.run.spec import run_params
    from tasks.submission.spec import submission_params

    deployment = parse_deployment(toml, source="t.toml", base_dir=tmp_path)
    return submission_params(deployment), run_params(form_defaults(deployment))


@pytest.mark.parametrize(
    ("conf", "ok"),
    [
        ({"eval_schedule": "during_training", "eval_window": 3}, True),
        ({"eval_schedule": "at_random"}, False),
        ({"eval_window": 0}, False),
        ({"eval_window": 65}, False),
        ({"eval_window": "3"}, False),
    ],
)
def test_a_trigger_conf_is_validated_against_the_schedule_params(
    tmp_path: Path, conf: dict[str, Any], ok: bool
) -> None:
    # what the REST API and the form do with a trigger's conf: the DAG's Params updated by it,
    # then validated against their JSON schemas
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    for params in _forms("", tmp_path):
        merged = ParamsDict(params)
        required = {"run_dir": str(tmp_path / "run")} if "run_dir" in params else {}
        if ok:
            merged.update({**required, **conf})
            assert merged.validate()["eval_window"] == conf["eval_window"]
        else:
            with pytest.raises(ParamValidationError, match="eval_"):
                merged.update({**required, **conf})
                merged.validate()


@pytest.mark.parametrize(
    ("toml", "defaults"),
    [
        # the choice first: its description names this deployment's value
        ("", {"eval_schedule": "after_training", "eval_window": 1}),
        (
            'eval_schedule = "during_training"\neval_window = 10\n',
            {"eval_schedule": "during_training", "eval_window": 10},
        ),
        ("", {"division": "open", "max_steps": 40}),  # the local toy: learns only at its own lr
        (GKE_TOML, {"division": "closed", "max_steps": 60}),  # TPU jobs run the benchmark
        ('[form_defaults]\ndivision = "closed"\n', {"division": "closed", "max_steps": 40}),
        (GKE_TOML + "[form_defaults]\nmax_steps = 90\n", {"division": "closed", "max_steps": 90}),
    ],
)
def test_form_defaults_come_from_the_deployment(
    tmp_path: Path, toml: str, defaults: dict[str, Any]
) -> None:
    choice = next(iter(defaults))
    for params in _forms(toml, tmp_path):
        assert {name: params[name].value for name in defaults} == defaults
        assert f"this deployment's ({defaults[choice]})" in params[choice].description


def test_the_schedule_param_says_what_the_rules_say_about_each_schedule(tmp_path: Path) -> None:
    for params in _forms("", tmp_path):
        assert "the rules' own wording" in params["eval_schedule"].description
        assert "not described by the rules" in params["eval_schedule"].description


def test_every_param_says_what_it_is_and_the_target_is_fixed(tmp_path: Path) -> None:
    from tasks.submission.spec import _system_fields

    submission, run = _forms("", tmp_path)
    for name, param in {**submission, **run}.items():
        assert param.description, f"Param {name} has no description"
    target = submission["target"]
    assert target.value == 0.69 and target.schema["enum"] == [0.69]
    allowed = submission["system"].description.split("Allowed keys: ", 1)[1].rstrip(".")
    assert allowed.split(", ") == _system_fields()
    assert sorted(submission["system"].schema["properties"]) == sorted(_system_fields())


def test_the_submission_dag_form_starts_where_the_local_toy_passes(dagbag) -> None:
    params = dagbag.get_dag("mlperf_grpo_submission").params
    assert (params["division"], params["max_steps"]) == ("open", 40)
    run = dagbag.get_dag("mlperf_grpo_run").params
    assert (run["division"], run["max_steps"]) == ("open", 40)


def test_a_target_other_than_the_rules_is_refused_by_the_form(tmp_path: Path) -> None:
    from airflow.sdk.definitions.param import ParamsDict

    submission, _ = _forms("", tmp_path)
    params = ParamsDict(submission)
    params["target"] = 0.69
    with pytest.raises(ValueError, match=r"0\.7"):
        params["target"] = 0.7
