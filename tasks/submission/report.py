"""The submission report (markdown): per run, how it ended, the evaluation schedule it used and
its compliance verdict; what the rules say about those schedules (a closed-division submission
evaluated outside the rules' wording carries a visible warning, not a block); then the RCP
checker, package checker and result summarizer verdicts and the score.

Drawn only from what is on storage (MLLOGs and persisted verdicts), so it can be written after
any failure, and says "not run" where a check never happened rather than guessing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.files.layout import RunLayout, join
from rcpflow.files.storage import storage_for
from rcpflow.records.decided import logged_run_stop
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.verdict.schedule import RULES_WORDING, closed_division_warning
from rcpflow.verdict.schedule_record import ScheduleRecord, ScheduleRecordError, read_schedule
from tasks.names import CHECK_TOOLS, COMPLIANCE_TOOL
from tasks.results.verdicts import Verdict, read_verdict
from tasks.run.stages import aborted_words
from tasks.submission.spec import SubmissionSpec, system_description
from tasks.views.html_report import rcp_section, write_html_report
from tasks.views.storage_index import read_run

log = logging.getLogger(__name__)

REPORT_NAME = "report.md"


@dataclass(frozen=True)
class RunOutcome:
    seed: int
    run_dir: str
    log_path: str
    status: str  # success | aborted | no run_stop | no MLLOG
    step: int | None
    eval_accuracy: float | None
    minutes_to_train: float | None
    evaluated: int
    compliance: Verdict | None
    schedule: ScheduleRecord | None = None  # None: the run recorded none (or an unreadable one)


def _schedule(run_dir: str) -> ScheduleRecord | None:
    try:
        return read_schedule(run_dir)
    except ScheduleRecordError as exc:
        log.warning("%s", exc)
        return None


def run_outcome(spec: SubmissionSpec, seed: int) -> RunOutcome:
    run_dir = spec.run_dir(seed)
    log_path = RunLayout(run_dir).mllog(seed)
    compliance = read_verdict(run_dir, COMPLIANCE_TOOL)
    schedule = _schedule(run_dir)
    if not storage_for(log_path).exists(log_path):
        return RunOutcome(
            seed, run_dir, log_path, "no MLLOG", None, None, None, 0, compliance, schedule
        )
    events = read_events(log_path)
    accuracies = {
        e.metadata["samples_count"]: float(e.value) for e in events if e.key == "eval_accuracy"
    }
    stop = logged_run_stop(events, spec.global_batch_size)
    if stop is None:
        return RunOutcome(
            seed,
            run_dir,
            log_path,
            "no run_stop",
            None,
            None,
            None,
            len(accuracies),
            compliance,
            schedule,
        )
    start = run_start_ms(events)
    return RunOutcome(
        seed=seed,
        run_dir=run_dir,
        log_path=log_path,
        status=stop.status,
        step=stop.step,
        eval_accuracy=None if stop.samples_count is None else accuracies.get(stop.samples_count),
        minutes_to_train=None if start is None else (stop.time_ms - start) / 60000,
        evaluated=len(accuracies),
        compliance=compliance,
        schedule=schedule,
    )


def _cell(value: object, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def _result(o: RunOutcome) -> str:
    """What the run's run_stop says, in words: an aborted run's step is where it gave up."""
    if o.status == "success":
        return f"converged at step {o.step}"
    if o.status == "aborted":
        return aborted_words(o.step)
    return "-"


def _schedule_cell(o: RunOutcome) -> str:
    if o.schedule is None:
        return "not recorded"
    return f"{o.schedule.eval_schedule}, W={o.schedule.eval_window}"


def schedule_lines(spec: SubmissionSpec, outcomes: list[RunOutcome]) -> list[str]:
    """What the runs used and what the rules say about it; the closed-division warning."""
    used = {o.schedule.eval_schedule for o in outcomes if o.schedule is not None}
    lines = ["## Evaluation schedule", ""]
    warnings = [w for s in sorted(used) if (w := closed_division_warning(s, spec.division))]
    lines += [f"> **{w}**" for w in warnings]
    if warnings:
        lines.append("")
    for schedule in sorted(used):
        seeds = [
            str(o.seed) for o in outcomes if o.schedule and o.schedule.eval_schedule == schedule
        ]
        lines.append(f"- seed(s) {', '.join(seeds)}: {RULES_WORDING[schedule]}")
    missing = [str(o.seed) for o in outcomes if o.schedule is None]
    if missing:
        lines.append(f"- seed(s) {', '.join(missing)}: no schedule recorded in the run folder")
    return [*lines, ""]


def render_report(spec: SubmissionSpec) -> tuple[str, bool]:
    """The markdown and whether every verdict passed."""
    outcomes = [run_outcome(spec, s) for s in spec.seeds]
    checks = {tool: read_verdict(spec.out_dir, tool) for tool in CHECK_TOOLS}
    val_start = recipe.val_start_at(spec.global_batch_size, spec.val_start_at)
    system = system_description(spec)
    lines = [
        f"# {recipe.BENCHMARK} submission `{spec.name}`",
        "",
        f"MLPerf Training {recipe.RULESET}, {spec.division} division, backend {spec.backend}; "
        f"global_batch_size {spec.global_batch_size}, max_steps {spec.max_steps}, "
        f"validation from step {val_start}; target eval_accuracy (pass@4) > {spec.target}.",
        "",
        f"- submission folder: `{join(spec.out_dir, 'submission')}`",
        f"- system: `{system.system_name}`",
        "",
        *schedule_lines(spec, outcomes),
        "## Runs",
        "",
        "| seed | status | result | eval_accuracy | minutes to train | checkpoints evaluated "
        "| eval schedule | compliance |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        compliance = o.compliance.headline().split(": ", 1)[1] if o.compliance else "not run"
        lines.append(
            f"| {o.seed} | {o.status} | {_result(o)} | {_cell(o.eval_accuracy, '{:.4f}')} | "
            f"{_cell(o.minutes_to_train, '{:.3f}')} | {o.evaluated} | {_schedule_cell(o)} "
            f"| {compliance} |"
        )
    lines += ["", "## Checkers", ""]
    for tool, verdict in checks.items():
        lines.append(f"- {verdict.headline() if verdict else f'{tool}: not run'}")
        if verdict and not verdict.ok:
            lines += [f"  - {e}" for e in verdict.errors]
    for o in outcomes:
        if o.compliance and not o.compliance.ok:
            lines.append(f"- compliance of seed {o.seed} ({o.log_path}):")
            lines += [f"  - {e}" for e in o.compliance.errors]
    lines += ["", *rcp_section([read_run(o.run_dir, f"seed {o.seed}") for o in outcomes])]
    passed = all(o.compliance is not None and o.compliance.ok for o in outcomes) and all(
        v is not None and v.ok for v in checks.values()
    )
    lines += ["", f"**Verdict: {'PASS' if passed else 'FAIL'}**", ""]
    return "\n".join(lines), passed


def report_path(spec: SubmissionSpec) -> str:
    return join(spec.out_dir, REPORT_NAME)


def write_report(spec: SubmissionSpec) -> tuple[str, bool]:
    """report.md, and beside it report.html with the convergence plot
    (`tasks.views.html_report`)."""
    text, passed = render_report(spec)
    path = report_path(spec)
    storage_for(path).write_atomic(path, text.encode())
    for line in text.splitlines():
        log.info("report | %s", line)
    runs = [read_run(spec.run_dir(s), f"{spec.name}/runs/seed_{s}") for s in spec.seeds]
    html = write_html_report(spec.out_dir, text, f"submission {spec.name}", runs)
    log.info("report with the convergence plot: %s", html)
    return path, passed
