"""mlperf_grpo_run: one seed of a qwen35_397b_grpo submission.

``plan`` (check the Params) -> ``train`` (the training job on the deployment's backend, then its
outputs checked) -> ``evaluation`` (every saved checkpoint in step order until one passes,
later ones skipped; ``finalize`` writes the eval section and ``run_stop``; ``check`` runs the
official compliance checker). With the deployment's ``eval_schedule = "during_training"`` the
evaluation starts alongside training and stops it at the verdict. Triggered by
``mlperf_grpo_submission`` per seed, or by hand.
"""

from airflow.sdk import dag

from tasks.backends.registry import backend_for, form_defaults
from tasks.deployment import load_deployment
from tasks.names import RUN_DAG_ID
from tasks.run.schedules import evaluation_for
from tasks.run.spec import plan_run, run_params
from tasks.run.train import train_group

DEPLOYMENT = load_deployment()
BACKEND = backend_for(DEPLOYMENT)


@dag(
    dag_id=RUN_DAG_ID,
    schedule=None,
    catchup=False,
    params=run_params(form_defaults(DEPLOYMENT)),
    tags=["mlperf", "qwen35_397b_grpo", BACKEND.name],
    doc_md=__doc__,
)
def mlperf_grpo_run() -> None:
    spec = plan_run()
    evaluation_for(BACKEND, DEPLOYMENT, spec, train_group(BACKEND, spec))


mlperf_grpo_run()
