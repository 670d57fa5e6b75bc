"""No `run_stop` on a training section the official checker would reject: finalize says
`incomplete` and why (and whether rerunning the trainer repairs it), rule for rule with the
checker's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from file_tree import append_bytes
from rcpflow_cli import run_cli

from devtools.synthetic_run import passing_run, write_eval
from rcpflow.files import logtext
from rcpflow.records.mllog import read_events
from rcpflow.submission.checkers import compliance
from rcpflow.verdict.finalize import finalize


def _drop_lines(path: Path, key: str) -> None:
    kept = [
        ln
        for ln in logtext.lines(logtext.read(str(path)), keepends=True)
        if f'"key": "{key}"' not in ln
    ]
    path.write_bytes(logtext.encode("".join(kept)))


def _duplicate_line(path: Path, key: str) -> None:
    lines = logtext.lines(logtext.read(str(path)), keepends=True)
    (i,) = [n for n, ln in enumerate(lines) if f'"key": "{key}"' in ln]
    path.write_bytes(logtext.encode("".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])))


@pytest.mark.parametrize("accuracies", [{18: 0.5, 19: 0.8}, {s: 0.1 for s in range(18, 25)}])
def test_no_block_stop_is_incomplete_and_says_resume(tmp_path, accuracies):
    # A crash between the last row and block_stop: success or aborted would be a log the
    # checker rejects (block_stop is required); the trainer's resume writes it.
    run = passing_run(tmp_path, accuracies=accuracies)
    _drop_lines(run.log_file, "block_stop")
    result = finalize(run.run_dir)
    assert result.status == "incomplete"
    assert "no block_stop" in result.reason and result.reason.endswith(
        "rerun the trainer to resume"
    )
    assert [e for e in read_events(str(run.log_file)) if e.key == "run_stop"] == []
    p = run_cli("finalize", run.run_dir)
    assert p.returncode == 3 and json.loads(p.stdout.splitlines()[-1]) == {"status": "incomplete"}


def test_two_run_start_is_incomplete(tmp_path):
    run = passing_run(tmp_path)
    finalize(run.run_dir)  # an earlier finalize ended it: the new verdict must drop its run_stop
    _duplicate_line(run.log_file, "run_start")
    result = finalize(run.run_dir)
    assert result.status == "incomplete"
    assert "2 run_start events" in result.reason and "resume" not in result.reason
    assert [e.key for e in read_events(str(run.log_file)) if e.key == "run_stop"] == []
    # The checker also flags it (a warning without --werror, a failure with it).
    verdict = compliance(str(run.log_file), division="closed", log_dir=str(tmp_path / "chk"))
    assert "EXACTLY_ONE occurrence of 'run_start' but found 2" in verdict.output


def test_block_stop_before_the_last_row_is_incomplete(tmp_path):
    run = passing_run(tmp_path, max_steps=20, last_step=19, accuracies={18: 0.1, 19: 0.2})
    from rcpflow.records.manifest import upsert

    upsert(run.layout.manifest, run.row(20))  # a checkpoint after training "ended"
    write_eval(run, 20, 0.9)
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "before step 20's weight update" in result.reason


def test_closed_division_val_start_override_is_incomplete(tmp_path):
    run = passing_run(tmp_path, val_start_at=5, max_steps=8, accuracies={5: 0.1, 6: 0.8})
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "val_start_at 5" in result.reason
    open_run = passing_run(tmp_path, "open", division="open", val_start_at=5, max_steps=8,
                    accuracies={5: 0.1, 6: 0.8})  # fmt: skip
    assert finalize(open_run.run_dir).status == "success"


MUTATIONS = {
    "no block_stop": lambda p: _drop_lines(p, "block_stop"),
    "no init_stop": lambda p: _drop_lines(p, "init_stop"),
    "no config_filename": lambda p: _drop_lines(p, "config_filename"),
    "no block_start": lambda p: _drop_lines(p, "block_start"),
    "another benchmark": lambda p: p.write_bytes(
        p.read_bytes().replace(b'"value": "qwen35_397b_grpo"', b'"value": "llama31_8b"')
    ),
    "tensor_parallelism twice, two values": lambda p: append_bytes(
        p,
        b':::MLLOG {"namespace": "", "time_ms": 1700000000000, "event_type": "POINT_IN_TIME", '
        b'"key": "tensor_parallelism", "value": 2, "metadata": {}}\n',
    ),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_rules_reject_what_the_checker_rejects(tmp_path, mutation):
    """Each structural rule against the official checker: on a log finalize had ended with
    success, the mutation makes the checker fail, and finalize then refuses to end it."""
    run = passing_run(tmp_path)
    assert finalize(run.run_dir).status == "success"
    MUTATIONS[mutation](run.log_file)
    verdict = compliance(str(run.log_file), division="closed", log_dir=str(tmp_path / "chk"))
    assert not verdict.ok
    result = finalize(run.run_dir)
    assert result.status == "incomplete", result.reason
    assert result.reason.startswith("training section: ")


def test_exactly_one_keys_are_the_official_rules():
    import importlib.util

    import yaml

    from rcpflow.records.training_section import EXACTLY_ONE_BY_DIVISION, EXACTLY_ONE_COMMON

    spec = importlib.util.find_spec("mlperf_logging.compliance_checker")
    assert spec is not None and spec.origin is not None
    rules = Path(spec.origin).parent / "training_6.1.0"

    def exactly_one(name: str) -> set[str]:
        records = yaml.load((rules / name).read_text(), Loader=yaml.BaseLoader)
        return {
            r["KEY"]["NAME"] for r in records if "KEY" in r and r["KEY"].get("REQ") == "EXACTLY_ONE"
        }

    for division in ("closed", "open"):
        official = (
            exactly_one("common.yaml")
            | exactly_one(f"{division}_common.yaml")
            | exactly_one(f"{division}_qwen35_397b_grpo.yaml")
        ) - {"run_stop"}
        ours = set(EXACTLY_ONE_COMMON) | set(EXACTLY_ONE_BY_DIVISION[division])
        assert ours == official, division
