"""mlperf_grpo_submission: a whole qwen35_397b_grpo submission, triggered or on a schedule.

``plan`` (Params checked, bad ones refused by name before anything runs) -> ``run_seed`` (one
``mlperf_grpo_run`` per seed, waited for) -> ``package`` (results/, systems/, benchmarks/) ->
the official RCP checker, package checker and result summarizer -> ``report`` (report.md with
the verdicts of every run and check, and the evaluation schedule each run used, with a warning
for a closed-division one outside the rules' wording; runs after any outcome). The Params
``eval_schedule`` and ``eval_window`` are passed to every run. The DAG's own cron schedule is a
deployment setting, off by default.
"""

from airflow.sdk import dag

from tasks.deployment import load_deployment
from tasks.names import SUBMISSION_DAG_ID
from tasks.submission.seed_runs_and_checks import (
    package,
    package_check,
    rcp_check,
    report,
    result_summary,
    seed_runs,
    seed_triggers,
)
from tasks.submission.spec import plan_submission, submission_params

DEPLOYMENT = load_deployment()


@dag(
    dag_id=SUBMISSION_DAG_ID,
    schedule=DEPLOYMENT.schedule,
    catchup=False,
    params=submission_params(DEPLOYMENT),
    tags=["mlperf", "qwen35_397b_grpo", DEPLOYMENT.backend],
    doc_md=__doc__,
)
def mlperf_grpo_submission() -> None:
    spec = plan_submission(DEPLOYMENT.backend, DEPLOYMENT.source)
    runs = seed_runs(seed_triggers(spec))
    org = package(spec)
    runs >> org
    checks = [rcp_check(spec, org), package_check(spec, org), result_summary(spec, org)]
    checks >> report(spec)


mlperf_grpo_submission()
