"""`rcpflow status`: per row the checkpoint, summary, gate decision; what finalize would write."""

from __future__ import annotations

import json
from pathlib import Path

from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run, write_eval
from rcpflow.cli.status import run_status, utc_text
from rcpflow.verdict.finalize import finalize


def test_status_rows_gate_and_finalize_preview(tmp_path):
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5, 20: 0.8, 21: 0.9})
    Path(run.layout.checkpoints_dir, "18").mkdir(parents=True)
    (Path(run.layout.checkpoints_dir, "18") / "w").write_bytes(b"x")
    write_eval(run, 19, 0.99, fatal_error="restore failed")
    log_before = Path(run.layout.mllog(run.seed)).read_bytes()
    status = run_status(run.run_dir)
    by_step = {s.step: s for s in status.steps}
    assert [s.step for s in status.steps] == [18, 19, 20, 21, 22]
    assert by_step[18].checkpoint_present and not by_step[19].checkpoint_present
    assert (by_step[18].summary, by_step[18].gate) == ("valid", "below target")
    assert by_step[19].summary == "invalid" and by_step[19].gate == "evaluate"
    assert any(p.startswith("fatal_error:") for p in by_step[19].problems)
    assert (by_step[20].gate, by_step[20].eval_accuracy) == ("passes", 201 / 251)
    assert (by_step[21].gate, by_step[21].skipped_for) == ("skip", 20)
    assert (by_step[22].summary, by_step[22].gate) == ("missing", "skip")
    # step 19 is invalid: finalize would stop there, with no run_stop
    assert status.finalize.status == "incomplete" and status.finalize.run_stop_step is None
    assert "step 19: summary not valid" in status.finalize.reason
    assert Path(run.layout.mllog(run.seed)).read_bytes() == log_before  # status only reads

    write_eval(run, 19, 0.6)
    preview = run_status(run.run_dir).finalize
    assert (preview.status, preview.run_stop_step) == ("success", 20)
    assert finalize(run.run_dir).step == preview.run_stop_step

    p = run_cli("status", run.run_dir)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    head = ["step", "weight", "update", "(UTC)", "ckpt", "summary", "pass@4", "gate"]
    assert lines[0].split() == head
    when = utc_text(run.row(18).timestamp_ms)  # times in UTC; --json keeps the milliseconds
    assert lines[1].split()[:6] == ["18", *when.split(), "yes", "valid"]
    assert "skip (step 20 passed)" in lines[4]
    assert lines[-1].startswith("finalize now: success, run_stop at step 20")
    p = run_cli("status", run.run_dir, "--json")
    data = json.loads(p.stdout)
    assert data["finalize"]["run_stop_step"] == 20 and data["steps"][2]["gate"] == "passes"


def test_status_of_a_run_without_a_usable_manifest(tmp_path):
    run = make_run(str(tmp_path / "run"), max_steps=20)
    Path(run.layout.manifest).write_text(run.row(18).to_json() + "\n" + run.row(20).to_json())
    p = run_cli("status", run.run_dir)
    assert p.returncode == 1 and "steps 19 missing between 18 and 20" in p.stderr
    assert p.stderr.startswith(f"invalid: {run.run_dir}: no usable manifest: ")
    assert run_status(run.run_dir).steps == ()
