"""The Slurm driver under the one lifecycle (`RunJobOperator`, `WatchTrigger`,
`CancelRecordedJobs`, `EvaluateOperator`) against the private Slurm, driven as Airflow would
(`slurm_driver`): success; exit 2 and 5 fail at once; other codes restart up to max_restarts,
counted; SIGTERM restarts uncounted; the time limit's SIGTERM lets the job save, then fails
it naming the limit; a job someone else cancelled fails the task; slurmctld restarted under a
watched job; a reused id is a replaced job, never touched; at a pass the higher steps'
evaluation jobs are scancelled (their tasks skip naming the step) and none at or below it; the
teardown and a killed task scancel what the task left; a retry takes a job that ended with
success; no secret in script, log or XCom."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from slurm_driver import context, drive, first_event, start

from devtools.servers.slurm_cluster import SlurmCluster
from tasks.backend_api.job_operator import JobReplacedError, RunJobOperator
from tasks.backend_api.lifecycle_names import JOB_RECORD_KEY, TRAIN_LABEL
from tasks.backend_api.teardown import CancelRecordedJobs
from tasks.backend_api.watch_trigger import WatchTrigger
from tasks.backends.slurm.adapter import job_name
from tasks.backends.slurm.driver import SlurmDriver
from tasks.backends.slurm.hooks import SlurmHook
from tasks.backends.slurm.settings import SecretRef, SlurmJobShape, SlurmSettings
from tasks.deployment import REPO_ROOT
from tasks.jobs.templates import EvalResult, EvaluateJob
from tasks.run.evaluate_operator import EvaluateOperator

PY = sys.executable
# A job that counts its runs in a file and exits with the code given for that run (the last
# code again for later runs).
COUNTING = (
    "import sys,pathlib; f=pathlib.Path(sys.argv[1]); n=int(f.read_text() or 0) if f.exists() "
    "else 0; f.write_text(str(n+1)); codes=[int(c) for c in sys.argv[2:]]; "
    "print('run', n+1, flush=True); sys.exit(codes[min(n, len(codes)-1)])"
)


def settings(jobs: Path, *, max_restarts: int = 0, **shape: Any) -> SlurmSettings:
    role = SlurmJobShape(
        time_limit=shape.pop("time_limit", "10"),
        signal_grace_s=shape.pop("signal_grace_s", 30),
        max_restarts=max_restarts,
        **shape,
    )
    return SlurmSettings(
        working_dir=str(jobs),
        log_dir=str(jobs / "logs"),
        python=PY,
        poll_interval_s=0.5,
        backoff_max_s=1.0,
        command_timeout_s=10,
        train=role,
        evaluate=role,
    )


def op(jobs: Path, argv: list[str], **kw: Any) -> RunJobOperator:
    env = kw.pop("env", {})
    return train_op(SlurmDriver(settings(jobs, **kw)), argv, env=env)


def train_op(driver: SlurmDriver, argv: list[str], **kw: Any) -> RunJobOperator:
    """The run DAG's training task on `driver` (`tasks.run.job_nodes`), without its XComArgs."""
    return RunJobOperator(
        task_id="run", driver=driver, role="train", label=TRAIN_LABEL, argv=argv, **kw
    )


def teardown(driver: SlurmDriver) -> CancelRecordedJobs:
    return CancelRecordedJobs(driver=driver, run_task_id="run")


def ended_as(hook: SlurmHook, job_id: str, state: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (now := hook.job(job_id).state) != state:
        assert time.monotonic() < deadline, now
        time.sleep(0.3)


def counting(jobs: Path, *codes: int) -> list[str]:
    return [PY, "-c", COUNTING, str(jobs / "count"), *map(str, codes)]


def runs(jobs: Path) -> int:
    return int((jobs / "count").read_text())


def test_success(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    ctx = context()
    driven = drive(op(jobs_dir, counting(jobs_dir, 0)), ctx)
    result = driven.result
    assert (result["outcome"], result["exit_code"]) == ("succeeded", 0)
    assert result["restarts"] == {"counted": 0, "uncounted": 0}
    name = job_name("mlperf_grpo_run", "manual__test", "train")
    assert (result["job_id"], result["name"]) == (driven.job_ids[-1], name)
    assert isinstance(result["submit_time"], int) and result["submit_time"] > 0
    recorded = ctx["ti"].pushed[JOB_RECORD_KEY]
    assert recorded["job_id"] == driven.job_ids[-1] and recorded["cancel"] is True
    assert recorded["name"] == name
    # the one event format, the job's end in the lifecycle's terms
    (event,) = driven.events
    assert set(event) == {"phase", "reason", "message", "ref", "state", "budget", "kwargs"}
    assert (event["phase"], event["state"]["outcome"], event["state"]["exit_code"]) == (
        "ended", "succeeded", 0,
    )  # fmt: skip
    assert event["state"]["line"] == "COMPLETED, exit code 0"


@pytest.mark.parametrize("code", [2, 5])
def test_user_errors_fail_at_once(slurm_env: SlurmCluster, jobs_dir: Path, code: int) -> None:
    with pytest.raises(AirflowFailException, match=f"exit code {code}.*user error") as caught:
        drive(op(jobs_dir, counting(jobs_dir, code), max_restarts=3), context(f"r{code}"))
    assert runs(jobs_dir) == 1
    assert "last output lines:" in str(caught.value) and "run 1" in str(caught.value)
    assert "not restarted" in str(caught.value)


def test_other_codes_restart_counted_up_to_max_restarts(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    ctx = context("r1")
    left = r"no restart left \(2 of max_restarts=2"
    with pytest.raises(AirflowFailException, match=left) as caught:
        drive(op(jobs_dir, counting(jobs_dir, 1, 1, 1, 0), max_restarts=2), ctx)
    assert runs(jobs_dir) == 3
    driven = caught.value.driven  # type: ignore[attr-defined]
    assert len(set(driven.job_ids)) == 3  # a new Slurm job for each restart
    assert [e["budget"] for e in driven.events] == [
        {}, {"counted": 1, "uncounted": 0}, {"counted": 2, "uncounted": 0},
    ]  # fmt: skip
    recorded = ctx["ti"].pushed[JOB_RECORD_KEY]
    assert (recorded["job_id"], recorded["cancel"]) == (driven.job_ids[-1], True)


def test_a_restart_that_then_succeeds(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    driven = drive(op(jobs_dir, counting(jobs_dir, 1, 0), max_restarts=1), context("r2"))
    assert driven.result["restarts"] == {"counted": 1, "uncounted": 0}
    assert len(set(driven.job_ids)) == 2 and runs(jobs_dir) == 2


def test_sigterm_restarts_uncounted(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    driven = drive(op(jobs_dir, counting(jobs_dir, 143, 143, 0), max_restarts=0), context("r3"))
    assert driven.result["restarts"] == {"counted": 0, "uncounted": 2}
    assert driven.result["outcome"] == "succeeded" and len(set(driven.job_ids)) == 3


def test_a_job_someone_else_cancelled_fails_the_task(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    """scancel by hand: no restart, no retry (AirflowFailException), naming it; the record
    says the teardown may cancel (it had ended)."""
    task = op(jobs_dir, [PY, "-c", "import time; time.sleep(300)"], max_restarts=3)
    ctx = context("cancelled")
    deferred = start(task, ctx)
    job_id = deferred.trigger.ref["job_id"]
    SlurmHook(settings(jobs_dir)).cancel(job_id)
    with pytest.raises(AirflowFailException, match=r"CANCELLED.*cancelled by someone else"):
        drive(task, ctx, deferred, timeout_s=60)
    assert ctx["ti"].pushed[JOB_RECORD_KEY]["cancel"] is True
    assert teardown(task.driver).execute(ctx) == [  # type: ignore[arg-type]
        {"job": f"Slurm job {job_id} ({deferred.trigger.ref['name']})", "cancelled": False}
    ]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_time_limit_signal_lets_the_job_save_then_fails_it(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    """time limit 2 min, signal 60 s before: the batch shell passes SIGTERM on, the job
    saves and exits 143; the watch names the time limit (counted: no restart left)."""
    saver = (
        "import signal,sys,time,pathlib\n"
        "def term(*_):\n"
        " pathlib.Path(sys.argv[1]).write_text('saved'); print('saved', flush=True)\n"
        " sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    with pytest.raises(AirflowFailException, match="time limit's SIGTERM") as caught:
        drive(
            op(jobs_dir, [PY, "-c", saver, str(jobs_dir / "saved")], time_limit="2",
               signal_grace_s=60),
            context("r4"),
            timeout_s=300,
        )  # fmt: skip
    took = time.monotonic() - started
    assert (jobs_dir / "saved").read_text() == "saved"
    assert "exit code 143" in str(caught.value)
    assert "no restart left (0 of max_restarts=0 used)" in str(caught.value)
    # before the limit itself; Slurm may send the signal up to 60 s early (sbatch --signal)
    assert took < 120, took


def test_slurmctld_restarted_under_a_watched_job(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    started, go = jobs_dir / "started", jobs_dir / "go"
    # The task runs (srun needs slurmctld to start it) before slurmctld stops, and ends while
    # slurmctld is down: marked by files, not by the clock.
    code = (
        f"import pathlib,time\npathlib.Path({str(started)!r}).touch()\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.1)\nprint('end')\n"
    )
    task = op(jobs_dir, [PY, "-c", code])
    ctx = context("r5")
    deferred = start(task, ctx)

    def restart() -> None:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        slurm_env.stop_controller()
        go.touch()
        time.sleep(3)  # the watch polls a controller that is down meanwhile
        slurm_env.start_controller()

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        driven = drive(task, ctx, deferred, timeout_s=120)
    finally:
        thread.join()
    assert started.exists()
    assert driven.result["outcome"] == "succeeded"
    assert len(set(driven.job_ids)) == 1  # the same job, never submitted again


def test_a_job_id_naming_another_job_is_a_named_error(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    """The id of the task's job names another job now (slurmctld's state reset): the task
    fails without retries (`JobReplacedError`), and neither it, a kill nor its teardown touches
    the job of that id."""
    import asyncio

    task = op(jobs_dir, [PY, "-c", "import time; time.sleep(30)"])
    ctx = context("r6")
    deferred = start(task, ctx)
    trigger: WatchTrigger = deferred.trigger
    kwargs = trigger.kwargs()
    kwargs["ref"] = {**kwargs["ref"], "submit_time": kwargs["ref"]["submit_time"] - 86400}
    event = asyncio.run(first_event(WatchTrigger(**kwargs), 30))
    assert (event["phase"], event["state"]["outcome"]) == ("ended", "foreign")
    with pytest.raises(JobReplacedError, match="reused the id"):
        task.execute_complete(ctx, event)
    assert isinstance(JobReplacedError("x"), AirflowFailException)  # no retry
    assert ctx["ti"].pushed[JOB_RECORD_KEY]["cancel"] is False  # never touched
    task.on_kill()  # it owns nothing now
    job_id = trigger.ref["job_id"]
    where = f"Slurm job {job_id} ({trigger.ref['name']})"
    assert teardown(task.driver).execute(ctx) == [{"job": where, "cancelled": False}]  # type: ignore[arg-type]
    assert task.driver.cancel(kwargs["ref"]) is False  # not the job it names
    hook = SlurmHook(settings(jobs_dir))
    assert hook.job(job_id).state in ("PENDING", "RUNNING")
    hook.cancel(job_id)


def test_the_teardown_cancels_what_its_task_left_running(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    task = op(jobs_dir, [PY, "-c", "import time; time.sleep(300)"])
    ctx = context("r7")
    deferred = start(task, ctx)  # then the task is marked failed, say: its trigger is gone
    job_id = deferred.trigger.ref["job_id"]
    where = f"Slurm job {job_id} ({deferred.trigger.ref['name']})"
    cleanup = teardown(task.driver)  # type: ignore[arg-type]
    assert cleanup.task_id == "cleanup"
    assert cleanup.execute(ctx) == [{"job": where, "cancelled": True}]
    ended_as(SlurmHook(settings(jobs_dir)), job_id, "CANCELLED")
    assert cleanup.execute(ctx) == [{"job": where, "cancelled": False}]  # it had ended


def test_a_killed_task_cancels_the_job_it_owns(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    task = op(jobs_dir, [PY, "-c", "import time; time.sleep(300)"])
    deferred = start(task, context("killed"))
    task.on_kill()  # marked failed by hand while deferred, say
    ended_as(SlurmHook(settings(jobs_dir)), deferred.trigger.ref["job_id"], "CANCELLED")


def test_a_retry_takes_the_job_that_ended_with_success(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    """The first try's verdict is lost (it defers and never sees its trigger's event, as under
    Airflow's scheduler race, docs/slurm.md); its job ends 0; the retry takes that job's
    outcome without a new job or a deferral. A first try never does."""
    first = start(op(jobs_dir, counting(jobs_dir, 0)), context("lost-verdict"))
    job_id = first.trigger.ref["job_id"]
    hook = SlurmHook(settings(jobs_dir))
    deadline = time.monotonic() + 60
    while not hook.job(job_id).finished:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    retry = context("lost-verdict")
    retry["ti"].try_number = 2
    driven = drive(op(jobs_dir, counting(jobs_dir, 0)), retry)
    assert (driven.job_ids, driven.result["job_id"], runs(jobs_dir)) == ([], job_id, 1)
    assert (driven.result["outcome"], driven.result["exit_code"]) == ("succeeded", 0)
    assert retry["ti"].pushed[JOB_RECORD_KEY]["cancel"] is True
    again = drive(op(jobs_dir, counting(jobs_dir, 0)), context("lost-verdict"))
    assert again.job_ids != [job_id] and runs(jobs_dir) == 2  # a first try submits


def test_no_secret_in_script_log_or_xcom(
    slurm_env: SlurmCluster, jobs_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = f"hf_{time.time_ns()}_secret"
    (jobs_dir / "token").write_text(secret)
    code = "import os; print('token length', len(os.environ['HF_TOKEN']))"
    task = op(
        jobs_dir,
        [PY, "-c", code],
        secret_env={"HF_TOKEN": SecretRef(file=str(jobs_dir / "token"))},
    )
    ctx = context("r8")
    driven = drive(task, ctx)
    logged = "".join(capsys.readouterr())  # Airflow's task log lines (structlog)
    assert driven.result["outcome"] == "succeeded"
    assert f"token length {len(secret)}" in logged  # the job's output, in the task log
    assert secret not in logged
    assert secret not in json.dumps(ctx["ti"].pushed) + json.dumps(driven.result)
    assert secret not in json.dumps(driven.events)
    for path in (jobs_dir / "logs").iterdir():
        assert secret not in path.read_text()
    script = SlurmHook(settings(jobs_dir))._run(
        "scontrol", "write", "batch_script", driven.job_ids[-1], "-"
    )
    assert "HF_TOKEN" in script.stdout and secret not in script.stdout
    assert "export RCPFLOW_RUN_OWNER=" in script.stdout  # the run folder's owner, as elsewhere


def test_a_pass_cancels_the_higher_steps_evaluation_jobs_only(
    slurm_env: SlurmCluster, jobs_dir: Path, tmp_path: Path
) -> None:
    from devtools.synthetic_run import make_run, write_eval

    run = make_run(str(tmp_path / "run"), last_step=22)  # rows 18..22, no summaries
    write_eval(run, 19, 0.8)  # a passing summary for step 19, staged: the job puts it in place
    staged = jobs_dir / "staged.json"
    Path(run.layout.summary(19)).rename(staged)
    evaluator = (
        "import shutil,sys,time,pathlib; step=int(sys.argv[1]); time.sleep(2)\n"
        "if step == 19:\n"
        " pathlib.Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)\n"
        " shutil.copy(sys.argv[3], sys.argv[2] + '/summary.json'); sys.exit(0)\n"
        "time.sleep(300)\n"
    )
    eval_job = EvaluateJob(
        command=("{python}", "-c", evaluator, "{step}", "{summary_dir}", str(staged))
    )
    s = settings(jobs_dir)
    ops, deferred = {}, {}
    for step in (18, 19, 20, 21):
        ops[step] = EvaluateOperator(
            task_id="evaluate", driver=SlurmDriver(s), eval_job=eval_job, run_dir=run.run_dir,
            row=next(r for r in _rows(run.run_dir) if r["step"] == step),
        )  # fmt: skip
        ctx = context("r9", task_id="evaluate")
        deferred[step] = (ctx, start(ops[step], ctx))
    hook = SlurmHook(s)
    ids = {step: d.trigger.ref["job_id"] for step, (_, d) in deferred.items()}
    names = {step: d.trigger.ref["name"] for step, (_, d) in deferred.items()}
    assert names[20] == job_name("mlperf_grpo_run", "r9", "eval-20")

    ctx19, d19 = deferred[19]
    passed = drive(ops[19], ctx19, d19, timeout_s=60)
    assert passed.result["target_reached"] is True

    for step in (20, 21):
        ctx, d = deferred[step]
        with pytest.raises(
            AirflowSkipException, match=f"step {step}: skipped.*step 19 already passed"
        ):
            drive(ops[step], ctx, d, timeout_s=60)
        assert hook.job(ids[step]).state == "CANCELLED"
    assert hook.job(ids[18]).state == "RUNNING"  # below the pass: never cancelled
    # a step without a running job: nothing to cancel
    assert SlurmDriver(s).cancel_step("mlperf_grpo_run", "r9", run.run_dir, 22) is False
    hook.cancel(ids[18])


def _rows(run_dir: str) -> list[dict[str, Any]]:
    from tasks.run.stages import load_rows

    return load_rows(run_dir)


def test_an_event_waits_for_the_deferral_to_settle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job that has ended when the trigger first reads it: the event still waits SETTLE_S
    after the trigger started (else the scheduler may fail the task, see the constant): the
    Slurm driver's jobs are quick (`JobDriver.quick_jobs`), so its operator's watch settles."""
    import asyncio

    from tasks.backend_api import watch_trigger
    from tasks.backends.slurm.hooks import JobInfo

    monkeypatch.setattr(watch_trigger, "SETTLE_S", 1.5)
    name = "rcpflow-train-x"
    done = JobInfo("1", name, "COMPLETED", "", 0, 0, 5, 5, 6, 0, "", "n1", 600, "squeue")

    class Ended:
        async def job(self, job_id: str, expected: object) -> JobInfo:
            return done

        async def read_output(self, path: str, offset: int) -> tuple[str, int]:
            return "", offset

    task = op(tmp_path, [PY])
    trigger = task.trigger({"job_id": "1", "name": name, "submit_time": 5}, {}, {}, None)
    assert trigger.settle_s == 1.5
    driver = SlurmDriver.from_args(trigger.driver_args)
    driver._async_hook = Ended()  # type: ignore[assignment]
    trigger._driver = driver
    started = time.monotonic()
    event = asyncio.run(first_event(trigger, 30))
    assert (event["phase"], event["state"]["outcome"]) == ("ended", "succeeded")
    assert time.monotonic() - started >= 1.4


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_evaluation_in_the_training_allocation_stops_at_the_first_pass(
    slurm_env: SlurmCluster, jobs_dir: Path, tmp_path: Path
) -> None:
    """The reference's schedule: after the training (here one that only exits 0, on a run made
    beforehand), the batch script evaluates steps 18, 19, ... in order in its own allocation,
    asking `rcpflow status`; step 19 passes, so step 20 is never evaluated."""
    from devtools.synthetic_run import make_run, write_eval

    run = make_run(str(tmp_path / "run"), last_step=22)  # rows 18..22
    staged = jobs_dir / "staged"
    staged.mkdir()
    for step, accuracy in ((18, 0.5), (19, 0.8)):
        write_eval(run, step, accuracy)
        Path(run.layout.summary(step)).rename(staged / f"{step}.json")
    evaluator = (
        "import pathlib,shutil,sys,time; src=pathlib.Path(sys.argv[3]) / (sys.argv[1] + '.json')\n"
        "if not src.exists(): time.sleep(300)\n"
        "pathlib.Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)\n"
        "shutil.copy(src, sys.argv[2] + '/summary.json')\n"
    )
    then = {
        "argv": [PY, "-c", evaluator, "{step}", "{summary_dir}", str(staged)],
        "python": PY,
        "run_dir": run.run_dir,
        "first": 18,
        "last": 24,
        "nodes": 1,
        "ntasks_per_node": 1,
    }
    reused, out = _train_then_reuse_step_18(jobs_dir, run.run_dir, then, "in-allocation")
    assert (reused.result["step"], reused.result["target_reached"]) == (18, False)
    assert reused.events[0]["phase"] == "ended"  # the training's job, waited for
    assert Path(run.layout.summary(18)).exists() and Path(run.layout.summary(19)).exists()
    assert not Path(run.layout.summary(20)).exists()
    assert "step 18: evaluate" in out and "step 19: evaluate" in out, out
    assert "step 20: skip" in out, out  # step 19 passed: the loop ended there


def _train_then_reuse_step_18(
    jobs_dir: Path,
    run_dir: str,
    then: dict[str, Any],
    run_id: str,
    eval_job: EvaluateJob | None = None,
) -> tuple[Any, str]:
    """A training job that only prints, evaluating `then` in its allocation, and the DAG's own
    evaluation of step 18 beside it: it waits for the training's job, then reuses the summary
    the allocation wrote, with no job of its own. The reuse and the training job's output."""
    import dataclasses

    s = dataclasses.replace(settings(jobs_dir), eval_in_training_allocation=True)
    task = train_op(SlurmDriver(s), [PY, "-c", "print('trained')"], extra=then)
    ctx = context(run_id)
    training = start(task, ctx)
    row = next(r for r in _rows(run_dir) if r["step"] == 18)
    if eval_job is None:
        eval_job = EvaluateJob(command=("{python}", "-c", "raise SystemExit(9)", "{step}"))
    evaluate = EvaluateOperator(
        task_id="evaluate", driver=SlurmDriver(s, eval_job), eval_job=eval_job, run_dir=run_dir,
        row=row,
    )  # fmt: skip
    eval_ctx = context(run_id, task_id="evaluate")
    waiting = start(evaluate, eval_ctx)
    assert waiting.method_name == "after_blocker"
    assert waiting.trigger.ref["job_id"] == training.trigger.ref["job_id"]
    assert waiting.trigger.task_end is None  # only waited for: never ends the evaluate task
    assert JOB_RECORD_KEY not in eval_ctx["ti"].pushed  # not the evaluation's job
    driven = drive(task, ctx, training, timeout_s=120)
    assert driven.result["outcome"] == "succeeded"
    reused = drive(evaluate, eval_ctx, waiting, timeout_s=60)
    assert SlurmHook(s).find_jobs(job_name("mlperf_grpo_run", run_id, "eval-18")) == []
    return reused, next((jobs_dir / "logs").glob("*.out")).read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_foreign_result_is_imported_in_the_training_allocation(
    slurm_env: SlurmCluster, jobs_dir: Path, tmp_path: Path
) -> None:
    """The reference's schedule with an evaluator that leaves a Tunix-style tree (as the
    rehearsal's does): after each step's evaluation the batch script imports what it left with
    the allocation's own clock (`rcpflow eval import --since`). Step 18 imports (below target);
    step 19's evaluator leaves nothing new, and the valid passing attempt that was in the tree
    before it ran is not taken: the step is left to the DAG; step 20 imports and passes, so
    step 21 is never evaluated. The DAG's evaluation of step 18 reuses the imported summary."""
    from devtools.synthetic_run import make_run, write_eval
    from rcpflow.records.summary import read_summary

    run = make_run(str(tmp_path / "run"), last_step=22)  # rows 18..22
    staged, tree = jobs_dir / "staged", jobs_dir / "tree"
    for step, accuracy, where in ((18, 0.5, staged), (19, 0.9, tree), (20, 0.8, staged)):
        write_eval(run, step, accuracy)
        folder = where / f"step_{step}" / "0-old"
        folder.mkdir(parents=True)
        Path(run.layout.summary(step)).rename(folder / "summary.json")
    evaluator = (  # the staged attempt of the step, if any, as a new attempt in the tree
        "import pathlib,shutil,sys,time; step, staged, tree = sys.argv[1:]\n"
        "src=pathlib.Path(staged, f'step_{step}', '0-old')\n"
        "if src.exists(): shutil.copytree(src, pathlib.Path(tree, f'step_{step}', '1-new'))\n"
    )
    before = time.time_ns() // 1_000_000
    then = {
        "argv": [PY, "-c", evaluator, "{step}", str(staged), str(tree)],
        "python": PY, "run_dir": run.run_dir, "first": 18, "last": 24,
        "result_format": "tunix-tree", "result_path": str(tree),
        # the batch shell's `rcpflow eval`: this checkout's, wherever the venv's install points
        "env": {"PYTHONPATH": str(REPO_ROOT)},
    }  # fmt: skip
    eval_job = EvaluateJob(
        command=("{python}", "-c", "raise SystemExit(9)", "{step}"),
        result=EvalResult(format="tunix-tree", path=str(tree)),
    )
    reused, out = _train_then_reuse_step_18(jobs_dir, run.run_dir, then, "foreign", eval_job)
    assert (reused.result["step"], reused.result["target_reached"]) == (18, False)
    for step, reached in ((18, False), (20, True)):
        summary = read_summary(run.layout.summary(step))
        assert summary.target_reached is reached
        assert summary.eval_start_ms >= before, "the allocation's clock, not the source's"
    assert not Path(run.layout.summary(19)).exists(), out  # the old attempt was not this one
    assert "step 19: the evaluate job left no new attempt" in out, out
    assert "step 19: its result does not import: left to the DAG's evaluate task" in out, out
    assert not Path(run.layout.summary(21)).exists()
    assert "step 21: skip" in out, out


def test_a_job_through_the_login_node(slurm: SlurmCluster, ssh_conn: str, jobs_dir: Path) -> None:
    """transport = "ssh": the operator submits and the trigger watches (and shows the output)
    through the SSH provider's hook on the private sshd; a user error still fails at once."""
    import dataclasses

    s = dataclasses.replace(settings(jobs_dir), transport="ssh", ssh_conn_id=ssh_conn)
    ok = train_op(SlurmDriver(s), counting(jobs_dir, 5, 0))
    with pytest.raises(AirflowFailException, match="exit code 5") as caught:
        drive(ok, context("over-ssh"), timeout_s=120)
    assert runs(jobs_dir) == 1
    assert "run 1" in str(caught.value)  # its output, read through the login node
    args = caught.value.driven.events[0]  # type: ignore[attr-defined]
    assert args["state"]["outcome"] == "fail_now"


def test_a_training_still_running_after_the_stop_request_is_scancelled(
    slurm_env: SlurmCluster, jobs_dir: Path, tmp_path: Path
) -> None:
    """Evaluation during training decided the run and wrote the stop request in the run
    folder; a training job still running `stop_grace` later is scancelled and the task ends
    with what was committed."""
    from datetime import timedelta

    from devtools.synthetic_run import make_run
    from rcpflow.verdict.stop_request import request_stop

    run = make_run(str(tmp_path / "run"), last_step=20, accuracies={18: 0.3, 19: 0.8})
    task = train_op(
        SlurmDriver(settings(jobs_dir)), [PY, "-c", "import time; time.sleep(300)"],
        stop_run_dir=run.run_dir, stop_grace=timedelta(seconds=1),
    )  # fmt: skip
    ctx = context("stopped")
    deferred = start(task, ctx)
    assert request_stop(run.run_dir) is not None
    driven = drive(task, ctx, deferred, timeout_s=60)
    assert (driven.result["outcome"], driven.events[-1]["phase"]) == ("stopped", "stopped")
    assert ctx["ti"].pushed[JOB_RECORD_KEY]["cancel"] is True
    ended_as(SlurmHook(settings(jobs_dir)), driven.job_ids[-1], "CANCELLED")


def test_the_run_env_reaches_the_train_jobs_script(tmp_path: Path) -> None:
    """What the run adds to the training job's env (NeMo-RL's MLPERF_MLLOG_FILE, resolved from
    the train_command task's XCom) is exported with the job's own env and the run owner."""
    driver = SlurmDriver(settings(tmp_path))
    train = train_op(
        driver, [PY], env={"A": "1"}, run_env={"MLPERF_MLLOG_FILE": "/runs/r/mllog/seed_1.out"}
    )
    env = driver.batch_job(train.request(context())).env
    assert env["MLPERF_MLLOG_FILE"] == "/runs/r/mllog/seed_1.out" and env["A"] == "1"
    assert "RCPFLOW_RUN_OWNER" in env
    bad = train_op(driver, [PY], run_env=["MLPERF_MLLOG_FILE"])
    with pytest.raises(ValueError, match="run_env must map names to strings"):
        bad.request(context())


def test_the_driver_reaches_the_triggerer_as_json(tmp_path: Path) -> None:
    """What a watch and a step's cancel rebuild on the triggerer (`WatchTrigger.driver_args`):
    the cluster's connection, log folder and exit-code contract of each role, nothing else."""
    import dataclasses

    from tasks.backend_api.protocol import driver_type

    s = dataclasses.replace(
        settings(tmp_path, time_limit="7", signal_grace_s=45),
        transport="ssh", ssh_conn_id="login", export_env=("SITE_PROXY",),
        fail_exit_codes=(2, 5, 7), evaluate=SlurmJobShape(time_limit="3", signal_grace_s=20),
    )  # fmt: skip
    args = json.loads(json.dumps(SlurmDriver(s).args()))
    again = driver_type("slurm").from_args(args)
    assert isinstance(again, SlurmDriver)
    got = again.settings
    for name in ("transport", "ssh_conn_id", "log_dir", "export_env", "command_timeout_s"):
        assert getattr(got, name) == getattr(s, name), name
    assert got.fail_exit_codes == (2, 5, 7)
    for role in ("train", "evaluate"):
        shape, rebuilt = s.shape(role), got.shape(role)
        assert (rebuilt.time_limit_s, rebuilt.signal_grace_s) == (
            shape.time_limit_s, shape.signal_grace_s,
        ), role  # fmt: skip


def _request(role: Any, extra: Any = None) -> Any:
    from tasks.backend_api.protocol import JobRequest

    label = "train" if role == "train" else "eval-18"
    return JobRequest(role, label, "d", "r", "/runs/r", (PY,), extra=extra)


def test_the_training_evaluates_in_its_allocation_only_when_asked(tmp_path: Path) -> None:
    import dataclasses

    from tasks.backends.slurm.in_allocation import in_allocation_eval, in_allocation_fields

    eval_job = EvaluateJob(command=("{python}", "e.py", "{step}", "{summary_dir}"))
    values: dict[str, str | int] = {
        "run_dir": "/runs/r", "seed": 1, "val_start_at": 18, "max_steps": 30,
    }  # fmt: skip
    plain = SlurmDriver(settings(tmp_path), eval_job)
    assert plain.train_extra(values) is None
    assert plain.waits_for(_request("evaluate"), None) is None  # no cluster call
    s = dataclasses.replace(settings(tmp_path), eval_in_training_allocation=True)
    driver = SlurmDriver(s, eval_job)
    extra = driver.train_extra(values)
    assert extra == in_allocation_fields(eval_job, s, values)
    assert json.loads(json.dumps(extra)) == extra  # an XCom
    job = driver.batch_job(_request("train", extra))
    assert job.then_evaluate == in_allocation_eval(extra) and job.then_evaluate is not None
    assert driver.waits_for(_request("train"), None) is None  # the training waits for nothing


def test_a_job_slurm_forgot_is_left_for_a_retry(tmp_path: Path) -> None:
    """JobForgotten (MinJobAge passed, no accounting): the watch cannot follow the job; the
    task fails with its retries (not AirflowFailException), the job left as it is."""
    import asyncio

    from tasks.backends.slurm.hooks import JobForgotten

    class Forgot:
        async def job(self, job_id: str, expected: object) -> Any:
            raise JobForgotten(f"Slurm job {job_id}: unknown to slurmctld")

    task = op(tmp_path, [PY])
    ctx = context("forgot")
    ref = {"job_id": "1", "name": "rcpflow-train-x", "submit_time": 5}
    trigger = task.trigger(ref, {}, {}, None)
    driver = SlurmDriver.from_args(trigger.driver_args)
    driver._async_hook = Forgot()  # type: ignore[assignment]
    trigger._driver = driver
    event = asyncio.run(first_event(trigger, 30))
    assert (event["phase"], event["state"]["outcome"]) == ("ended", "lost")
    with pytest.raises(AirflowException, match=r"unknown to slurmctld.*a retry") as caught:
        task.execute_complete(ctx, event)
    assert not isinstance(caught.value, AirflowFailException)
    assert ctx["ti"].pushed[JOB_RECORD_KEY]["cancel"] is False
