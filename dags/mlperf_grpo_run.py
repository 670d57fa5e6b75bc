"""mlperf_grpo_run: one seed of a qwen35_397b_grpo submission.

``plan`` (check the Params, record the evaluation schedule) -> ``train`` (the training job on
the deployment's backend, then its outputs checked) beside ``evaluation`` (one ``checkpoint``
group per planned step: ``wait``, ``evaluate``, ``stop_if_decided``; W checkpoints at a time,
lowest first, until one passes; the others skipped or stopped; ``finalize`` writes the eval
section and ``run_stop``; ``check`` runs the official compliance checker), then ``retention``
(the checkpoints the decided run no longer needs deleted, when the ``retention`` Param or the
deployment's ``[retention]`` says so; off by default). The Params
``eval_schedule`` and ``eval_window`` choose when: ``after_training`` (the default, the rules'
wording: once training halts) or ``during_training`` (not described by the rules: while
training runs, stopping it at the verdict). Triggered by ``mlperf_grpo_submission`` per seed,
or by hand. Per-step instances are labelled ``step N`` once they ran; the RCP tab of a DAG run
(``/rcp/dag-run/<dag_id>/<run_id>``) has every step.
"""

from airflow.sdk import dag

from tasks.backends.registry import form_defaults
from tasks.deployment import load_deployment
from tasks.names import RUN_DAG_ID
from tasks.run.evaluation_over_steps import evaluation_over_steps
from tasks.run.job_nodes import nodes_for
from tasks.run.retention import retention, retention_params
from tasks.run.spec import plan_run, run_params
from tasks.run.train_group import train_group

DEPLOYMENT = load_deployment()
NODES = nodes_for(DEPLOYMENT)


@dag(
    dag_id=RUN_DAG_ID,
    schedule=None,
    catchup=False,
    params={**run_params(form_defaults(DEPLOYMENT)), **retention_params(DEPLOYMENT)},
    tags=["mlperf", "qwen35_397b_grpo", NODES.driver.name],
    doc_md=__doc__,
)
def mlperf_grpo_run() -> None:
    spec = plan_run()
    evaluation_over_steps(NODES, DEPLOYMENT, spec, train_group(NODES, spec)) >> retention(spec)


mlperf_grpo_run()
