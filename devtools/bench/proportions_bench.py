"""``make bench``'s proportions section: the submission DAG (three seeds) with the rehearsal
jobs at the benchmark's proportions, scaled down in time, once per eval schedule and window,
under the real scheduler, against `rcpflow forecast`'s machine model calibrated once on the
first row; into BENCHMARKS.md (its own section), run through `devtools.bench.verdict_bench`
(``--section proportions``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from devtools.bench.load_calibration import Calibration, Phases, background, calibrate, phases
from devtools.bench.run_verdicts import RUN_TIMEOUT_S, WORKDIR, iso_ms, run_verdict
from devtools.servers.airflow_server import (
    AirflowServerError,
    LocalAirflow,
    ServerConfig,
    TimedRun,
    repo_config,
)
from devtools.servers.postgres_server import LocalPostgres
from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.planning.forecast import Scenario, simulate
from rcpflow.planning.rehearsal import load_profile
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.retention.apply import retention_notes
from tasks.deployment import ENV_VAR, REPO_ROOT
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID

PROPORTIONS_START = "<!-- verdict-bench-proportions:start -->"
PROPORTIONS_END = "<!-- verdict-bench-proportions:end -->"
PROPORTIONS: tuple[tuple[str, int], ...] = tuple(
    (s, w) for s in ("after_training", "during_training") for w in (1, 3, 10)
)
REHEARSAL_DEPLOYMENT = REPO_ROOT / "docker" / "deployment.rehearsal.toml"
PROFILE = load_profile(str(REPO_ROOT / "tpu_jobs" / "rehearsal" / "profile.toml"))
SEEDS = (1, 2, 3)
POLL_S = 0.5


@dataclass(frozen=True)
class SeedRun:
    """One seed of a submission, from its files and its task instances, in measured seconds."""

    seed: int
    passing_step: int
    start_s: float  # run_start, after the submission's trigger
    verdict_s: float  # the latest eval_stop of the steps up to the passing one, after trigger
    ideal_s: float  # passing step's weight update (after trigger) + its evaluation time
    eval_busy_s: float  # evaluation jobs' time: summaries' eval times, stopped tasks' runs
    wasted: int  # evaluate tasks above the passing step that ran a task process
    steps_trained: int
    task_start_s: list[float]  # evaluate task start after its wait ended
    free_skips: int  # evaluate tasks above the passing step skipped without a task process
    above: int  # evaluate tasks above the passing step
    # What the forecast's load model is calibrated from, in s after the trigger: every task
    # instance of the run (TASK_FIELDS, dates as offsets), each weight update [step, t] and each
    # summary's [step, eval_start, eval_stop]; with retention, each checkpoint's deletion as
    # the run's retention record has it, [step, t]
    tasks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    updates: list[list[float]] = dataclasses.field(default_factory=list)
    evaluations: list[list[float]] = dataclasses.field(default_factory=list)
    deletions: list[list[float]] = dataclasses.field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.verdict_s / self.ideal_s


class ProportionRow(NamedTuple):
    """One configuration of the three-seed submission: its seeds' runs, the load it ran under."""

    schedule: str
    window: int
    seeds: tuple[SeedRun, ...]
    load: str
    # [t after the trigger, 1-minute load average, runnable processes] once a second
    samples: tuple[tuple[float, float, int], ...] = ()
    submission_tasks: tuple[dict[str, Any], ...] = ()  # the submission DAG's (as SeedRun.tasks)
    # per seed: (seed, checkpoints written, peak checkpoints, peak bytes) under its run's
    # checkpoints/, sampled through the run (`CheckpointSampler`)
    storage: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def ratio(self) -> float:
        return max(s.ratio for s in self.seeds)

    @property
    def verdict_s(self) -> float:
        return max(s.verdict_s for s in self.seeds)

    @property
    def eval_busy_s(self) -> float:
        return sum(s.eval_busy_s for s in self.seeds)

    @property
    def wasted(self) -> int:
        return sum(s.wasted for s in self.seeds)


def saved_row(row: ProportionRow) -> dict[str, Any]:
    """`row` as proportions.json keeps it (read back by --proportions-from)."""
    return {**row._asdict(), "seeds": [dataclasses.asdict(s) for s in row.seeds]}


def loaded_row(saved: dict[str, Any]) -> ProportionRow:
    """A row as `saved_row` kept it, read back."""
    return ProportionRow(
        saved["schedule"],
        saved["window"],
        tuple(SeedRun(**s) for s in saved["seeds"]),
        saved["load"],
        tuple((t, avg, int(n)) for t, avg, n in saved.get("samples", ())),
        tuple(saved.get("submission_tasks", ())),
        tuple(tuple(x) for x in saved.get("storage", ())),
    )


# The deployment's [retention] of a configuration with retention: what the run DAG may delete
# as soon as it may (after each step's evaluation while training runs, the rest once settled).
RETENTION_TABLE = '\n[retention]\nkeep = "passing"\nwhile_training = true\n'


def rehearsal_deployment(
    folder: Path, scale: float, retention: bool = False, eval_retries: int = 0
) -> Path:
    """The shipped rehearsal deployment at time scale `scale`, storing under `folder`; with
    `retention`, its `RETENTION_TABLE`; with `eval_retries`, that many (docs/slurm.md: what
    recovers a verdict lost to Airflow's deferral race)."""
    text = REHEARSAL_DEPLOYMENT.read_text().replace('"0.005"', json.dumps(str(scale)))
    text = text.replace('storage_root = "../runs"', f"storage_root = {json.dumps(str(folder))}")
    settings = f"checkpoint_poll_seconds = {POLL_S}\neval_retries = {eval_retries}\n\n"
    text = text.replace("[jobs.train]", f"{settings}[jobs.train]", 1)
    text += RETENTION_TABLE if retention else ""
    path = folder / "deployment.toml"
    path.write_text(text)
    return path


TASK_FIELDS = ("task_id", "map_index", "state", "try_number", "pid")
TASK_DATES = ("scheduled_when", "queued_when", "start_date", "end_date")


def task_record(ti: dict[str, Any], trigger_ms: int) -> dict[str, Any]:
    """A task instance as proportions.json keeps it: its dates in s after the trigger."""
    return {
        **{k: ti.get(k) for k in TASK_FIELDS},
        **{k: (iso_ms(ti[k]) - trigger_ms) / 1000 if ti.get(k) else None for k in TASK_DATES},
    }


class LoadSampler(threading.Thread):
    """The machine's load once a second while a configuration runs: what the scheduler's task
    starts and the jobs' times stretch with."""

    def __init__(self, trigger_ms: int) -> None:
        super().__init__(daemon=True)
        self.trigger_ms = trigger_ms
        self.samples: list[tuple[float, float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            fields = Path("/proc/loadavg").read_text().split()
            now_ms = time.time_ns() // 1_000_000
            running = int(fields[3].split("/")[0])
            self.samples.append(((now_ms - self.trigger_ms) / 1000, float(fields[0]), running))


class CheckpointSampler(threading.Thread):
    """Each seed's checkpoints on storage every `period_s` while a configuration runs: the
    step folders under its run's ``checkpoints/`` and their bytes (the peak a run holds, with
    retention or without), and every step folder seen (the checkpoints written)."""

    def __init__(self, run_dirs: dict[int, Path], period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.run_dirs = run_dirs
        self.period_s = period_s
        self.seen: dict[int, set[str]] = {s: set() for s in run_dirs}
        self.peak: dict[int, tuple[int, int]] = {s: (0, 0) for s in run_dirs}
        self.done = threading.Event()

    def sample(self) -> None:
        for seed, run_dir in self.run_dirs.items():
            count, size = checkpoints_on_storage(run_dir / "checkpoints", self.seen[seed])
            peak_count, peak_size = self.peak[seed]
            self.peak[seed] = (max(peak_count, count), max(peak_size, size))

    def run(self) -> None:
        while not self.done.wait(self.period_s):
            self.sample()

    def storage(self) -> tuple[tuple[int, int, int, int], ...]:
        """Per seed: (seed, written, peak checkpoints, peak bytes)."""
        return tuple((s, len(self.seen[s]), *self.peak[s]) for s in sorted(self.run_dirs))


def checkpoints_on_storage(checkpoints: Path, seen: set[str] | None = None) -> tuple[int, int]:
    """(step folders, bytes) under a run's `checkpoints` now, each folder's name added to
    `seen`; a file deleted while it is walked (retention at work) counts as gone."""
    count = size = 0
    try:
        folders = [p for p in checkpoints.iterdir() if p.is_dir() and p.name.isdigit()]
    except FileNotFoundError:
        return 0, 0
    for folder in folders:
        if seen is not None:
            seen.add(folder.name)
        count += 1
        for base, _, files in os.walk(folder):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    size += os.lstat(os.path.join(base, name)).st_size
    return count, size


def seed_run(run_dir: str, seed: int, trigger_ms: int, tis: list[dict[str, Any]]) -> SeedRun:
    start_ms = run_start_ms(read_events(RunLayout(run_dir).mllog(seed)))
    assert start_ms is not None
    rows, summaries, step, verdict_ms = run_verdict(run_dir)
    passed = summaries[step]
    update_ms = next(r.timestamp_ms for r in rows if r.step == step)
    first = rows[0].val_start_at
    by_index: dict[tuple[str, int], dict[str, Any]] = {
        (t["task_id"].rsplit(".", 1)[-1], t["map_index"]): t
        for t in tis
        if t["task_id"].startswith("evaluation.checkpoint.")
    }
    busy = sum((v.eval_stop_ms - v.eval_start_ms) / 1000 for v in summaries.values())
    wasted, starts, free, above = 0, [], 0, 0
    for (task, index), ti in by_index.items():
        # a task process ran only where the instance has a pid (the scheduler sets start and
        # end dates on an instance it skips)
        if task == "evaluate" and first + index > step:
            above += 1
            free += ti["state"] == "skipped" and ti["pid"] is None
        if task != "evaluate" or ti["pid"] is None or not ti["start_date"]:
            continue
        wait = by_index.get(("wait", index))
        if wait is not None and wait["end_date"]:
            starts.append((iso_ms(ti["start_date"]) - iso_ms(wait["end_date"])) / 1000)
        if first + index > step:
            wasted += 1
            if first + index not in summaries and ti["end_date"]:  # stopped: its task's run
                busy += (iso_ms(ti["end_date"]) - iso_ms(ti["start_date"])) / 1000
    return SeedRun(
        seed=seed,
        passing_step=step,
        start_s=(start_ms - trigger_ms) / 1000,
        verdict_s=(verdict_ms - trigger_ms) / 1000,
        ideal_s=(update_ms - trigger_ms + passed.eval_stop_ms - passed.eval_start_ms) / 1000,
        eval_busy_s=busy,
        wasted=wasted,
        steps_trained=rows[-1].step,
        task_start_s=starts,
        free_skips=free,
        above=above,
        tasks=[task_record(ti, trigger_ms) for ti in tis],
        updates=[[r.step, (r.timestamp_ms - trigger_ms) / 1000] for r in rows],
        evaluations=[
            [k, (v.eval_start_ms - trigger_ms) / 1000, (v.eval_stop_ms - trigger_ms) / 1000]
            for k, v in sorted(summaries.items())
        ],
        deletions=[
            [n.step, (n.when_ms - trigger_ms) / 1000]
            for n in retention_notes(run_dir)
            if n.part == "checkpoint" and n.state == "gone" and n.when_ms is not None
        ],
    )


# Every row's evaluate tasks have this many retries: an evaluation lost to Airflow's deferral
# race (docs/slurm.md) is retried, not the row lost (seen on a quiet machine: a higher step's
# evaluation stopped at the verdict within 5 s of its deferral, 2026-12-05).
EVAL_RETRIES = 1


def run_proportion(
    schedule: str,
    window: int,
    *,
    scale: float,
    max_steps: int,
    retention: bool = False,
    eval_retries: int = EVAL_RETRIES,
) -> ProportionRow:
    """The submission of `schedule` and W `window` measured on a fresh Airflow (PostgreSQL);
    the deployment as `rehearsal_deployment` makes it."""
    kept = "_retention" if retention else ""
    folder = WORKDIR / f"proportions_{schedule}_w{window}{kept}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    load_avg = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    with LocalPostgres("airflow") as postgres:
        config = repo_config(
            folder / "airflow",
            # per seed: training, W evaluations and a stop_if_decided; the submission's own tasks
            parallelism=len(SEEDS) * (window + 2) + 2,
            env={
                ENV_VAR: str(rehearsal_deployment(folder, scale, retention, eval_retries)),
                # Airflow's default (16 running tasks of a DAG over all its runs) would cap the
                # three seeds' windows together
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "256",
                # SQLite's one writer: under a loaded machine the triggerer or the API died of
                # "database is locked" mid-row (2026-12-05); a deployment's database
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.sqlalchemy_url(),
                # a task process parses the DAG file first: at W=10 on a loaded 2-core machine
                # that took over the default 30 s and failed the tasks (2026-12-05)
                "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "300",
            },
        )
        return submission_row(folder, config, schedule, window, max_steps, load_avg)


def patient_run(airflow: LocalAirflow, conf: dict[str, Any]) -> TimedRun:
    """`LocalAirflow.timed_run` of the submission, its watch outliving an API request that
    timed out or failed while the machine is loaded (three rows in a row died of one, the
    run itself unharmed, 2026-12-05); a component that dies, or failures for a minute, still
    end it."""
    airflow.ready(SUBMISSION_DAG_ID)
    trigger_ms = time.time_ns() // 1_000_000
    run_id = airflow.trigger(SUBMISSION_DAG_ID, conf)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    failing_since: float | None = None
    while time.monotonic() < deadline:
        airflow.check_alive()
        try:
            state = airflow.dag_run(SUBMISSION_DAG_ID, run_id)["state"]
        except (AirflowServerError, OSError):
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > 60:
                raise
            time.sleep(1.0)
            continue
        failing_since = None
        if state in ("success", "failed"):
            return TimedRun(run_id, str(state), trigger_ms, time.time_ns() // 1_000_000)
        time.sleep(1.0)
    raise AirflowServerError(f"{SUBMISSION_DAG_ID} run {run_id} not over in {RUN_TIMEOUT_S} s")


def submission_row(
    folder: Path,
    config: ServerConfig,
    schedule: str,
    window: int,
    max_steps: int,
    load_avg: str,
) -> ProportionRow:
    """The submission of `schedule` and W `window` on a fresh Airflow of `config`, measured."""
    conf = {
        "seeds": list(SEEDS),
        "global_batch_size": recipe.REFERENCE_BATCH_SIZE,
        "max_steps": max_steps,
        "val_start_at": None,
        "division": "open",
        "storage_root": str(folder),
        "submission_name": "bench",
        "eval_schedule": schedule,
        "eval_window": window,
    }
    with LocalAirflow(config) as airflow:
        airflow.ready(RUN_DAG_ID, SUBMISSION_DAG_ID)
        sampler = LoadSampler(time.time_ns() // 1_000_000)
        stored = CheckpointSampler({s: folder / "bench" / "runs" / f"seed_{s}" for s in SEEDS})
        sampler.start()
        stored.start()
        try:
            run = patient_run(airflow, conf)
        finally:
            for thread in (sampler, stored):
                thread.done.set()
                thread.join()
        stored.sample()  # as the run left them
        runs = {s: airflow.task_instances(RUN_DAG_ID, f"bench__seed_{s}") for s in SEEDS}
        own = airflow.task_instances(SUBMISSION_DAG_ID, run.run_id)
    if run.state != "success":
        raise RuntimeError(f"{schedule} W={window}: submission {run.state}; see {folder}")
    trigger_ms = run.trigger_ms
    seeds = tuple(
        seed_run(str(folder / "bench" / "runs" / f"seed_{s}"), s, trigger_ms, runs[s])
        for s in SEEDS
    )
    offset = (sampler.trigger_ms - trigger_ms) / 1000  # the sampler started just before
    samples = tuple((t + offset, avg, n) for t, avg, n in sampler.samples)
    row = ProportionRow(
        schedule,
        window,
        seeds,
        load_avg,
        samples,
        tuple(task_record(ti, run.trigger_ms) for ti in own),
        stored.storage(),
    )
    print(json.dumps({"schedule": schedule, "window": window, "ratio": row.ratio}), flush=True)
    return row


class Models(NamedTuple):
    """The forecast's overheads, each measured once, on the first row, and given to every row:
    the one task start of the forecast before its machine model, and that model's calibration
    (`devtools.bench.load_calibration`)."""

    task_start_s: float  # an evaluate task's start after its wait ended (median)
    machine: Calibration

    @classmethod
    def measured(cls, first: ProportionRow, scale: float) -> Models:
        return cls(
            statistics.median(t for s in first.seeds for t in s.task_start_s),
            calibrate(
                row_phases(first),
                first.samples,
                eval_s=PROFILE.eval_seconds * scale,
                poll_s=POLL_S,
                cores=os.cpu_count() or 1,
            ),
        )


def row_phases(row: ProportionRow) -> list[Phases]:
    return phases(row.seeds, recipe.val_start_at(recipe.REFERENCE_BATCH_SIZE))


def one_start(row: ProportionRow, models: Models) -> dict[str, Any]:
    """The forecast before its machine model: one measured task start, the poll."""
    return {"task_start_seconds": models.task_start_s, "poll_seconds": POLL_S}


def machine(row: ProportionRow, models: Models) -> dict[str, Any]:
    """The machine model as calibrated, on the row's measured background, the seeds sharing
    the machine."""
    cal = models.machine
    return {
        "task_start_seconds": cal.task_start_s,
        "poll_seconds": cal.poll_s,
        "resume_starts": 1,
        "task_cpu_seconds": cal.task_cpu_s,
        "job_cpu_seconds": cal.job_cpu_s,
        "cores": cal.cores,
        "background_processes": background(row_phases(row), row.samples),
        "concurrent_runs": len(row.seeds),
    }


def rehearsal_scenario(
    schedule: str, window: int, passing_step: int, *, scale: float, max_steps: int, **fields: Any
) -> Scenario:
    """The rehearsal profile's run at time scale `scale` as `simulate` takes it (validation from
    the reference batch's step), with `fields` (a Scenario's other fields)."""
    return Scenario(
        step_seconds=PROFILE.step_seconds * scale,
        eval_seconds=PROFILE.eval_seconds * scale,
        val_start_at=recipe.val_start_at(recipe.REFERENCE_BATCH_SIZE),
        max_steps=max_steps,
        passing_step=passing_step,
        schedule=schedule,  # type: ignore[arg-type]  # one of NAMED_SCHEDULES
        window=window,
        **fields,
    )


def forecast_s(
    row: ProportionRow, overheads: dict[str, Any], scale: float, max_steps: int
) -> float:
    """The forecast of the submission's time to verdict, in measured seconds: per seed its
    run_start offset (measured) plus `rcpflow.planning.forecast`'s verdict for its passing step,
    with `overheads` (a Scenario's fields)."""
    worst = 0.0
    for seed in row.seeds:
        scenario = rehearsal_scenario(
            row.schedule, row.window, seed.passing_step,
            scale=scale, max_steps=max_steps, **overheads,
        )  # fmt: skip
        worst = max(worst, seed.start_s + simulate(scenario).verdict_s)
    return worst


def error(
    row: ProportionRow,
    models: Models,
    model: Callable[[ProportionRow, Models], dict[str, Any]],
    scale: float,
    max_steps: int,
) -> float:
    """(forecast - measured) / measured, `model` one of `one_start`, `machine`."""
    predicted = forecast_s(row, model(row, models), scale, max_steps)
    return (predicted - row.verdict_s) / row.verdict_s


def proportions_table(
    rows: Sequence[ProportionRow], models: Models, scale: float, max_steps: int
) -> str:
    lines = [
        "| schedule | W | verdict ratio | submission time to verdict | evaluation chip-hours "
        "| wasted evaluations | background processes | forecast error: one task start "
        "| forecast error: machine model |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        hours = r.verdict_s / scale / 3600
        chip_hours = r.eval_busy_s / scale * PROFILE.eval_chips / 3600
        before = error(r, models, one_start, scale, max_steps)
        after = error(r, models, machine, scale, max_steps)
        lines.append(
            f"| {r.schedule} | {r.window} | {r.ratio:.2f} | {hours:.2f} h | {chip_hours:,.0f} "
            f"| {r.wasted} | {machine(r, models)['background_processes']:g} | {before:+.0%} "
            f"| {after:+.0%} |"
        )
    return "\n".join(lines)


def goals(rows: Sequence[ProportionRow], models: Models, scale: float, max_steps: int) -> str:
    """Issue 18's and 37's goals, met or not, in this run."""
    during10 = [r for r in rows if r.schedule == "during_training" and r.window == 10]
    errors = [error(r, models, machine, scale, max_steps) for r in rows]
    ratio = (
        f"during_training W=10 verdict ratio {during10[0].ratio:.2f} "
        f"({'met' if during10[0].ratio <= 1.2 else 'not met'})"
        if during10
        else "during_training W=10 not measured"
    )
    i = max(range(len(rows)), key=lambda i: abs(errors[i]))
    text = (
        f"- Goals: {ratio} against at most 1.2; the machine model's forecast error at most "
        f"15 % in every row: {'met' if abs(errors[i]) <= 0.15 else 'not met'} (worst "
        f"{errors[i]:+.0%}, {rows[i].schedule} W={rows[i].window})."
    )
    if abs(errors[i]) > 0.15:
        text += (
            " Where not met: the row's background moved during the row (other work's load comes "
            "and goes within minutes, the median does not follow it), or its phases' CPU "
            "stretched otherwise than the first row's fit."
        )
    return text


def missing(rows: Sequence[ProportionRow]) -> list[str]:
    """A line naming the configurations these measurements lack, if any."""
    have = {(r.schedule, r.window) for r in rows}
    lacking = [f"{s} W={w}" for s, w in PROPORTIONS if (s, w) not in have]
    return [f"- not in these measurements: {', '.join(lacking)}."] if lacking else []


def measured_path(rows: Sequence[ProportionRow], models: Models, scale: float) -> str:
    """Per row, the medians of its evaluations' phases beside the model's for a lone task
    start on the row's background: where a row's error comes from."""
    cal = models.machine
    parts = []
    for r in rows:
        found = row_phases(r)
        if not found:
            continue
        lone = cal.task_start_s + cal.task_cpu_s * max(
            1.0, (machine(r, models)["background_processes"] + len(r.seeds)) / cal.cores
        )
        start = statistics.median(p.eval_start - p.wait_end for p in found)
        job = statistics.median(
            p.resume_queued - p.eval_start - PROFILE.eval_seconds * scale for p in found
        )
        resume = statistics.median(p.eval_stop - p.resume_queued for p in found)
        parts.append(
            f"{r.schedule} W={r.window}: {start:.1f}, {job:.1f}, {resume:.1f} (model {lone:.1f} "
            f"a start)"
        )
    return (
        "- the measured path, medians in s per row: task start (wait ended to the evaluation's "
        "recorded start), the job beyond its evaluation, the resume (queued to the summary); "
        "beside it the model's lone task start on the row's background: " + "; ".join(parts)
    )


def proportions_section(
    rows: Sequence[ProportionRow], models: Models, *, scale: float, max_steps: int, when: str
) -> str:
    steps = {s.seed: s.passing_step for s in rows[0].seeds}
    cal = models.machine
    trained = "; ".join(
        f"{r.schedule} W={r.window}: {', '.join(str(s.steps_trained) for s in r.seeds)}"
        for r in rows
    )
    starts = [t for r in rows for s in r.seeds for t in s.task_start_s]
    return "\n".join(
        [
            PROPORTIONS_START,
            "## Time to verdict at the benchmark's proportions",
            "",
            "Written by `make bench` (`python -m devtools.bench.verdict_bench --section "
            "proportions`): the submission DAG (`mlperf_grpo_submission`, seeds "
            f"{', '.join(map(str, SEEDS))}) under the real scheduler (local Airflow on "
            "127.0.0.1), once per configuration, with the rehearsal jobs "
            "(`docker/deployment.rehearsal.toml`: step "
            f"{PROFILE.step_seconds:.0f} s, evaluation {PROFILE.eval_seconds:,.0f} s on "
            f"{PROFILE.eval_chips} chips) scaled down by one factor, {scale:g} (1/{1 / scale:.0f}"
            f"): a step {PROFILE.step_seconds * scale:.2f} s, an evaluation "
            f"{PROFILE.eval_seconds * scale:.1f} s. gbs {recipe.REFERENCE_BATCH_SIZE}, "
            f"validation from step {recipe.val_start_at(recipe.REFERENCE_BATCH_SIZE)}, "
            f"max_steps {max_steps}; the curve's first passing steps: "
            + ", ".join(f"seed {k} step {v}" for k, v in steps.items())
            + f". The schedule and W are the submission's Params; `eval_retries = {EVAL_RETRIES}` "
            "(an evaluation lost to Airflow's deferral race is retried, docs/slurm.md).",
            "",
            f"- Date: {when}; {platform.machine()}, nproc {os.cpu_count()}; load average at "
            "the start of each configuration: "
            + "; ".join(f"{r.schedule} W={r.window}: {r.load}" for r in rows)
            + " (what else ran: the background processes column)",
            "",
            proportions_table(rows, models, scale, max_steps),
            "",
            "- verdict ratio: as in the section above, per seed from the submission's trigger "
            "(verdict over the passing step's weight update plus its evaluation time); the worst "
            "seed's.",
            "- submission time to verdict: from the trigger to the last seed's verdict, scaled "
            "back up (divided by the factor), in hours.",
            "- evaluation chip-hours: every evaluation's time (a summary's eval times; a stopped "
            f"one's task run) x {PROFILE.eval_chips} chips, scaled back up, all three seeds.",
            "- wasted evaluations: evaluate tasks above a seed's passing step that ran a task "
            "process (their jobs are stopped at the pass, or they skipped at the gate), all "
            "seeds.",
            "- forecast error: (forecast - measured) / measured submission time to verdict; the "
            "forecast is `rcpflow.planning.forecast.simulate` per seed at the scaled times plus "
            "that seed's measured run_start after the trigger, with overheads measured once, on "
            "the first row, and given unchanged to every row. One task start: "
            f"{models.task_start_s:.2f} s (the median evaluate start after its wait ended), poll "
            f"{POLL_S:g} s (`checkpoint_poll_seconds`): the forecast before its machine model. "
            "Machine model (`rcpflow forecast --cores`, the module doc of "
            "`rcpflow/planning/forecast.py`; its calibration `devtools/bench/load_calibration.py`"
            f"), fitted on the first row's {cal.evaluations} evaluations' phases: a task start "
            f"{cal.task_start_s:.2f} s + {cal.task_cpu_s:.2f} CPU s, an evaluation job "
            f"{cal.job_cpu_s:.2f} CPU s beside its evaluation, the evaluate's resume one more "
            f"task start, CPU stretched by the runnable processes over {cal.cores} cores: the "
            f"{len(SEEDS)} seeds' task starts in flight (simulated) plus the row's background "
            "processes (measured: the median runnable processes sampled each second, less the "
            "row's own evaluation phases in flight; other engineers' work and Airflow's loops, "
            "which no forecast of this submission simulates).",
            goals(rows, models, scale, max_steps),
            *missing(rows),
            measured_path(rows, models, scale),
            f"- steps trained per seed: {trained}.",
            "- evaluate instances above the passing step that ended skipped without starting a "
            "task process (their wait ended on the triggerer): "
            + "; ".join(
                f"{r.schedule} W={r.window}: {sum(s.free_skips for s in r.seeds)} of "
                f"{sum(s.above for s in r.seeds)}"
                for r in rows
            )
            + " (before this, each started one and skipped itself: 2-6 s of a task process "
            "each, one at a time).",
            "- Airflow's own latency: an evaluate task starts a median "
            f"{statistics.median(starts):.1f} s (max {max(starts):.1f} s) after its wait ended "
            f"(= {statistics.median(starts) / (PROFILE.eval_seconds * scale):.0%} of a scaled "
            "evaluation; at full scale the same seconds are negligible), the waits poll every "
            f"{POLL_S:g} s, and each seed's run_start comes "
            f"{statistics.median(s.start_s for r in rows for s in r.seeds):.1f} s (median) after "
            "the submission's trigger (plan, the run's trigger, its plan and training task).",
            PROPORTIONS_END,
        ]
    )


def run_proportions(args: argparse.Namespace) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    configs = [
        c
        for c in PROPORTIONS
        if args.only_proportions is None or f"{c[0]}:{c[1]}" in args.only_proportions
    ]
    saved = WORKDIR / "proportions.json"
    if args.proportions_from is not None:  # the section again from a run's measurements
        saved_at = args.proportions_from.stat().st_mtime
        when = datetime.datetime.fromtimestamp(saved_at, datetime.UTC).strftime(
            "measurements saved %Y-%m-%d %H:%M UTC"
        )
        rows = [loaded_row(r) for r in json.loads(args.proportions_from.read_text())]
    else:
        rows = []
        for s, w in configs:
            rows.append(
                run_proportion(s, w, scale=args.scale, max_steps=args.proportions_max_steps)
            )
            saved.write_text(json.dumps([saved_row(r) for r in rows], indent=1))
    models = Models.measured(rows[0], args.scale)
    return proportions_section(
        rows, models, scale=args.scale, max_steps=args.proportions_max_steps, when=when
    )
