"""How long `rcpflow status` takes on a run of N manifest rows, every one with a valid summary
below the target (the worst case: no step is skipped, every gate looks at every lower step).

    PYTHONPATH=$PWD:$PWD/tests .venv/bin/python tests/rcpflow/status_bench.py 1000 10000

prints one line per N; `measure(n)` returns the seconds of one `run_status` (after the build).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from synthetic_run import attempts_for_accuracy, make_run

from rcpflow import recipe
from rcpflow.manifest import render_rows
from rcpflow.status import run_status
from rcpflow.summary import build_summary, write_summary


def build(run_dir: str, rows: int) -> None:
    """A run of `rows` rows from the validation start, each with a summary of pass@4 0.5."""
    run = make_run(run_dir, max_steps=17 + rows, last_step=17)  # the log; rows written below
    all_rows = [run.row(step) for step in range(18, 18 + rows)]
    Path(run.layout.manifest).write_bytes(render_rows(all_rows))
    attempts = attempts_for_accuracy(0.5)
    for row in all_rows:
        start = row.timestamp_ms + 3_600_000
        summary = build_summary(
            attempts,
            attempts_per_instance=recipe.EVAL_ATTEMPTS_PER_INSTANCE,
            checkpoint_step=row.step,
            checkpoint_timestamp_ms=row.timestamp_ms,
            samples_count=row.samples_count,
            target_accuracy=recipe.TARGET_ACCURACY,
            eval_start_ms=start,
            eval_stop_ms=start + 1_000,
        )
        write_summary(run.layout.summary(row.step), summary)


def measure(rows: int) -> float:
    with tempfile.TemporaryDirectory(prefix="rcpflow-status-bench-") as tmp:
        run_dir = str(Path(tmp) / "run")
        build(run_dir, rows)
        started = time.perf_counter()
        status = run_status(run_dir)
        elapsed = time.perf_counter() - started
        assert len(status.steps) == rows and status.manifest_error is None
        return elapsed


def main(argv: list[str]) -> int:
    for n in [int(a) for a in argv] or [1000, 10000]:
        print(f"rcpflow status, {n} rows: {measure(n):.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
