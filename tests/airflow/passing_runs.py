"""The end of a trainer's DAG run that passes between its first and its last evaluated step
(`check_passed`): the checks the MaxText and Tunix deployments' runs share."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from airflow_harness import DagRunResult

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import ManifestRow, load
from rcpflow.records.mllog import read_events
from tasks.results.verdicts import read_verdict


def check_passed(
    result: DagRunResult,
    run_dir: Path,
    *,
    seed: int,
    gbs: int,
    first: int,
    evaluated: Collection[int],
) -> tuple[int, list[ManifestRow]]:
    """The run stopped with success at the passing step: ``run_stop`` backdated to that
    checkpoint's weight update, ``block_stop`` to the last row's; ``eval_accuracy`` logged for
    every step from `first` to it, at or below the target before it and above at it, each of
    those steps `evaluated`; the compliance checker's verdict ok. (The passing step, the rows)
    for the trainer's own checks."""
    layout = RunLayout(str(run_dir))
    rows = load(layout.manifest).rows
    events = read_events(layout.mllog(seed))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    passed = stop.metadata["samples_count"] // gbs
    assert stop.time_ms == next(r.timestamp_ms for r in rows if r.step == passed)
    (block_stop,) = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == rows[-1].timestamp_ms
    logged = {
        e.metadata["samples_count"] // gbs: float(e.value)
        for e in events
        if e.key == "eval_accuracy"
    }
    assert sorted(logged) == list(range(first, passed + 1))
    assert all(acc <= 0.69 for step, acc in logged.items() if step < passed)
    assert logged[passed] > 0.69
    assert set(range(first, passed + 1)) <= set(evaluated)
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict
    assert result.states[("evaluation.check", -1)] == "success"
    return passed, rows
