"""What the Slurm backend keeps to itself, against the private Slurm: no variable of the
worker's (Airflow's secrets) reaches a job's environment or slurmctld's saved copy of it, on
the local and the REST transport; a job of rcpflow's name that another account submitted (or
that lacks rcpflow's comment) is never adopted, watched, cancelled or read, and the file it
names as its output never reaches the task log; one poll reads one job whatever the queue
holds; the CLI and REST hooks give the same outcome for every operation."""

from __future__ import annotations

import asyncio
import getpass
import io
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from env_helpers import set_env
from slurm_driver import context, drive
from slurm_jobs import foreign_jobs, other_user, submit_held  # noqa: F401 (fixtures)

from devtools.servers.slurm_cluster import SlurmCluster
from tasks.backend_api.job_operator import RunJobOperator
from tasks.backends.slurm import hooks
from tasks.backends.slurm.adapter import job_name
from tasks.backends.slurm.driver import SlurmDriver
from tasks.backends.slurm.hooks import (
    AnyHook,
    CommandResult,
    LocalRunner,
    NotOurJob,
    RestSlurmHook,
    SlurmHook,
    SubmittedJob,
    client_env,
)
from tasks.backends.slurm.script import BatchJob, job_comment
from tasks.backends.slurm.settings import SlurmJobShape, SlurmSettings

PY = sys.executable
DAG_ID = "mlperf_grpo_run"  # slurm_driver.context's
PRINT_ENV = "import json,os; print('ENV=' + json.dumps(dict(os.environ)))"


def settings(jobs: Path, **table: Any) -> SlurmSettings:
    role = SlurmJobShape(time_limit="10", signal_grace_s=30)
    return SlurmSettings(
        working_dir=str(jobs), log_dir=str(jobs / "logs"), python=PY, poll_interval_s=0.5,
        backoff_max_s=1.0, command_timeout_s=20, train=role, evaluate=role, **table,
    )  # fmt: skip


def batch(s: SlurmSettings, name: str, argv: Sequence[str], **env: str) -> BatchJob:
    return BatchJob(
        name=name, argv=tuple(argv), shape=s.train, working_dir=s.working_dir,
        log_dir=s.log_dir, env=env, export_env=s.export_env,
    )  # fmt: skip


def rest_hook(slurm: SlurmCluster, s: SlurmSettings) -> RestSlurmHook:
    from dataclasses import replace

    rest = replace(s, transport="rest", rest_url=slurm.rest_url, rest_conn_id="unused")
    return RestSlurmHook(rest, credentials=(getpass.getuser(), slurm.rest_token()))


def finished(hook: AnyHook, job: SubmittedJob, timeout_s: float = 60) -> hooks.JobInfo:
    deadline = time.monotonic() + timeout_s
    while not (info := hook.job(job.job_id, job)).finished:
        assert time.monotonic() < deadline, f"job {job.job_id} still {info.state}"
        time.sleep(0.3)
    return info


def saved_copies(slurm: SlurmCluster, job_id: str) -> str:
    """slurmctld's saved script and environment of the job (StateSaveLocation)."""
    folder = slurm.root / "state" / f"hash.{job_id[-1]}" / f"job.{job_id}"
    environment = (folder / "environment").read_bytes()
    assert environment, "slurmctld saved no environment: nothing was checked"
    return (environment + (folder / "script").read_bytes()).decode(errors="replace")


@pytest.mark.parametrize("transport", ["local", "rest"])
def test_no_variable_of_the_worker_reaches_a_job(
    slurm: SlurmCluster,
    jobs_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    transport: str,
) -> None:
    set_env(monkeypatch, slurm.env)
    jwt = f"jwt-{time.time_ns()}-secret"
    password = f"pw{time.time_ns()}secret"
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", jwt)
    monkeypatch.setenv("AIRFLOW_CONN_RCPFLOW_DB", f"postgresql://airflow:{password}@db/airflow")
    monkeypatch.setenv("WORKER_ONLY", "not for the job")
    monkeypatch.setenv("SITE_PROXY", "http://proxy:3128")  # named by the deployment: passed
    s = settings(jobs_dir, export_env=("SITE_PROXY",))
    hook: AnyHook = SlurmHook(s) if transport == "local" else rest_hook(slurm, s)
    (jobs_dir / "logs").mkdir(exist_ok=True)
    job = hook.submit(batch(s, f"env-{transport}", [PY, "-c", PRINT_ENV], JOB_OWN="mine"))
    info = finished(hook, job)
    text, _ = hook.read_output(info.stdout_path, 0)
    assert info.exit_code == 0, text
    env = json.loads(next(x for x in text.splitlines() if x.startswith("ENV="))[4:])
    assert (env.get("JOB_OWN"), env.get("SITE_PROXY")) == ("mine", "http://proxy:3128")
    assert [k for k in env if k.startswith("AIRFLOW") or k == "WORKER_ONLY"] == []
    for secret in (jwt, password, "not for the job"):
        assert secret not in json.dumps(env)
        assert secret not in saved_copies(slurm, job.job_id)


def test_the_local_transport_runs_slurm_with_a_minimal_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "fernet-secret")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    hook = SlurmHook(SlurmSettings(working_dir="/w", log_dir="/l", export_env=("SITE_PROXY",)))
    assert isinstance(hook.runner, LocalRunner) and hook.runner.env is not None
    assert "AIRFLOW__CORE__FERNET_KEY" not in hook.runner.env
    assert hook.runner.env["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    seen = hook.runner.run(["env"], timeout_s=10).stdout
    assert "fernet-secret" not in seen and "SLURM_CONF=/etc/slurm/slurm.conf" in seen
    assert client_env((), {"A": "1", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_a_job_of_our_name_that_is_not_ours_is_never_adopted(
    slurm_env: SlurmCluster,
    jobs_dir: Path,
    other_user: str,  # noqa: F811
    foreign_jobs: list[str],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = f"postgresql://airflow:{time.time_ns()}@db/airflow"
    secret_file = jobs_dir / "airflow.cfg"  # a file on the Airflow host the job names
    secret_file.write_text(f"sql_alchemy_conn = {secret}\nfernet_key = also-secret\n")
    secret_file.chmod(0o644)
    run_id = f"manual__{time.time_ns()}"
    name = job_name(DAG_ID, run_id, "train")
    theirs = submit_held(slurm_env, name=name, output=str(secret_file), user=other_user)
    unmarked = submit_held(slurm_env, name=name, output=str(secret_file))  # ours, no comment
    foreign_jobs += [theirs, unmarked]
    s = settings(jobs_dir)
    driver = SlurmDriver(s)
    task = RunJobOperator(
        task_id="run", driver=driver, role="train", label="train",
        argv=[PY, "-c", "print('mine')"],
    )  # fmt: skip
    driven = drive(task, context(run_id), timeout_s=60)
    logged = "".join(capsys.readouterr())
    assert driven.result["outcome"] == "succeeded"
    assert theirs not in driven.job_ids and unmarked not in driven.job_ids
    assert f"Slurm job {theirs} ({name}) belongs to '{other_user}'" in logged
    assert f"Slurm job {unmarked} ({name}) lacks rcpflow's comment" in logged
    assert secret not in logged and "also-secret" not in logged
    hook = SlurmHook(s)
    with pytest.raises(NotOurJob, match=rf"belongs to '{other_user}', not rcpflow's account"):
        hook.job(theirs, SubmittedJob(theirs, name, 0))
    assert hook.job(theirs).stdout_path == f"{s.log_dir}/{name}-{theirs}.out"  # not its -o
    # the driver neither cancels nor reads it, given its id with our name (a record, a watch)
    for job_id in (theirs, unmarked):
        ref = {"job_id": job_id, "name": name, "submit_time": 0}
        assert driver.cancel(ref) is False
        state = asyncio.run(SlurmDriver.from_args(driver.args()).read(ref, memo := {}, 0.0))
        assert (state.outcome, state.output, memo) == ("foreign", (), {}), state
        assert hook.job(job_id).state == "PENDING"
    # a step's cancel leaves another's job of the step's name alone
    step_name = job_name(DAG_ID, run_id, "eval-3")
    foreign_jobs.append(submit_held(slurm_env, name=step_name, output="/dev/null", user=other_user))
    assert driver.cancel_step(DAG_ID, run_id, str(jobs_dir / "run"), 3) is False
    assert hook.job(foreign_jobs[-1]).state == "PENDING"


@dataclass
class CountingRunner:
    """The local runner, the bytes of each answer counted (a hook point, not a clock)."""

    inner: LocalRunner = field(default_factory=lambda: LocalRunner(client_env()))
    sizes: list[int] = field(default_factory=list)

    def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float
    ) -> CommandResult:
        result = self.inner.run(argv, stdin=stdin, timeout_s=timeout_s)
        self.sizes.append(len(result.stdout))
        return result


def test_a_poll_reads_one_job_whatever_the_queue(
    slurm_env: SlurmCluster,
    jobs_dir: Path,
    other_user: str,  # noqa: F811
    foreign_jobs: list[str],  # noqa: F811
) -> None:
    runner = CountingRunner()
    hook = SlurmHook(settings(jobs_dir), runner=runner)
    name = f"rcpflow-train-poll{time.time_ns()}"
    mine = submit_held(slurm_env, name=name, output="/dev/null", comment=job_comment(name))
    foreign_jobs.append(mine)
    expected = SubmittedJob(mine, name, 0)

    def answered(call: Any) -> int:
        runner.sizes.clear()
        call()
        return sum(runner.sizes)

    def poll() -> tuple[int, int]:
        return answered(lambda: hook.job(mine, expected)), answered(lambda: hook.find_jobs(name))

    before = poll()
    whole_queue = len(slurm_env.client("squeue", "--json", "--jobs", mine))
    for i in range(40):
        foreign_jobs.append(
            submit_held(slurm_env, name=f"other-{i}", output="/dev/null", user=other_user)
        )
    after = poll()
    # the same one record (a few of its fields, e.g. LastSchedEval, change as it waits);
    # the whole queue's would be 40 records more
    assert [abs(a - b) <= 64 for a, b in zip(after, before, strict=True)] == [True, True], (
        before,
        after,
    )
    if "slurm 22." in slurm_env.client("sinfo", "--version"):
        # why the hook does not use it: 22.05's squeue --json answers the whole queue
        assert len(slurm_env.client("squeue", "--json", "--jobs", mine)) > whole_queue + 40 * 100


def test_an_answer_over_the_bound_is_an_error_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hooks, "MAX_ANSWER_BYTES", 1000)
    with pytest.raises(hooks.SlurmError, match="exceeded 1000 bytes"):
        LocalRunner({}).run(["/bin/sh", "-c", "yes | head -c 5000"], timeout_s=10)
    assert LocalRunner({}).run(["/bin/sh", "-c", "echo hi"], timeout_s=10).stdout == "hi\n"


def outcome(call: Any) -> str:
    try:
        value = call()
    except Exception as exc:
        return f"raised {type(exc).__name__}"
    return f"returned {value!r}"


def test_rest_and_cli_agree_on_every_operation(
    slurm: SlurmCluster,
    jobs_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    other_user: str,  # noqa: F811
    foreign_jobs: list[str],  # noqa: F811
) -> None:
    set_env(monkeypatch, slurm.env)
    s = settings(jobs_dir)
    (jobs_dir / "logs").mkdir()
    cli, rest = SlurmHook(s), rest_hook(slurm, s)
    name = f"rcpflow-train-agree{time.time_ns()}"
    done = {
        "cli": cli.submit(batch(s, name, [PY, "-c", "raise SystemExit(3)"])),
        "rest": rest.submit(batch(s, name, [PY, "-c", "raise SystemExit(3)"])),
    }
    for job in done.values():
        finished(cli, job)
    theirs = submit_held(slurm, name=name, output="/dev/null", user=other_user)
    pending = submit_held(slurm, name=name, output="/dev/null", comment=job_comment(name))
    foreign_jobs += [theirs, pending]

    def read(hook: AnyHook, job: SubmittedJob) -> tuple[Any, ...]:
        i = hook.job(job.job_id, job)
        return (i.state, i.exit_code, i.signal, i.user, i.comment, i.stdout_path, i.submit_time)

    table = {
        "read a finished job": lambda h: [read(h, j) for j in done.values()],
        "cancel a finished job": lambda h: [h.cancel(j.job_id) for j in done.values()],
        "signal a finished job": lambda h: h.cancel(done["cli"].job_id, signal="TERM"),
        "cancel an unknown id": lambda h: h.cancel("999999"),
        "read an unknown id": lambda h: h.job("999999"),
        "find the jobs of a name": lambda h: sorted(j.job_id for j in h.find_jobs(name)),
        "refuse another's job": lambda h: [h.refusal(j) for j in h.find_jobs(name)],
        "read another's job as ours": lambda h: h.job(theirs, SubmittedJob(theirs, name, 0)),
    }
    for what, call in table.items():
        got = {"cli": outcome(lambda c=call: c(cli)), "rest": outcome(lambda c=call: c(rest))}
        assert got["cli"] == got["rest"], (what, got)
    assert outcome(lambda: cli.job("999999")) == "raised JobForgotten"
    # the last: a pending job cancelled by each (the second meets a job that has ended)
    assert outcome(lambda: rest.cancel(pending)) == outcome(lambda: cli.cancel(pending))
    assert cli.job(pending).state == "CANCELLED"


@pytest.mark.parametrize("api", ["v0.0.38", "v0.0.42"])
def test_a_rest_cancel_of_a_job_ending_now_is_done(
    monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """slurmrestd's answer to a DELETE of a job in COMPLETING: scancel's words, not an error."""
    answer = {"errors": [{"error": "Job/step already completing or completed"}]}
    asked: list[str] = []

    def urlopen(request: Any, timeout: float) -> io.BytesIO:
        asked.append(f"{request.method} {request.full_url}")
        return io.BytesIO(json.dumps(answer).encode())

    monkeypatch.setattr(hooks.urllib.request, "urlopen", urlopen)
    s = SlurmSettings(
        working_dir="/w", log_dir="/l", transport="rest", rest_url="http://x", rest_conn_id="c"
    )
    RestSlurmHook(s, credentials=("u", "t"), api=api).cancel("7")
    assert asked == [f"DELETE http://x/slurm/{api}/job/7"]
