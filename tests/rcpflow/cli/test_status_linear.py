"""`rcpflow status` reads each summary once: linear in the rows (it used to re-read every lower
step for each row's gate). Counted, not timed; `status_bench.py` measures the seconds."""

from __future__ import annotations

from devtools.bench.status_bench import build
from rcpflow.cli.status import run_status
from rcpflow.records import summary
from rcpflow.verdict import verify


def test_status_reads_each_summary_once(tmp_path, monkeypatch):
    run_dir = str(tmp_path / "run")
    build(run_dir, 300)
    reads: list[str] = []
    real = summary.read_summary

    def counted(path: str, eval_times=None):
        reads.append(path)
        return real(path, eval_times)

    monkeypatch.setattr(verify, "read_summary", counted)
    status = run_status(run_dir)
    assert len(status.steps) == 300 and all(s.gate == "below target" for s in status.steps)
    assert status.finalize.status == "aborted"  # every step up to max_steps below the target
    assert len(reads) == 300 and len(set(reads)) == 300
    reads.clear()
    run_status(run_dir)  # a second look reads again (nothing is cached across calls)
    assert len(reads) == 300
