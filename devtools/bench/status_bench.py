"""How long `rcpflow status` takes on a run of N manifest rows, every one with a valid summary
below the target (the worst case: no step is skipped, every gate looks at every lower step).

    python -m devtools.bench.status_bench 1000 10000

prints one line per N; `measure(n)` returns the seconds of one `run_status` (after the build).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from devtools.synthetic_run import make_run, write_eval
from rcpflow.cli.status import run_status
from rcpflow.records.manifest import render_rows


def build(run_dir: str, rows: int) -> None:
    """A run of `rows` rows from the validation start, each with a summary of pass@4 0.5."""
    run = make_run(run_dir, max_steps=17 + rows, last_step=17)  # the log; rows written below
    all_rows = [run.row(step) for step in range(18, 18 + rows)]
    Path(run.layout.manifest).write_bytes(render_rows(all_rows))
    for row in all_rows:
        write_eval(run, row.step, 0.5)


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
