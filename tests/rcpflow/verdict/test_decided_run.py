"""A decided run is immutable to import: a step that a written run_stop depends on (any step up
to it) is refused naming the run_stop, unless --reopen; then status says the next finalize
rewrites the eval section, and finalize does."""

from __future__ import annotations

import json
from pathlib import Path

from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run
from rcpflow.cli.status import render_table, run_status
from rcpflow.records.mllog import read_events
from rcpflow.verdict.finalize import finalize


def _decided(tmp_path):
    run = make_run(str(tmp_path / "run"), max_steps=22, accuracies={18: 0.5, 19: 0.8, 20: 0.5})
    assert finalize(run.run_dir).status == "success"  # run_stop at step 19
    return run


def _source(run, tmp_path, step: int, accuracy_from: int) -> str:
    """A valid summary of `step` with the pass@4 of step `accuracy_from`'s."""
    d = json.loads(Path(run.layout.summary(accuracy_from)).read_text())
    row = run.row(step)
    d.update(checkpoint_step=step, checkpoint_timestamp_ms=row.timestamp_ms)
    d.update(samples_count=row.samples_count)
    path = tmp_path / f"src_{step}" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(d))
    return str(path)


def test_import_onto_a_step_a_run_stop_depends_on_is_refused_naming_it(tmp_path):
    run = _decided(tmp_path)
    before = Path(run.layout.summary(18)).read_bytes()
    for step in (18, 19):
        p = run_cli(
            "eval", "import", run.run_dir, "--step", str(step), _source(run, tmp_path, step, 19)
        )
        assert p.returncode == 1
        assert (
            "the run is decided:" in p.stderr and "run_stop status=success at step 19" in p.stderr
        )
        assert "--reopen" in p.stderr
    assert Path(run.layout.summary(18)).read_bytes() == before
    # a step above the run_stop decides nothing: it may be imported
    p = run_cli("eval", "import", run.run_dir, "--step", "21", _source(run, tmp_path, 21, 19))
    assert p.returncode == 0, p.stderr


def test_reopen_replaces_it_and_status_says_finalize_rewrites_the_eval_section(tmp_path):
    run = _decided(tmp_path)
    assert run_status(run.run_dir).finalize.rewrites is None
    p = run_cli(
        "eval", "import", run.run_dir, "--step", "18", "--reopen", _source(run, tmp_path, 18, 19)
    )
    assert p.returncode == 0, p.stderr
    assert "reopened" in p.stdout and "the next finalize rewrites the eval section" in p.stdout
    status = run_status(run.run_dir)
    assert (status.finalize.status, status.finalize.run_stop_step) == ("success", 18)
    assert "run_stop status=success at step 19" in status.finalize.rewrites
    assert "is rewritten by the next finalize" in render_table(status).splitlines()[-1]
    assert finalize(run.run_dir).step == 18
    stops = [e for e in read_events(run.layout.mllog(run.seed)) if e.key == "run_stop"]
    assert len(stops) == 1 and stops[0].metadata["samples_count"] == run.row(18).samples_count
    assert run_status(run.run_dir).finalize.rewrites is None
