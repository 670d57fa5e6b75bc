"""SIGTERM (what Kubernetes sends before SIGKILL) stops the trainer like a crash but only after
the queued checkpoint saves have finished with their manifest rows; a rerun resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records import manifest
from rcpflow.records.mllog import parse
from tpu_jobs.rcp.checkpoint_format import is_complete
from tpu_jobs.rcp.termination import SIGTERM_EXIT_CODE

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--seed", "2", "--global-batch-size", "32", "--val-start-at", "2", "--max-steps", "60"]


def _start(run_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tpu_jobs.train", "--run-dir", str(run_dir), *ARGS],
        cwd=REPO,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(600)
def test_sigterm_drains_the_save_queue_and_a_rerun_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _start(run_dir)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            record = json.loads(line) if line.startswith("{") else {}
            if "step" in record:
                seen.append(record["step"])
                if record["step"] == 4:
                    proc.send_signal(signal.SIGTERM)
                    break
        rest, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen[-1] == 4, seen
    assert proc.returncode == SIGTERM_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err
    printed = seen + [json.loads(x)["step"] for x in rest.splitlines() if '"step"' in x]
    last = printed[-1]
    assert 4 <= last < 60  # it stopped early, after at most a few more updates

    layout = RunLayout(str(run_dir))
    rows = manifest.load(layout.manifest).rows
    # every update that completed (and so queued its save) has its checkpoint and row
    assert [r.step for r in rows] == list(range(2, last + 1))
    assert all(is_complete(layout.checkpoint(r.step)) for r in rows)
    events = parse(storage_for(layout.mllog(2)).read_text(layout.mllog(2)), where="mllog")
    assert "block_stop" not in [e.key for e in events]  # an unfinished run ends nothing

    again = _start(run_dir)
    out, err = again.communicate(timeout=400)
    assert again.returncode == 0, err[-3000:]
    start = next(json.loads(x) for x in out.splitlines() if '"event": "start"' in x)
    assert start["resumed_from"] == last
    assert [r.step for r in manifest.load(layout.manifest).rows] == list(range(2, 61))
