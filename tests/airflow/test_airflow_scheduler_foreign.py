"""End to end under a real scheduler with foreign jobs: the deployment's [jobs] templates run
tests/foreign's trainer (its own checkpoints, rows through `rcpflow manifest add`) and its
Tunix-format evaluator, whose results each evaluate step imports with its own clock; the run
ends with a log the official checker passes."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import failures, run_under_scheduler
from foreign.deployment import FOREIGN_RUN, PASSING_STEP, write_foreign_deployment

from devtools.servers.airflow_server import LocalAirflow
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from rcpflow.records.summary import read_summary
from tasks.results.verdicts import read_verdict


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, start_airflow: Callable[..., Any]
) -> Iterator[LocalAirflow]:
    folder = tmp_path_factory.mktemp("foreign")
    deployment = write_foreign_deployment(folder / "deployment.toml", rows="cli")
    env = {"RCPFLOW_DEPLOYMENT": str(deployment)}
    with start_airflow(tmp_path_factory.mktemp("airflow"), env) as server:
        yield server


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_foreign_jobs_under_the_scheduler(server: LocalAirflow, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    conf = {**FOREIGN_RUN, "run_dir": str(run_dir)}
    run = run_under_scheduler(server, "mlperf_grpo_run", conf, timeout_s=600)

    assert run.state == "success", failures(run, server)
    first, last = FOREIGN_RUN["val_start_at"], FOREIGN_RUN["max_steps"]
    evals = sorted(
        (t for t in run.tis if t["task_id"] == "evaluation.checkpoint.evaluate"),
        key=lambda t: t["map_index"],
    )
    ran = [t for t in evals if t["state"] == "success"]
    # the eval window of 1: in step order, one at a time, nothing after the passing step
    assert [first + t["map_index"] for t in ran] == list(range(first, PASSING_STEP + 1))
    assert all(t["state"] == "skipped" for t in evals if first + t["map_index"] > PASSING_STEP)
    assert len(evals) == last - first + 1
    for earlier, later in itertools.pairwise(ran):
        assert earlier["end_date"] <= later["start_date"]
    layout = RunLayout(str(run_dir))
    manifest = load(layout.manifest)
    assert all("/own_checkpoints/step-" in r.checkpoint_path for r in manifest.rows)
    for step in range(first, PASSING_STEP + 1):
        [tunix] = (run_dir / "tunix_eval" / f"step_{step}").glob("*/summary.json")
        summary = read_summary(layout.summary(step))
        assert summary.pass_at_k == json.loads(tunix.read_text())["pass_at_k"]
        assert summary.eval_start_ms >= manifest.row(step).timestamp_ms
    (stop,) = [e for e in read_events(layout.mllog(1)) if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    assert stop.time_ms == manifest.row(PASSING_STEP).timestamp_ms
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok
