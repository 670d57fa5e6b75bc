"""`rcpflow status` degrades per step, never per run (issue 29): an attempts path that is a
folder is that step's unreadable summary; checkpoints on a storage it cannot reach (``gs://``
without credentials, the run's own files local) are that step's unknown checkpoint, with why;
the exit code reflects the run's own files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rcpflow_cli import cli_env_without_gcs_credentials, run_cli

from devtools.synthetic_run import passing_run, rows_of
from rcpflow.cli.status import run_status
from rcpflow.records.manifest import render_rows
from rcpflow.verdict.verify import attempts_file


def test_an_attempts_path_that_is_a_folder_is_one_unreadable_step(tmp_path):
    run = passing_run(tmp_path)
    Path(attempts_file(run.run_dir, 19)).mkdir(parents=True)
    status = run_status(run.run_dir)
    by_step = {s.step: s for s in status.steps}
    assert by_step[18].summary == "valid"
    assert by_step[19].summary == "unreadable"
    assert attempts_file(run.run_dir, 19) in by_step[19].problems[0]
    assert status.finalize is not None and status.finalize.status == "refused"
    p = run_cli("status", run.run_dir)
    assert p.returncode == 0, p.stderr
    assert "step 19: " in p.stdout and "Is a directory" in p.stdout


def test_checkpoints_on_an_unreachable_storage_are_shown_on_their_steps(tmp_path):
    run = passing_run(tmp_path)
    rows = [
        dataclasses.replace(r, checkpoint_path=f"gs://rcpflow-no-such-bucket/ck/{r.step}")
        for r in rows_of(run.run_dir)
    ]
    Path(run.layout.manifest).write_text(render_rows(rows).decode())
    p = run_cli("status", run.run_dir, env=cli_env_without_gcs_credentials(tmp_path))
    assert p.returncode == 0, p.stderr  # the run's own files are all readable
    table = p.stdout.splitlines()
    assert table[1].split()[4:6] == ["?", "valid"]
    assert "step 18: checkpoint not looked at: " in p.stdout
    assert "no Google Cloud credentials" in p.stdout
    p = run_cli("status", run.run_dir, "--json", env=cli_env_without_gcs_credentials(tmp_path))
    steps = json.loads(p.stdout)["steps"]
    assert "no Google Cloud credentials" in steps[0]["checkpoint_problem"]
    assert steps[0]["summary"] == "valid" and steps[1]["gate"] == "passes"
