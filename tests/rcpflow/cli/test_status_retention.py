"""`rcpflow status` shows which checkpoints retention kept and deleted, and why, from the apply
record alone (each summary is still read once)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run
from rcpflow.cli.status import run_status
from rcpflow.records import summary
from rcpflow.retention.apply import apply_run
from rcpflow.verdict import verify


def test_status_shows_kept_and_gone_and_reads_each_summary_once(tmp_path, monkeypatch):
    run = make_run(str(tmp_path / "run"), max_steps=21, accuracies={18: 0.5, 19: 0.8})
    for step in (18, 19, 20, 21):
        folder = Path(run.layout.checkpoint(step)) / "params"
        folder.mkdir(parents=True)
        (folder / "w").write_bytes(b"x")
    assert run_status(run.run_dir).retention == ()  # no apply ran: nothing said
    apply_run(run.run_dir)
    counted = mock.Mock(wraps=summary.read_summary)
    monkeypatch.setattr(verify, "read_summary", counted)
    notes = {n.step: n for n in run_status(run.run_dir).retention}
    paths = [c.args[0] for c in counted.call_args_list]
    assert sorted(paths) == [run.layout.summary(18), run.layout.summary(19)]  # once each
    assert (notes[18].state, notes[18].reason) == ("gone", "evaluated below the target")
    assert notes[18].when_ms is not None
    assert notes[19].state == "kept" and "passing checkpoint" in notes[19].reason
    assert (notes[20].state, notes[20].reason) == (
        "kept",
        "no persisted summary (maybe being evaluated)",
    )
    apply_run(run.run_dir)  # a later apply sees 18 absent: it stays "gone", not "not present"
    assert {n.step: n.state for n in run_status(run.run_dir).retention}[18] == "gone"
    p = run_cli("status", run.run_dir)
    assert p.returncode == 0, p.stderr
    gone = [line for line in p.stdout.splitlines() if line.startswith("retention: step 18 gone")]
    assert gone and "(evaluated below the target, deleted " in gone[0]


def test_an_unreadable_record_is_a_warning_not_a_failure(tmp_path):
    run = make_run(str(tmp_path / "run"), max_steps=19, accuracies={18: 0.5, 19: 0.8})
    Path(run.layout.retention).write_text("{not json")
    status = run_status(run.run_dir)
    assert status.retention == ()
    assert any(w.startswith("retention record not read:") for w in status.warnings)


def test_a_record_with_a_bad_part_is_a_warning_and_apply_refuses_it(tmp_path):
    run = make_run(str(tmp_path / "run"), max_steps=19, accuracies={18: 0.5, 19: 0.8})
    Path(run.layout.retention).write_text('{"applies": [{"parts": [{"step": "18"}]}]}')
    assert any("apply 1: not a list of parts" in w for w in run_status(run.run_dir).warnings)
    p = run_cli("retention", "apply", run.run_dir)
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 1
    assert p.stderr.startswith("invalid: ") and "retention.json: apply 1" in p.stderr
