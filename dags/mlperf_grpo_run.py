"""mlperf_grpo_run: one seed of a qwen35_397b_grpo submission.

``plan`` (check the Params) -> ``train`` (the training job on the deployment's backend, then its
outputs checked) -> ``evaluation`` (every saved checkpoint in step order until one passes,
later ones skipped; ``finalize`` writes the eval section and ``run_stop``; ``check`` runs the
official compliance checker). Triggered by ``mlperf_grpo_submission`` per seed, or by hand.
"""

from airflow.sdk import dag

from tasks.deployment import load_deployment
from tasks.eval_group import eval_group
from tasks.run_spec import plan_run, run_params
from tasks.train_group import train_group

DEPLOYMENT = load_deployment()


@dag(
    dag_id="mlperf_grpo_run",
    schedule=None,
    catchup=False,
    params=run_params(),
    tags=["mlperf", "qwen35_397b_grpo", DEPLOYMENT.backend],
    doc_md=__doc__,
)
def mlperf_grpo_run() -> None:
    spec = plan_run.override(task_id="plan")()
    train_group(DEPLOYMENT, spec) >> eval_group(DEPLOYMENT, spec["run_dir"])


mlperf_grpo_run()
