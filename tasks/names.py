"""Names other processes and files hold on to: the DAG ids and the checker tools whose
verdicts are persisted. Renaming one breaks DAG runs, triggers and verdict files already
stored, so each lives here once; the modules that define or read them import it."""

from __future__ import annotations

from typing import Literal

RUN_DAG_ID = "mlperf_grpo_run"
SUBMISSION_DAG_ID = "mlperf_grpo_submission"
DEFERRED_EVAL_DAG_ID = "mlperf_grpo_deferred_eval"
DAG_IDS = (RUN_DAG_ID, SUBMISSION_DAG_ID, DEFERRED_EVAL_DAG_ID)

# The official checkers a submission runs; each verdict is ``checks/<tool>.json``.
CheckTool = Literal["rcp_checker", "package_checker", "result_summarizer"]
CHECK_TOOLS: tuple[CheckTool, ...] = ("rcp_checker", "package_checker", "result_summarizer")
# The run's own checker; its verdict is the run's ``checks/compliance_checker.json``.
COMPLIANCE_TOOL = "compliance_checker"

# The run DAG's task and group ids that running triggers keep in their kwargs (and Airflow keeps
# in its task instances): the training task and the evaluation task of each checkpoint.
TRAIN_TASK_ID = "train"
# The run DAG's first task, whose output (the RunSpec) later tasks pull.
PLAN_TASK_ID = "plan"
EVALUATE_TASK_ID = "evaluate"
