"""Whatever rcpflow writes, it can read back: strict records (a NaN reward, rewards summing to
Infinity, a key twice), bounded times (2020 .. now + 1 day) and max_steps (<= 100000), integers
within 64 bits; each refused with one named line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_records import START, STOP, deepswe_lines, r2egym_lines, write_lines
from rcpflow_cli import run_cli

from devtools.synthetic_run import attempts_for_accuracy, make_run
from rcpflow import recipe
from rcpflow.records.manifest import ManifestError, ManifestRow
from rcpflow.records.summary import build_summary
from rcpflow.records.summary_checks import consistency_problems
from rcpflow.verdict.eval_import import EvalImportError, import_eval


@pytest.fixture
def run(tmp_path):
    return make_run(str(tmp_path / "run"), max_steps=20)


def _import(run, source: str, **kw):
    return import_eval(run.run_dir, 18, source, eval_times=(START, STOP), **kw)


def test_a_deepswe_reward_nan_is_refused_naming_the_line(run, tmp_path):
    lines = deepswe_lines()
    lines[6] = (
        lines[6].replace('"reward": 0.0', '"reward": NaN').replace('"reward": 1.0', '"reward": NaN')
    )
    source = write_lines(tmp_path / "d.jsonl", lines)
    with pytest.raises(EvalImportError, match=r"line 7: reward nan is not a finite number"):
        _import(run, source)
    assert not Path(run.layout.summary(18)).exists()
    # a NaN in a field rcpflow does not use is the evaluator's business
    lines = [json.dumps({**json.loads(x), "elapsed_secs": float("nan")}) for x in deepswe_lines()]
    assert _import(run, write_lines(tmp_path / "ok.jsonl", lines)).summary.complete


def test_r2egym_rewards_summing_to_infinity_are_refused(run, tmp_path):
    lines = [json.dumps({**json.loads(x), "reward": 1e308}) for x in r2egym_lines()]
    source = write_lines(tmp_path / "r.jsonl", lines)
    with pytest.raises(EvalImportError, match=r"line 1: reward 1e\+308 is not a finite number"):
        _import(run, source)
    p = run_cli("status", run.run_dir)
    assert p.returncode == 0 and "unreadable" not in p.stdout


def test_a_key_twice_in_a_record_is_refused(run, tmp_path):
    lines = deepswe_lines()
    lines[0] = lines[0][:-1] + ', "reward": 1.0}'
    with pytest.raises(EvalImportError, match=r"line 1: duplicate key 'reward'"):
        _import(run, write_lines(tmp_path / "d.jsonl", lines))


@pytest.mark.parametrize(
    ("start", "stop", "message"),
    [
        (1_500_000_000_000, START, "start 1500000000000 is before 2020-01-01"),
        (START, 8_000_000_000_000, "stop 8000000000000 is more than a day ahead of now"),
    ],
)
def test_eval_times_out_of_bounds_are_refused(run, tmp_path, start, stop, message):
    source = write_lines(tmp_path / "d.jsonl", deepswe_lines())
    args = ["eval", "import", run.run_dir, "--step", "18", source]
    p = run_cli(*args, "--eval-start-ms", str(start), "--eval-stop-ms", str(stop))
    assert p.returncode == 1 and message in p.stderr and "Traceback" not in p.stderr
    p = run_cli(*args, "--eval-start-ms", str(2**64), "--eval-stop-ms", str(2**64 + 1))
    assert p.returncode == 2 and "out of the 64-bit range" in p.stderr
    assert not Path(run.layout.summary(18)).exists()


def test_a_summary_with_eval_times_200_years_ahead_is_invalid(run):
    s = _summary(run, eval_start_ms=START, eval_stop_ms=START + 200 * 365 * 86_400_000)
    (problem,) = [p for p in consistency_problems(s) if p.field == "eval_stop_ms"]
    assert problem.message.startswith(f"{s.eval_stop_ms} is more than a day ahead of now")


def _summary(run, **kw):
    row = run.row(18)
    args = dict(
        attempts_per_instance=4, checkpoint=row, target_accuracy=0.69, eval_start_ms=START,
        eval_stop_ms=STOP,
    )  # fmt: skip
    return build_summary(attempts_for_accuracy(0.5), **{**args, **kw})


def test_a_manifest_timestamp_of_1e16_is_refused(run):
    rows = Path(run.layout.manifest).read_text().splitlines()
    rows[0] = json.dumps({**json.loads(rows[0]), "timestamp_ms": 10**16})
    Path(run.layout.manifest).write_text("\n".join(rows) + "\n")
    p = run_cli("manifest", "validate", run.layout.manifest)
    assert p.returncode == 1
    assert "line 1: timestamp_ms 10000000000000000 is more than a day ahead of now" in p.stderr


def test_max_steps_beyond_the_bound_is_refused_with_a_line(run):
    with pytest.raises(
        ValueError, match=r"max_steps must be in 1..100000, got 9223372036854775808"
    ):
        recipe.hyperparameters("closed", 256, 2**63)
    d = json.loads(run.row(18).to_json())
    with pytest.raises(ManifestError, match="max_steps 9223372036854775807 is beyond 100000"):
        ManifestRow.from_dict({**d, "max_steps": 2**63 - 1}, "row")
    rows = Path(run.layout.manifest).read_text().splitlines()
    rows[0] = rows[0].replace('"max_steps": 20', f'"max_steps": {2**63}')
    Path(run.layout.manifest).write_text("\n".join(rows) + "\n")
    p = run_cli("status", run.run_dir)
    assert (
        p.returncode == 1 and "out of the 64-bit range" in p.stderr and "Traceback" not in p.stderr
    )
