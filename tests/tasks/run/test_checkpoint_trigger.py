"""The checkpoint trigger's decisions, on real run folders: committed, ended, training failed,
not started (then the task gives its place back), unreadable files. The train group's task
states come from a list here instead of the metadata DB (the scheduler test covers that path)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from airflow.triggers.base import TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent

from devtools.synthetic_run import make_run, rows_of
from rcpflow.files.layout import RunLayout
from tasks.run.spec import RunSpec
from tasks.run.triggers import (
    CheckpointTrigger,
    StartedCheckpointTrigger,
    StartedWait,
    WaitTarget,
    training_state,
    window_admits,
)


class ScriptedTrigger(CheckpointTrigger):
    """The train group's states at each poll come from `script` (the last one repeats)."""

    script: list[Mapping[str, Any]]

    async def train_task_states(self, target: WaitTarget) -> Mapping[str, Any]:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def first_event(
    run_dir: str, step: int, script: list[Mapping[str, Any]], schedule: str = "during_training"
) -> dict[str, Any]:
    trigger = ScriptedTrigger(
        run_dir=run_dir, step=step, seed=1, dag_id="d", run_id="r", train_group_id="train",
        poll_interval_s=0.01, start_grace_s=0.05, schedule=schedule,  # type: ignore[arg-type]
    )  # fmt: skip
    trigger.script = script
    _, kwargs = trigger.serialize()  # what the triggerer rebuilds it from
    assert CheckpointTrigger(**kwargs).serialize() == (
        "tasks.run.triggers.CheckpointTrigger",
        kwargs,
    )

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout=30))


RUNNING = {"train.job.run": "running", "train.check_outputs": None}


@pytest.mark.parametrize(
    ("states", "want"),
    [
        ({"a": None, "b": None}, "not_started"),
        ({"a": "scheduled", "b": None}, "not_started"),
        ({"a": "queued", "b": None}, "running"),
        ({"a": "up_for_retry", "b": None}, "running"),
        ({"a": "success", "b": "running"}, "running"),
        ({"a": "success", "b": "success"}, "succeeded"),
        ({"a": "failed", "b": "upstream_failed"}, "failed"),
    ],
)
def test_training_state(states: dict[str, Any], want: str) -> None:
    assert training_state(states) == want


def test_committed_and_ended(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20)  # stopped at step 20
    assert first_event(run.run_dir, 19, [RUNNING])["state"] == "committed"
    ended = first_event(run.run_dir, 21, [RUNNING])
    assert ended["state"] == "ended" and "block_stop at step 20" in ended["detail"]


def test_waits_while_training_runs_then_sees_the_row(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    # no files yet and training running: it keeps polling; once the group has succeeded
    # without any row it reports the end
    done = {"train.job.run": "success", "train.check_outputs": "success"}
    event = first_event(run_dir, 18, [RUNNING, RUNNING, RUNNING, done])
    assert event["state"] == "ended"
    assert "training finished without a checkpoint of step 18" in event["detail"]


def _still_training(run_dir: str) -> None:
    """Drop the MLLOG's block_stop: the trainer has not halted yet."""
    log = Path(RunLayout(run_dir).mllog(1))
    log.write_text("".join(x for x in log.read_text().splitlines(True) if "block_stop" not in x))


def test_after_training_a_committed_step_waits_until_training_halts(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20)
    _still_training(run.run_dir)
    # during training the committed row is enough
    assert first_event(run.run_dir, 19, [RUNNING])["state"] == "committed"
    # after training it waits while the train group runs, and goes once it has succeeded
    done = {"train.job.run": "success", "train.check_outputs": "success"}
    script = [RUNNING, RUNNING, RUNNING, done]
    assert first_event(run.run_dir, 19, script, "after_training")["state"] == "committed"
    # ... or as soon as the trainer's block_stop is there (the train group still running)
    halted = make_run(str(tmp_path / "halted"), max_steps=24, last_step=24)
    assert first_event(halted.run_dir, 19, [RUNNING], "after_training")["state"] == "committed"


def test_a_waiting_step_ends_at_once_when_a_lower_step_passes(tmp_path: Path) -> None:
    # step 18 passed; step 23 is not saved yet and training still runs: it ends now, not
    # when training stops (during), nor when its row comes (after)
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20, accuracies={18: 0.9})
    _still_training(run.run_dir)
    for schedule in ("during_training", "after_training"):
        event = first_event(run.run_dir, 23, [RUNNING], schedule)
        assert event["state"] == "decided"
        assert event["detail"].startswith("step 23: skipped, not evaluated: step 18 already passed")
    # a lower step below the target decides nothing
    low = make_run(str(tmp_path / "low"), max_steps=24, last_step=20, accuracies={18: 0.3})
    assert first_event(low.run_dir, 19, [RUNNING])["state"] == "committed"


WAIT_ID, EVAL_ID = "evaluation.checkpoint.wait", "evaluation.checkpoint.evaluate"


@pytest.mark.parametrize(
    ("window", "states", "admitted"),
    [
        # nothing evaluated yet: the W lowest committed steps go
        (1, {}, [10]),
        (3, {}, [10, 11, 12]),
        # step 10 done (whatever its end), 11 running: W=1 admits only 11 (already let go)
        (1, {f"{EVAL_ID}_0": "success", f"{EVAL_ID}_1": "running"}, [11]),
        (2, {f"{EVAL_ID}_0": "failed", f"{EVAL_ID}_1": "running"}, [11, 12]),
        # a step whose wait was skipped (decided, ended) frees its slot
        (1, {f"{WAIT_ID}_0": "skipped"}, [11]),
        # a step let go whose evaluate waits for the scheduler or a retry keeps its slot
        (1, {f"{WAIT_ID}_0": "success", f"{EVAL_ID}_0": "up_for_retry"}, [10]),
        (1, {f"{WAIT_ID}_0": "success", f"{EVAL_ID}_0": None}, [10]),
    ],
)
def test_the_eval_window_lets_the_lowest_open_steps_go(
    window: int, states: dict[str, Any], admitted: list[int]
) -> None:
    steps = list(range(10, 16))  # map index i is step 10 + i
    committed = {10, 11, 12, 13}  # 14 and 15 not saved yet: never admitted
    got = [s for s in steps if window_admits(s, window, steps, committed, states, WAIT_ID, EVAL_ID)]
    assert got == admitted


def test_failed_and_not_started_training(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    failed = {"train.job.run": "failed", "train.check_outputs": "upstream_failed"}
    assert first_event(run_dir, 18, [failed])["state"] == "training_failed"
    idle = {"train.job.run": "scheduled", "train.check_outputs": None}
    assert first_event(run_dir, 18, [idle])["state"] == "not_started"
    assert first_event(run_dir, 18, [{}])["state"] == "error"  # no such group


def test_an_unreadable_manifest_is_an_error(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20)
    Path(RunLayout(run.run_dir).manifest).write_text("{broken\n")
    event = first_event(run.run_dir, 19, [RUNNING])
    assert event["state"] == "error" and "manifest" in event["detail"]


# --- the wait started on the triggerer --------------------------------------------------------


class RunTaskInstance:
    """What the triggerer hands a start trigger: the task instance, whose XComs hold the run's
    RunSpec and planned steps (here a dict instead of the metadata DB)."""

    def __init__(self, spec: RunSpec, map_index: int) -> None:
        self.xcoms = {
            "plan": spec.to_dict(),
            "evaluation.planned_steps": list(
                range(spec.effective_val_start_at, spec.max_steps + 1)
            ),
        }
        self.map_index = map_index
        self.dag_id, self.run_id, self.task_id = "d", "r", "evaluation.checkpoint.wait"

    def xcom_pull(self, *, task_ids: str, map_indexes: int) -> Any:
        assert map_indexes == -1  # both are unmapped tasks
        return self.xcoms[task_ids]


class ScriptedStartedTrigger(StartedCheckpointTrigger):
    """Train group states from `script`; every lower step's evaluation is over."""

    script: list[Mapping[str, Any]]

    async def train_task_states(self, target: WaitTarget) -> Mapping[str, Any]:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    async def step_states(self, wait: StartedWait) -> Mapping[str, Any]:
        index = wait.steps.index(wait.target.step)
        return {f"{wait.evaluate_task_id}_{i}": "success" for i in range(index)}


def started_event(
    run_dir: str, step: int, script: list[Mapping[str, Any]], *, val_start: int = 18
) -> Any:
    spec = RunSpec(run_dir, 1, 256, 24, None, "closed")
    trigger = ScriptedStartedTrigger(
        plan_task_id="plan", steps_task_id="evaluation.planned_steps", train_group_id="train",
        poll_interval_s=0.01,
    )  # fmt: skip
    _, kwargs = trigger.serialize()
    assert StartedCheckpointTrigger(**kwargs).serialize()[1] == kwargs
    trigger.script = script
    trigger.task_instance = RunTaskInstance(spec, step - val_start)

    async def first() -> Any:
        async for event in trigger.run():
            return event
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout=30))


def test_a_started_wait_ends_the_task_itself(tmp_path: Path) -> None:
    # Rows 18..20 committed, training stopped at 20; step 18 passed, 19 has no summary yet.
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20, accuracies={18: 0.3})
    committed = started_event(run.run_dir, 19, [RUNNING])
    assert isinstance(committed, TaskSuccessEvent) and committed.xcoms is None
    assert isinstance(started_event(run.run_dir, 21, [RUNNING]), TaskSkippedEvent)  # never saved

    passed = make_run(str(tmp_path / "passed"), max_steps=24, last_step=20, accuracies={18: 0.9})
    # a lower step already passed: nothing to evaluate
    assert isinstance(started_event(passed.run_dir, 19, [RUNNING]), TaskSkippedEvent)


def test_a_started_wait_skips_on_failed_training_and_fails_on_broken_files(
    tmp_path: Path,
) -> None:
    run_dir = str(tmp_path / "run")
    failed = {"train.job.run": "failed", "train.check_outputs": "upstream_failed"}
    assert isinstance(started_event(run_dir, 18, [RUNNING, failed]), TaskSkippedEvent)
    run = make_run(str(tmp_path / "broken"), max_steps=24, last_step=20)
    Path(RunLayout(run.run_dir).manifest).write_text("{broken\n")
    event = started_event(run.run_dir, 19, [RUNNING])
    assert isinstance(event, TaskFailedEvent)


def test_waits_of_a_run_share_one_read_per_poll(tmp_path: Path, monkeypatch) -> None:
    import tasks.run.triggers as triggers

    reads: list[str] = []
    real = triggers.run_snapshot

    def counted(run_dir: str, seed: int) -> Any:
        reads.append(run_dir)
        return real(run_dir, seed)

    monkeypatch.setattr(triggers, "run_snapshot", counted)
    run = make_run(str(tmp_path / "run"), max_steps=24, last_step=20)
    waits = [
        CheckpointTrigger(
            run_dir=run.run_dir,
            step=step,
            seed=1,
            dag_id="d",
            run_id="r",
            train_group_id="train",
            poll_interval_s=5.0,
            start_grace_s=10.0,
        )
        for step in (18, 19, 20)
    ]

    async def all_first() -> list[Any]:
        async def first(t: CheckpointTrigger) -> Any:
            async for event in t.run():
                return event.payload["state"]

        return await asyncio.gather(*(first(t) for t in waits))

    assert asyncio.run(all_first()) == ["committed"] * 3
    assert len(reads) == 1  # three waits, one read of the run's files


def test_required_params_get_nullable_copies_for_the_triggerer() -> None:
    from airflow.sdk import DAG, Param
    from airflow.sdk.bases.operator import BaseOperator
    from airflow.sdk.definitions.param import process_params
    from airflow.serialization.serialized_objects import DagSerialization

    from tasks.run.evaluation_over_steps import nullable_required_params

    def dag_params() -> dict[str, Param]:
        return {"run_dir": Param(type="string", minLength=1), "seed": Param(1, type="integer")}

    def resolve_on_triggerer(task_params: dict[str, Param] | None) -> dict[str, Any]:
        with DAG("d", params=dag_params(), schedule=None) as dag:
            BaseOperator(task_id="t", params=task_params)
        # what the triggerer does for a start_from_trigger task (Airflow 3.3)
        task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task("t")
        return process_params(task.dag, task, {"run_dir": "/r"}, suppress_exception=False)

    with pytest.raises(Exception, match="run_dir: No value passed"):
        resolve_on_triggerer(None)  # the failure the copies are for: still there in Airflow
    with DAG("form", params=dag_params(), schedule=None) as form:
        copies = nullable_required_params(form.params)
    assert set(copies) == {"run_dir"}
    assert resolve_on_triggerer(copies) == {"run_dir": "/r", "seed": 1}


def test_shared_reads_forget_finished_reads_of_runs_gone_quiet() -> None:
    from tasks.run.triggers import SharedReads

    reads = SharedReads()
    reads.keep_s = 0.05
    calls: list[str] = []

    async def read(name: str) -> str:
        calls.append(name)
        return name

    async def scenario() -> None:
        assert await reads.get(("a",), 10.0, lambda: read("a")) == "a"
        assert await reads.get(("a",), 10.0, lambda: read("a")) == "a"  # shared
        await asyncio.sleep(0.1)
        assert await reads.get(("b",), 10.0, lambda: read("b")) == "b"  # drops run a's read
        assert len(reads) == 1
        assert await reads.get(("a",), 10.0, lambda: read("a")) == "a"  # read again

    asyncio.run(scenario())
    assert calls == ["a", "b", "a"]


def test_the_verdict_cache_is_pruned(tmp_path: Path, monkeypatch) -> None:
    import tasks.run.triggers as triggers

    clock = [1000.0]
    monkeypatch.setattr(triggers.time, "monotonic", lambda: clock[0])
    verdicts = triggers.Verdicts()
    monkeypatch.setattr(triggers, "VERDICTS", verdicts)
    old = make_run(str(tmp_path / "old"), max_steps=24, last_step=20, accuracies={18: 0.9})
    new = make_run(str(tmp_path / "new"), max_steps=24, last_step=20, accuracies={18: 0.3})
    assert triggers.lowest_passing(old.run_dir, tuple(rows_of(old.run_dir))) == 18
    assert {k[0] for k in verdicts} == {old.run_dir}
    clock[0] += verdicts.keep_s  # the old run's waits are long over
    assert triggers.lowest_passing(new.run_dir, tuple(rows_of(new.run_dir))) is None
    assert {k[0] for k in verdicts} == {new.run_dir}


def test_a_worker_started_wait_defaults_to_the_rules_schedule() -> None:
    from rcpflow.verdict.schedule import DEFAULT_SCHEDULE

    trigger = CheckpointTrigger(
        run_dir="r", step=18, seed=1, dag_id="d", run_id="r", train_group_id="train",
        poll_interval_s=1.0, start_grace_s=1.0,
    )  # fmt: skip
    assert trigger.schedule == DEFAULT_SCHEDULE == "after_training"


@pytest.mark.parametrize("val_start_at", [2, None])
def test_a_worker_started_wait_imports_a_train_jobs_tree_before_its_first_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, val_start_at: int | None
) -> None:
    """A NeMo-RL trainer's step_<N>/ tree on a cluster backend: a wait that started on a
    worker imports it from the run's validation start during training, as a started wait does
    (without it, only the output check after training would write the first rows). The
    deployment's train result comes in the trigger's kwargs: the triggerer never loads the
    deployment (found by the whole submission on the real control plane: there, with no
    backend registered, loading a deployment with a [gke] table failed every wait)."""
    from foreign import nemo_trainer
    from foreign.deployment import write_nemo_deployment

    import tasks.backends.registry  # noqa: F401  (the DAG file's view of the deployment)
    from tasks.deployment import parse_deployment
    from tasks.run.triggers import train_result_kwargs

    run_dir = tmp_path / "run"
    layout = RunLayout(str(run_dir))
    monkeypatch.setenv("MLPERF_MLLOG_FILE", layout.mllog(1))
    file = write_nemo_deployment(tmp_path / "d.toml")
    deployment = parse_deployment(file.read_text(), source=str(file), base_dir=tmp_path)
    result = deployment.jobs.train.result
    assert result.imported
    # a deployment the trigger cannot load: it must not try
    monkeypatch.setenv("RCPFLOW_DEPLOYMENT", str(tmp_path / "absent.toml"))
    argv = ["--checkpoint-dir", layout.checkpoints_dir, "--seed", "1", "--global-batch-size",
            "16", "--max-steps", "3", "--val-start-at", "2", "--division", "open"]  # fmt: skip
    assert nemo_trainer.main(argv) == 0
    trigger = ScriptedTrigger(
        run_dir=str(run_dir), step=2, seed=1, dag_id="d", run_id="r", train_group_id="train",
        poll_interval_s=0.01, start_grace_s=0.05, schedule="during_training",
        val_start_at=val_start_at, train_result=train_result_kwargs(result),
    )  # fmt: skip
    trigger.script = [RUNNING]
    rebuilt = CheckpointTrigger(**trigger.serialize()[1]).target
    assert (rebuilt.val_start_at, rebuilt.train_result) == (val_start_at, result)

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    event = asyncio.run(asyncio.wait_for(first(), timeout=30))
    if val_start_at is None:  # no row, no validation start: nothing imported (the old wait)
        assert event["state"] != "committed", event
        assert not Path(layout.manifest).exists(), event
        return
    assert event["state"] == "committed", event
    assert [r.step for r in rows_of(str(run_dir))] == [2, 3]
