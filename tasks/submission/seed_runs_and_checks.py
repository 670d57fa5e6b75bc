"""The tasks of a submission after ``plan``: one run per seed, packaging, the official checkers
and the report. Each checker task persists its verdict before it passes or fails, so
``report`` (which runs after any outcome) can say why a check failed."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import TriggerRule, XComArg, task

from rcpflow import recipe
from rcpflow.files.layout import dirname, join
from rcpflow.submission import checkers
from rcpflow.submission.checkers import CheckResult
from rcpflow.submission.package import package_submission
from tasks.names import RUN_DAG_ID, CheckTool
from tasks.results.assets import REPORT, publish
from tasks.results.verdicts import record, tool_log_dir
from tasks.run.spec import XComValue
from tasks.submission.report import write_report
from tasks.submission.spec import SubmissionSpec, system_description
from tasks.views.html_report import HTML_NAME

if TYPE_CHECKING:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

log = logging.getLogger(__name__)


class CheckFailed(RuntimeError):
    """An official checker reported errors; the message lists them."""


@task
def seed_triggers(spec: XComValue) -> list[dict[str, Any]]:
    return SubmissionSpec.from_dict(spec).triggers()


def seed_runs(triggers: XComArg, *, poke_interval: int = 10) -> MappedOperator:
    """``run_seed``: one mlperf_grpo_run per seed, waited for without holding a worker slot."""
    return TriggerDagRunOperator.partial(
        task_id="run_seed",
        trigger_dag_id=RUN_DAG_ID,
        wait_for_completion=True,
        deferrable=True,
        poke_interval=poke_interval,
        reset_dag_run=True,
        allowed_states=["success"],
        failed_states=["failed"],
        map_index_template="seed {{ task.conf['seed'] }}",
    ).expand_kwargs(triggers)


def _code_dirs() -> list[str]:
    """The implementation's source trees to ship in benchmarks/<bm>/implementations/."""
    found = []
    for package in ("tpu_jobs", "rcpflow"):
        spec = importlib.util.find_spec(package)  # finds without importing (tpu_jobs needs jax)
        if spec is not None and spec.submodule_search_locations:
            found.append(next(iter(spec.submodule_search_locations)))
    return found


@task
def package(spec: XComValue) -> str:
    sub = SubmissionSpec.from_dict(spec)
    org = package_submission(
        [sub.run_dir(s) for s in sub.seeds],
        list(sub.seeds),
        sub.out_dir,
        system_description(sub),
        division=sub.division,
        code_dirs=_code_dirs(),
    )
    log.info("submission folder: %s", org)
    return org


def _rcp(sub: SubmissionSpec, org: str, log_dir: str) -> tuple[str, CheckResult]:
    subject = join(org, "results", system_description(sub).system_name, recipe.BENCHMARK)
    return subject, checkers.rcp(subject, log_dir=log_dir)


def _package(sub: SubmissionSpec, org: str, log_dir: str) -> tuple[str, CheckResult]:
    return org, checkers.package(org, log_dir=log_dir)


def _result_summary(sub: SubmissionSpec, org: str, log_dir: str) -> tuple[str, CheckResult]:
    return org, checkers.result_summary(org, log_dir=log_dir)


# What each tool checks (its subject) and its result.
_CHECKS: dict[CheckTool, Callable[[SubmissionSpec, str, str], tuple[str, CheckResult]]] = {
    "rcp_checker": _rcp,
    "package_checker": _package,
    "result_summarizer": _result_summary,
}


def _run_check(tool: CheckTool, spec: XComValue, org: str) -> dict[str, Any]:
    sub = SubmissionSpec.from_dict(spec)
    subject, result = _CHECKS[tool](sub, org, tool_log_dir(sub.out_dir))
    verdict = record(result, subject=subject, folder=sub.out_dir)
    for line in result.output.splitlines()[-30:]:
        log.info("%s | %s", tool, line)
    if not verdict.ok:
        raise CheckFailed(f"{tool} on {subject}:\n  " + "\n  ".join(verdict.errors or ("?",)))
    log.info("%s", verdict.headline())
    return {"tool": tool, "ok": True, "score_minutes": verdict.score_minutes}


@task
def rcp_check(spec: XComValue, org: XComValue) -> dict[str, Any]:
    return _run_check("rcp_checker", spec, org)


@task
def package_check(spec: XComValue, org: XComValue) -> dict[str, Any]:
    return _run_check("package_checker", spec, org)


@task
def result_summary(spec: XComValue, org: XComValue) -> dict[str, Any]:
    return _run_check("result_summarizer", spec, org)


# After any outcome of the runs and checks, but not when `plan` refused the Params: then
# there is no submission to report on (its one success is `plan`'s).
@task(trigger_rule=TriggerRule.ALL_DONE_MIN_ONE_SUCCESS, outlets=[REPORT])
def report(spec: XComValue) -> str:
    path, passed = write_report(SubmissionSpec.from_dict(spec))
    if not passed:
        raise CheckFailed(f"the submission did not pass every check; see {path}")
    publish(REPORT, path, verdict="PASS")
    publish(REPORT, join(dirname(path), HTML_NAME), verdict="PASS")
    return path
