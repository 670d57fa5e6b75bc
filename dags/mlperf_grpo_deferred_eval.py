"""mlperf_grpo_deferred_eval: evaluate an existing run again, without training (backfill).

The same ``evaluation`` group as ``mlperf_grpo_run``: checkpoints in step order until one passes,
reusing every valid summary already on storage (a run whose summaries already decide it
launches no evaluation job), then ``finalize`` and the compliance ``check``. With the optional
``eval_tree`` Param, ``import_eval_tree`` first imports another evaluator's results (a Tunix-style
tree), so only the steps they leave undecided are evaluated.
"""

from airflow.sdk import Param, dag

from tasks.deployment import load_deployment
from tasks.names import DEFERRED_EVAL_DAG_ID
from tasks.run.evaluation_group import evaluation_group
from tasks.run.job_nodes import nodes_for
from tasks.run.results_tree_import import import_eval_tree, tree_params
from tasks.run.spec import existing_run

NODES = nodes_for(load_deployment())


@dag(
    dag_id=DEFERRED_EVAL_DAG_ID,
    schedule=None,
    catchup=False,
    params={
        "run_dir": Param(
            type="string",
            minLength=1,
            title="Run folder",
            description="An existing run: absolute local path or gs://bucket/prefix.",
        ),
        **tree_params(),
    },
    tags=["mlperf", "qwen35_397b_grpo", NODES.driver.name],
    doc_md=__doc__,
)
def mlperf_grpo_deferred_eval() -> None:
    run_dir = existing_run()
    import_eval_tree(run_dir) >> evaluation_group(NODES, run_dir)


mlperf_grpo_deferred_eval()
