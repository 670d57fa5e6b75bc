"""Evaluation during training under a real scheduler (Airflow on 127.0.0.1, started by the
test, deployment ``eval_schedule = "during_training"``, eval window 2).

The trainer is the toy at a large global batch (1024), held by a pacer after step HOLD_AT
until the stop request exists, so that the evaluations decide the run while it trains on any
machine (under load it once reached max_steps first); seed 1 crosses the target at step 13
(measured: pass@4 0.689 at step 12, 0.777 at 14), and checkpoints are evaluated from step 12.
While training runs, the planned steps' waits
are deferred (on the triggerer: more of them than the scheduler has worker slots); once a
checkpoint passes and every lower one is below target the DAG writes the stop request and the
trainer ends before max_steps. A failed evaluation of a low step decides nothing: training
runs to max_steps and the run fails without run_stop. Retention is on while training
(``[retention] keep = "passing", while_training = true``): each checkpoint evaluated below the
target is deleted by its own evaluate task, before that task ends (so before its slot in the eval
window frees), and a failed evaluation's checkpoint stays.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_harness import PYTHON, ScheduledRun, failures, write_deployment

from devtools.bench.run_verdicts import iso_ms
from devtools.servers.airflow_server import LocalAirflow
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from rcpflow.retention.apply import read_record
from tasks.results.verdicts import read_verdict

PARALLELISM = 4
RUN = {
    "seed": 1,
    "global_batch_size": 1024,
    "max_steps": 60,
    "val_start_at": 12,
    "division": "open",
}
VAL_START = 12
WAIT = "evaluation.checkpoint.wait"
EVALUATE = "evaluation.checkpoint.evaluate"


# The training is held once it has saved this step, until the stop request is written: the
# verdict (step 13) then always comes while it trains, however fast the machine trains.
HOLD_AT = 20
HOLD_MAX_S = 900  # past this the training is let go and the test fails on what it finds

PACER = """
import json, os, signal, subprocess, sys, time
run_dir = args[args.index('--run-dir') + 1]
manifest = os.path.join(run_dir, {manifest!r})
stop_request = os.path.join(run_dir, 'stop_request.json')
child = subprocess.Popen([{python!r}, *args])
def forward(signum, frame):
    child.send_signal(signum)
    child.send_signal(signal.SIGCONT)  # a held child acts on it only once running
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
def saved():
    try:
        with open(manifest) as f:
            return max((json.loads(line)['step'] for line in f if line.endswith('\\n')), default=0)
    except (OSError, ValueError):
        return 0
held_since = None
while child.poll() is None:
    if held_since is None and saved() >= {hold_at} and not os.path.exists(stop_request):
        child.send_signal(signal.SIGSTOP)
        held_since = time.monotonic()
        print('pacer: training held after step', saved(), flush=True)
    elif held_since is not None and held_since > 0 and (
        os.path.exists(stop_request) or time.monotonic() - held_since > {hold_max_s}
    ):
        child.send_signal(signal.SIGCONT)
        held_since = -1.0
        print('pacer: training released', flush=True)
    time.sleep(0.1)
sys.exit(child.returncode if child.returncode >= 0 else 128 - child.returncode)
"""


def job_python(folder: Path) -> Path:
    """The jobs' interpreter: the evaluation of step N fails when the run folder's parent holds
    a file ``fail_eval_N`` (set by a test); the training runs under a pacer (a hook point, not
    a race with the clock) that holds it after step HOLD_AT until the stop request exists; every
    job runs for real otherwise."""
    manifest = os.path.relpath(RunLayout("/run").manifest, "/run")
    pacer = PACER.format(manifest=manifest, python=PYTHON, hold_at=HOLD_AT, hold_max_s=HOLD_MAX_S)
    wrapper = folder / "python"
    wrapper.write_text(
        f"#!{PYTHON}\n"
        "import os, sys\n"
        "args = sys.argv[1:]\n"
        "if args[:2] == ['-m', 'tpu_jobs.evaluate']:\n"
        "    run_dir, step = args[args.index('--run-dir') + 1], args[-1]\n"
        "    if os.path.exists(os.path.join(os.path.dirname(run_dir), 'fail_eval_' + step)):\n"
        "        sys.exit('evaluation failed on purpose')\n"
        "if args[:2] == ['-m', 'tpu_jobs.train']:\n"
        f"    exec({pacer!r})\n"
        f"os.execv({PYTHON!r}, [{PYTHON!r}, *args])\n"
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, start_airflow: Callable[..., Any]
) -> Iterator[LocalAirflow]:
    folder = tmp_path_factory.mktemp("during")
    deployment = write_deployment(
        folder / "deployment.toml",
        python=str(job_python(folder)),
        eval_schedule="during_training",
        eval_window=2,
        checkpoint_poll_seconds=1.0,
    )
    with deployment.open("a") as f:
        f.write('\n[retention]\nkeep = "passing"\nwhile_training = true\n')
    env = {"RCPFLOW_DEPLOYMENT": str(deployment)}
    with start_airflow(folder / "airflow", env, parallelism=PARALLELISM) as server:
        yield server


def follow(server: LocalAirflow, run_id: str, timeout_s: float) -> tuple[str, list[dict]]:
    """Run to its end; returns its state and, per poll while training ran, the task states."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = server.dag_run("mlperf_grpo_run", run_id)["state"]
        tis = server.task_instances("mlperf_grpo_run", run_id)
        train = [t["state"] for t in tis if t["task_id"] == "train.job.run"]
        if train in (["running"], ["deferred"]):  # the local job runs while its task waits
            seen.append({(t["task_id"], t["map_index"]): t["state"] for t in tis})
        if state in ("success", "failed"):
            return state, seen
        time.sleep(1.0)
    raise AssertionError(f"run {run_id} not finished after {timeout_s}s")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_training_stops_at_the_verdict(server: LocalAirflow, run_dir: Path) -> None:
    run_id = server.trigger("mlperf_grpo_run", {**RUN, "run_dir": str(run_dir)})
    state, while_training = follow(server, run_id, timeout_s=1400)
    tis = server.task_instances("mlperf_grpo_run", run_id)
    states = {(t["task_id"], t["map_index"]): t["state"] for t in tis}
    assert state == "success", failures(ScheduledRun(run_id, state, tis), server)

    # Waiting instances hold no worker slot: while training ran,
    # more waits were deferred at once than the scheduler has slots.
    deferred = [sum(1 for (t, _), s in poll.items() if t == WAIT and s == "deferred")
                for poll in while_training]  # fmt: skip
    assert deferred and max(deferred) > PARALLELISM, deferred
    for poll in while_training:
        # the eval window bounds what evaluates, not what waits
        assert sum(1 for (t, _), s in poll.items() if t == EVALUATE and s == "running") <= 2

    layout = RunLayout(str(run_dir))
    events = read_events(layout.mllog(1))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    passed = stop.metadata["samples_count"] // RUN["global_batch_size"]
    rows = load(layout.manifest).rows
    # stopped at the verdict: fewer rows than planned, every one a complete checkpoint
    assert passed <= rows[-1].step < RUN["max_steps"]
    assert [r.step for r in rows] == list(range(VAL_START, rows[-1].step + 1))
    (block_stop,) = [e for e in events if e.key == "block_stop"]
    assert block_stop.time_ms == rows[-1].timestamp_ms
    request = json.loads(Path(layout.stop_request).read_text())
    assert request["step"] == passed
    assert stop.time_ms == next(r.timestamp_ms for r in rows if r.step == passed)
    # waits of steps never trained skipped, saying so; nothing beyond was evaluated
    planned = range(VAL_START, RUN["max_steps"] + 1)
    for index, step in enumerate(planned):
        if step > rows[-1].step:
            assert states[(WAIT, index)] == "skipped"
            assert states[(EVALUATE, index)] == "skipped"
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict
    assert_deleted_inside_their_evaluate_tasks(layout, tis, passed)


def assert_deleted_inside_their_evaluate_tasks(
    layout: RunLayout, tis: list[dict[str, Any]], passed: int
) -> None:
    """Every step below `passed` went in an apply made while training ran (not settled),
    before its evaluate task ended; only the passing checkpoint is left after the final task."""
    record = read_record(layout.root)
    assert record is not None
    *during, final = record["applies"]  # type: ignore[misc]
    assert during and not any(a["settled"] for a in during) and final["settled"] is True
    deleted = {
        p["step"]: p["outcome_ms"]
        for a in during
        for p in a["parts"]
        if p["part"] == "checkpoint" and p.get("outcome") == "deleted"
    }
    below = range(VAL_START, passed)
    assert set(below) <= set(deleted) and passed not in deleted, deleted
    ended = {
        VAL_START + t["map_index"]: iso_ms(t["end_date"])
        for t in tis
        if t["task_id"] == EVALUATE and t["state"] == "success"
    }
    for step in below:
        assert deleted[step] <= ended[step], (step, deleted[step], ended[step])
    steps = range(VAL_START, RUN["max_steps"] + 1)
    left = [s for s in steps if os.path.exists(layout.checkpoint(s))]
    assert left == [passed]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_failed_low_evaluation_does_not_stop_training(
    server: LocalAirflow, tmp_path: Path, run_dir: Path
) -> None:
    (tmp_path / "fail_eval_7").write_text("")  # the recipe's first validation step
    conf = {**RUN, "max_steps": 16, "val_start_at": None, "run_dir": str(run_dir)}
    run_id = server.trigger("mlperf_grpo_run", conf)
    state, _ = follow(server, run_id, timeout_s=1400)
    tis = server.task_instances("mlperf_grpo_run", run_id)
    states = {(t["task_id"], t["map_index"]): t["state"] for t in tis}

    assert state == "failed"
    assert states[(EVALUATE, 0)] == "failed"
    assert states[("evaluation.finalize", -1)] == "upstream_failed"
    layout = RunLayout(str(run_dir))
    assert not os.path.exists(layout.stop_request)
    assert [r.step for r in load(layout.manifest).rows] == list(range(7, 17))
    assert "run_stop" not in [e.key for e in read_events(layout.mllog(1))]
    assert states[("train.check_outputs", -1)] == "success"
    # the failed evaluation's checkpoint stays; the final retention task never ran
    assert os.path.isdir(layout.checkpoint(7))
    assert states[("retention", -1)] == "upstream_failed"
