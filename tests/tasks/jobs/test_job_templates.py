"""The deployment's [jobs] table: defaults are the toy jobs, every bad template fails when the
file is parsed, naming its key; the local backend runs what the templates say."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_paths import REPO

from tasks.deployment import DeploymentError, parse_deployment
from tasks.jobs.command import EVALUATE_JOB, TRAIN_JOB
from tasks.jobs.templates import EvalResult
from tasks.run.job_nodes import nodes_for


def _parse(text: str, tmp_path: Path):
    return parse_deployment(text, source="f.toml", base_dir=tmp_path)


def test_without_a_jobs_table_the_jobs_are_the_toys(tmp_path: Path) -> None:
    d = _parse("", tmp_path)
    assert d.jobs.train.job_command == TRAIN_JOB
    assert d.jobs.evaluate.job_command == EVALUATE_JOB
    assert d.jobs.evaluate.result == EvalResult()  # rcpflow's own summary, not imported
    assert not d.jobs.evaluate.result.imported
    nodes = nodes_for(d)
    assert nodes.deployment.jobs.train == d.jobs.train and nodes.driver.name == "local"


def test_a_jobs_table_replaces_command_env_and_result(tmp_path: Path) -> None:
    d = _parse(
        "[jobs.train]\n"
        'command = ["/opt/t", "--out={run_dir}", "{checkpoint_dir}"]\n'
        'env = { A = "1" }\n'
        "[jobs.evaluate]\n"
        'command = ["{python}", "e.py", "{checkpoint_path}", "{summary_dir}"]\n'
        'result = { format = "deepswe", path = "{summary_dir}/records_{step}.jsonl" }\n',
        tmp_path,
    )
    assert d.jobs.train.command == ("/opt/t", "--out={run_dir}", "{checkpoint_dir}")
    assert dict(d.jobs.train.env) == {"A": "1"}
    assert d.jobs.evaluate.env == {}  # each job has its own
    assert d.jobs.evaluate.result.imported
    assert d.jobs.evaluate.result.render({"summary_dir": "/r/eval/step_3", "step": 3}) == (
        "/r/eval/step_3/records_3.jsonl"
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            '[jobs.train]\ncommand = ["{python}", "-m", "t", "{step}"]\n',
            "jobs.train.command[3]: train command argv[3] '{step}': {step} is a placeholder of "
            "evaluate jobs, not of train jobs",
        ),
        (
            '[jobs.evaluate]\ncommand = ["{python}", "{max_steps}"]\n',
            "jobs.evaluate.command[1]: evaluate command argv[1] '{max_steps}': {max_steps} is a "
            "placeholder of train jobs",
        ),
        ('[jobs.train]\ncommand = ["x", "{rundir}"]\n', "jobs.train.command[1]: "),
        ('[jobs.train]\ncommand = ["{seed:>3}"]\n', "jobs.train.command[0]: "),
        ('[jobs.train]\ncommand = ["{run_dir"]\n', "jobs.train.command[0]: "),
        ("[jobs.train]\ncommand = []\n", "jobs.train.command: train command: argv is empty"),
        ('[jobs.train]\ncommand = "python t.py"\n', "jobs.train.command: must be a list of str"),
        ("[jobs.evaluate]\nenv = { X = 1 }\n", "jobs.evaluate.env.X: must be str"),
        ('[jobs.evaluate]\nenv = { RCPFLOW_SLICE_INDEX = "0" }\n', "env.RCPFLOW_SLICE_INDEX"),
        ('[jobs.train]\nenv = { "A-B" = "0" }\n', "jobs.train.env.A-B: is not an environment"),
        (
            '[jobs.train]\nresult = { format = "nemo-rl-checkpoints" }\n',
            "jobs.train.result.path: format 'nemo-rl-checkpoints' needs the checkpoint root",
        ),
        (
            '[jobs.train]\nresult = { format = "nemo-rl-checkpoints", path = "{max_steps}" }\n',
            "jobs.train.result.path: '{max_steps}': {max_steps} has no value here",
        ),
        (
            '[jobs.train]\nresult = { format = "nemo-rl-checkpoints", path = "/c" }\n'
            'env = { MLPERF_MLLOG_FILE = "/x" }\n',
            "jobs.train.env.MLPERF_MLLOG_FILE: is set by rcpflow",
        ),
        ('[jobs.train.result]\npath = "/c"\n', "jobs.train.result.path: format 'rcpflow' is"),
        ("[jobs.deploy]\n", "jobs: unknown key(s) deploy"),
        (
            '[jobs.evaluate.result]\nformat = "tunix"\n',
            "jobs.evaluate.result.format: must be one of 'rcpflow', ",
        ),
        ('[jobs.evaluate.result]\nformat = "deepswe"\n', "jobs.evaluate.result.path: format"),
        (
            '[jobs.evaluate.result]\nformat = "tunix-summary"\npath = "/e/summary.json"\n',
            "jobs.evaluate.result.path: '/e/summary.json' is the same file for every step",
        ),
        (
            '[jobs.evaluate.result]\nformat = "tunix-tree"\npath = "{python}/t"\n',
            "jobs.evaluate.result.path: '{python}/t': {python} has no value here",
        ),
        (
            '[jobs.evaluate.result]\npath = "{summary_dir}/s.json"\n',
            "jobs.evaluate.result.path: format 'rcpflow' is the summary the job writes",
        ),
    ],
)
def test_bad_templates_fail_at_parse_time_naming_the_key(
    tmp_path: Path, text: str, named: str
) -> None:
    with pytest.raises(DeploymentError) as refused:
        _parse(text, tmp_path)
    assert str(refused.value).startswith("f.toml: ")
    assert named in str(refused.value)


def test_result_formats_are_rcpflow_eval_imports_own() -> None:
    import typing

    from rcpflow.verdict.eval_import import SOURCE_FORMATS
    from tasks.jobs.templates import ResultFormat

    assert set(typing.get_args(ResultFormat)) == {"rcpflow", "tunix-tree", *SOURCE_FORMATS}


def test_the_documented_worked_deployment_file_parses(tmp_path: Path) -> None:
    page = (REPO / "docs" / "bring-your-own-trainer.md").read_text()
    section = page.split("# Bring your own trainer and evaluator", 1)[1]
    text = section.split("```toml\n", 1)[1].split("```", 1)[0]
    d = _parse(text, tmp_path)
    assert d.jobs.train.command[1] == "/opt/my_trainer/train.py"
    assert d.jobs.evaluate.result == EvalResult("tunix-tree", "{run_dir}/tunix_eval")
