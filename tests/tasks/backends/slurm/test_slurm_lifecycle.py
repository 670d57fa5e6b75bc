"""The one job lifecycle's suite (tests/tasks/backend_api/lifecycle_suite.py) on the Slurm
driver against the private Slurm of each version (conftest.py): a job that fails is Slurm's
exit-code contract's, not the suite's (an exit code 1 is a counted restart: with
``max_restarts = 0`` the task fails at once, naming the contract), and the foreign job of our
name is a held job that lacks rcpflow's comment."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from lifecycle_suite import Case, LifecycleSuite, context_of, run_to_end  # tests/tasks/backend_api
from slurm_jobs import foreign_jobs, submit_held  # noqa: F401 (fixtures)

from devtools.servers.slurm_cluster import SlurmCluster
from tasks.backend_api.protocol import JobRequest
from tasks.backends.slurm.adapter import job_name
from tasks.backends.slurm.driver import SlurmDriver
from tasks.backends.slurm.hooks import SlurmHook
from tasks.backends.slurm.settings import SlurmJobShape, SlurmSettings

PY = sys.executable
ARGV = {
    "ok": (PY, "-c", "print('ok')"),
    "fail": (PY, "-c", "import sys; print('failing'); sys.exit(1)"),
    "long": (PY, "-c", "import time; time.sleep(300)"),
}


class TestSlurmLifecycle(LifecycleSuite):
    @pytest.fixture
    def case(
        self,
        slurm_env: SlurmCluster,
        jobs_dir: Path,
        foreign_jobs: list[str],  # noqa: F811
    ) -> Case:
        shape = SlurmJobShape(time_limit="10", signal_grace_s=30, max_restarts=0)
        settings = SlurmSettings(
            working_dir=str(jobs_dir), log_dir=str(jobs_dir / "logs"), python=PY,
            poll_interval_s=0.5, backoff_max_s=1.0, command_timeout_s=20, train=shape,
            evaluate=shape,
        )  # fmt: skip
        hook = SlurmHook(settings)

        def alive(ref: Mapping[str, Any]) -> bool:
            return not hook.job(str(ref["job_id"])).finished

        def foreign(request: JobRequest) -> Mapping[str, Any]:
            name = job_name(request.dag_id, request.run_id, request.label)
            job_id = submit_held(slurm_env, name=name, output="/dev/null")  # no comment
            foreign_jobs.append(job_id)
            return {"job_id": job_id, "name": name, "submit_time": 0}

        return Case(
            driver=SlurmDriver(settings),
            argv=ARGV.__getitem__,
            alive=alive,
            foreign=foreign,
            run_dir=str(jobs_dir / "run"),
            run_id=f"run-{uuid.uuid4().hex[:12]}",
        )

    def test_a_job_that_fails_fails_its_task_naming_it_and_quoting_its_output(
        self, case: Case
    ) -> None:
        """Slurm's contract: exit code 1 is a counted restart; none is left (max_restarts 0),
        so the task fails without retries, naming the job and quoting its output."""
        op, ti, event = run_to_end(case, "fail")
        assert event["state"]["outcome"] == "restart"
        with pytest.raises(AirflowFailException, match=r"no restart left") as failed:
            op.execute_complete(context_of(case, ti), event)
        message = str(failed.value)
        assert message.startswith(case.driver.describe(event["ref"]))
        assert "last output lines" in message and "failing" in message
