"""The Slurm hooks and batch scripts against the private Slurm: submit, read the state and
exit code (squeue --json, scontrol, sacct), cancel, the output; SIGTERM reaches the tasks;
every argv item stays one argument; a secret is read on the cluster, never written; two nodes
give each task its place; the SSH and REST transports; slurmctld restarted under a job."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from email.message import Message
from pathlib import Path

import pytest

from devtools.servers.slurm_cluster import SlurmCluster
from tasks.backends.slurm.hooks import (
    ClusterUnreachable,
    CommandResult,
    JobForgotten,
    JobIdReused,
    JobInfo,
    RestSlurmHook,
    SlurmError,
    SlurmHook,
    SshRunner,
    SubmittedJob,
    job_from_sacct,
)
from tasks.backends.slurm.rest_api import LEGACY, SPOKEN, cancel_query, submit_body
from tasks.backends.slurm.script import BatchJob, render_script
from tasks.backends.slurm.settings import SecretRef, SlurmJobShape, SlurmSettings

PY = sys.executable
# Every shell metacharacter, quotes, a newline, a glob, an expansion, a command substitution.
NASTY = "a b;c|d&e$(touch /tmp/rcpflow-pwned)`id`'\"\n*?[x]{1,2}~$HOME\\ -x --y=z #"


def settings(jobs: Path, **table: object) -> SlurmSettings:
    return SlurmSettings(working_dir=str(jobs), log_dir=str(jobs / "logs"), **table)  # type: ignore[arg-type]


def shape(**fields: object) -> SlurmJobShape:
    return SlurmJobShape(time_limit="10", signal_grace_s=30, **fields)  # type: ignore[arg-type]


def batch(jobs: Path, name: str, argv: Sequence[str], **fields: object) -> BatchJob:
    extra = {k: v for k, v in fields.items() if k in ("env", "secret_env")}
    shaped = {k: v for k, v in fields.items() if k not in extra}
    return BatchJob(
        name=name,
        argv=tuple(argv),
        shape=shape(**shaped),
        working_dir=str(jobs),
        log_dir=str(jobs / "logs"),
        **extra,  # type: ignore[arg-type]
    )


def wait_finished(
    hook: SlurmHook | RestSlurmHook, job: SubmittedJob, timeout_s: float = 60
) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while True:
        info = hook.job(job.job_id, job)
        if info.finished:
            return info
        assert time.monotonic() < deadline, f"job {job.job_id} still {info.state}"
        time.sleep(0.3)


def wait_state(
    hook: SlurmHook | RestSlurmHook, job: SubmittedJob, state: str, timeout_s: float = 30
) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while (info := hook.job(job.job_id, job)).state != state:
        assert time.monotonic() < deadline, f"job {job.job_id} {info.state}, not {state}"
        time.sleep(0.2)
    return info


def output(hook: SlurmHook | RestSlurmHook, info: JobInfo) -> str:
    text, _ = hook.read_output(info.stdout_path, 0)
    return text


def wait_output(
    hook: SlurmHook | RestSlurmHook, info: JobInfo, text: str, timeout_s: float = 30
) -> None:
    """Until the job's output holds `text`: its task (not only the batch shell) runs."""
    deadline = time.monotonic() + timeout_s
    while text not in output(hook, info):
        assert time.monotonic() < deadline, f"job {info.job_id}: no {text!r} in its output"
        time.sleep(0.2)


def test_success_failure_and_output(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    hook = SlurmHook(settings(jobs_dir))
    ok = hook.submit(batch(jobs_dir, "ok", [PY, "-c", "print('hello from the job')"]))
    failed = hook.submit(batch(jobs_dir, "seven", [PY, "-c", "raise SystemExit(7)"]))
    done = wait_finished(hook, ok)
    assert (done.state, done.exit_code, done.source) == ("COMPLETED", 0, "scontrol")
    assert "hello from the job" in output(hook, done)
    assert done.stdout_path == f"{jobs_dir}/logs/ok-{ok.job_id}.out"
    bad = wait_finished(hook, failed)
    assert (bad.state, bad.exit_code, bad.signal) == ("FAILED", 7, 0)
    assert "tasks ended with exit code 7" in output(hook, bad)
    # the same job read through squeue --json (v0.0.38 on 22.05, v0.0.42 on 24.11)
    # (24.11 lists a finished job only under --states=all; 22.05 ignores every filter)
    answer = json.loads(hook._run("squeue", "--json", "--states=all").stdout)
    from tasks.backends.slurm.hooks import job_from_json

    row = next(j for j in answer["jobs"] if str(j["job_id"]) == failed.job_id)
    text = job_from_json(row, "squeue")
    assert (text.state, text.exit_code, text.name, text.submit_time, text.user) == (
        "FAILED",
        7,
        "seven",
        bad.submit_time,
        bad.user,
    )
    # output read from an offset goes on where the last read stopped
    _, offset = hook.read_output(done.stdout_path, 0)
    assert hook.read_output(done.stdout_path, offset) == ("", offset)


def test_a_reused_id_and_a_forgotten_job_are_named(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    hook = SlurmHook(settings(jobs_dir))
    job = hook.submit(batch(jobs_dir, "mine", [PY, "-c", "pass"]))
    with pytest.raises(
        JobIdReused, match=rf"job {job.job_id} is now 'mine'.*not rcpflow's 'other'"
    ):
        hook.job(job.job_id, SubmittedJob(job.job_id, "other", job.submit_time))
    with pytest.raises(JobIdReused):
        hook.job(job.job_id, SubmittedJob(job.job_id, "mine", job.submit_time - 3600))
    with pytest.raises(JobForgotten, match="no accounting"):
        hook.job("999999")
    assert hook.accounting is False  # "accounting storage is disabled" was understood


class FakeRunner:
    """Answers as a cluster with accounting whose slurmctld forgot the job."""

    def run(
        self, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float
    ) -> CommandResult:
        if argv[0] == "scontrol":
            return CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified")
        assert argv[0] == "sacct"
        times = "2026-01-02T03:04:05|2026-01-02T03:04:06|2026-01-02T04:00:00"
        rows = f"42|train-x|CANCELLED by 0|0:15|{times}|01:00:00\n"
        return CommandResult(0, rows, "")


def test_a_forgotten_job_is_read_from_accounting(tmp_path: Path) -> None:
    hook = SlurmHook(settings(tmp_path), runner=FakeRunner())
    info = hook.job("42")
    assert (info.state, info.exit_code, info.signal, info.source) == ("CANCELLED", 0, 15, "sacct")
    assert info.time_limit_s == 3600 and info.finished
    assert hook.accounting is True
    row = job_from_sacct("7|n|TIMEOUT|0:0|Unknown|Unknown|Unknown|UNLIMITED")
    assert (row.state, row.start_time, row.time_limit_s) == ("TIMEOUT", None, None)


def test_every_argv_item_stays_one_argument(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    hook = SlurmHook(settings(jobs_dir))
    argv = [PY, "-c", "import json,sys; print('ARGV=' + json.dumps(sys.argv[1:]))", NASTY, "", "$1"]
    env = {"RCPFLOW_TEST_NASTY": NASTY}
    script = render_script(batch(jobs_dir, "nasty", argv, env=env))
    job = hook.submit(batch(jobs_dir, "nasty", argv, env=env))
    info = wait_finished(hook, job)
    assert info.exit_code == 0, output(hook, info)
    line = next(x for x in output(hook, info).splitlines() if x.startswith("ARGV="))
    assert json.loads(line[5:]) == [NASTY, "", "$1"]
    assert not Path("/tmp/rcpflow-pwned").exists()
    assert "$(touch" in script  # quoted, not run


def test_two_nodes_give_each_task_its_place(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    hook = SlurmHook(settings(jobs_dir))
    code = (
        "import json,os; print('TASK=' + json.dumps({k: os.environ.get(k) for k in "
        "('RCPFLOW_PROCESS_ID','RCPFLOW_NUM_PROCESSES','RCPFLOW_COORDINATOR_ADDRESS','SLURMD_NODENAME')}))"
    )
    job = hook.submit(batch(jobs_dir, "two-nodes", [PY, "-c", code], nodes=2))
    info = wait_finished(hook, job)
    assert info.exit_code == 0, output(hook, info)
    tasks = [json.loads(x[5:]) for x in output(hook, info).splitlines() if x.startswith("TASK=")]
    by_id = {t["RCPFLOW_PROCESS_ID"]: t for t in tasks}
    assert sorted(by_id) == ["0", "1"]
    assert {t["SLURMD_NODENAME"] for t in tasks} == {"n1", "n2"}
    assert by_id["0"]["SLURMD_NODENAME"] == "n1"
    assert {t["RCPFLOW_NUM_PROCESSES"] for t in tasks} == {"2"}
    port = 20000 + int(job.job_id) % 20000
    assert {t["RCPFLOW_COORDINATOR_ADDRESS"] for t in tasks} == {f"127.0.0.1:{port}"}


def test_a_secret_is_read_on_the_cluster_never_written(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    hook = SlurmHook(settings(jobs_dir))
    secret = "s3cr3t-value-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:12]
    secret_file = jobs_dir / "hf_token"
    secret_file.write_text(secret + "\n")
    code = (
        "import hashlib,os; "
        "print('SHA=' + hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest())"
    )
    refs = {"HF_TOKEN": SecretRef(file=str(secret_file))}
    job_spec = batch(jobs_dir, "secret", [PY, "-c", code], secret_env=refs)
    assert secret not in render_script(job_spec)
    job = hook.submit(job_spec)
    info = wait_finished(hook, job)
    text = output(hook, info)
    assert f"SHA={hashlib.sha256(secret.encode()).hexdigest()}" in text
    assert secret not in text
    # a missing reference stops the job with 5 (invalid input), naming the reference only
    missing = batch(
        jobs_dir,
        "nosecret",
        [PY, "-c", "pass"],
        secret_env={"HF_TOKEN": SecretRef(env="RCPFLOW_NO_SUCH_VAR")},
    )
    info = wait_finished(hook, hook.submit(missing))
    assert info.exit_code == 5
    assert "HF_TOKEN: the variable RCPFLOW_NO_SUCH_VAR is not set" in output(hook, info)


# A task that answers SIGTERM as the trainer does: it saves, then exits 143.
TERM_SAVES = (
    "import signal,sys,time\n"
    "def term(*_):\n print('TERM seen, saving', flush=True); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, term)\nprint('READY', flush=True)\ntime.sleep(120)\n"
)


def test_sigterm_reaches_the_tasks_and_their_code_is_the_jobs(
    slurm_env: SlurmCluster, jobs_dir: Path
) -> None:
    hook = SlurmHook(settings(jobs_dir))
    job = hook.submit(batch(jobs_dir, "term", [PY, "-c", TERM_SAVES]))
    wait_output(hook, wait_state(hook, job, "RUNNING"), "READY")
    hook.cancel(job.job_id, signal="TERM")  # what --signal=B:TERM@grace sends the batch shell
    done = wait_finished(hook, job)
    assert (done.state, done.exit_code) == ("FAILED", 143), output(hook, done)
    assert "TERM seen, saving" in output(hook, done)


def test_cancel(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    hook = SlurmHook(settings(jobs_dir))
    job = hook.submit(batch(jobs_dir, "sleeper", [PY, "-c", "import time; time.sleep(300)"]))
    wait_state(hook, job, "RUNNING")
    hook.cancel(job.job_id)
    assert wait_finished(hook, job).state == "CANCELLED"
    hook.cancel(job.job_id)  # again: fine


def test_slurmctld_restarted_under_a_running_job(slurm_env: SlurmCluster, jobs_dir: Path) -> None:
    hook = SlurmHook(settings(jobs_dir, command_timeout_s=10))
    go = jobs_dir / "go"
    # The task itself must run before slurmctld stops: the batch shell's srun needs slurmctld to
    # start the step (RUNNING is the batch shell). It then ends only once the controller was down.
    code = (
        "import pathlib,time\nprint('READY', flush=True)\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.1)\nprint('done')\n"
    )
    job = hook.submit(batch(jobs_dir, "survivor", [PY, "-c", code]))
    wait_output(hook, wait_state(hook, job, "RUNNING"), "READY")
    slurm_env.stop_controller()
    try:
        with pytest.raises(ClusterUnreachable):
            hook.job(job.job_id, job)
        go.touch()
        time.sleep(1)  # the task ends while slurmctld is down: slurmd holds its exit for it
    finally:
        slurm_env.start_controller()
    info = wait_finished(hook, job, timeout_s=90)
    assert (info.state, info.exit_code) == ("COMPLETED", 0), output(hook, info)
    assert "done" in output(hook, info)


def test_the_ssh_transport(slurm: SlurmCluster, ssh_conn: str, jobs_dir: Path) -> None:
    hook = SlurmHook(settings(jobs_dir, transport="ssh", ssh_conn_id=ssh_conn))
    assert isinstance(hook.runner, SshRunner)
    hook.ping()
    job = hook.submit(
        batch(jobs_dir, "over-ssh", [PY, "-c", "import sys; print('ARGS', sys.argv[1:])", NASTY])
    )
    info = wait_finished(hook, job)
    assert (info.state, info.exit_code) == ("COMPLETED", 0)
    assert repr([NASTY]) in output(hook, info)
    down = SlurmHook(settings(jobs_dir, transport="ssh", ssh_conn_id=ssh_conn, command_timeout_s=5))
    down.runner = SshRunner("rcpflow_no_such_connection")
    with pytest.raises(ClusterUnreachable):
        down.job(job.job_id)


def test_the_rest_transport(slurm: SlurmCluster, jobs_dir: Path) -> None:
    import getpass

    url = slurm.rest_url
    rest = settings(jobs_dir, transport="rest", rest_url=url, rest_conn_id="unused")
    credentials = (getpass.getuser(), slurm.rest_token())
    hook = RestSlurmHook(rest, credentials=credentials)
    hook.ping()
    # the newest version the hook speaks of those the server lists (v0.0.38 on 22.05,
    # v0.0.42 on 24.11)
    served = [v for v in SPOKEN if v in slurm.rest_api_versions()]
    assert hook.api() == served[0], (slurm.rest_api_versions(), SPOKEN)
    (jobs_dir / "logs").mkdir()
    job = hook.submit(
        batch(
            jobs_dir,
            "over-rest",
            [PY, "-c", "import sys; print('ARGS', sys.argv[1:]); sys.exit(3)", NASTY],
            exclusive=True,
            mem="100M",
        )
    )
    # every other version the hook speaks and the server serves, pinned: submit and read
    others = {v: RestSlurmHook(rest, credentials=credentials, api=v) for v in served[1:]}
    by_version = {
        v: (
            h,
            h.submit(
                batch(
                    jobs_dir,
                    f"rest-{v}",
                    [PY, "-c", "raise SystemExit(4)"],
                    exclusive=True,
                    mem="100M",
                )
            ),
        )
        for v, h in others.items()
    }
    for submitted in [job, *(j for _, j in by_version.values())]:
        # the job's properties as slurmctld took them (slurmrestd reads no #SBATCH line)
        shown = slurm.client("scontrol", "show", "job", "-o", submitted.job_id)
        for field in (
            "MinMemoryNode=100M",
            "TimeLimit=00:10:00",
            f"Comment=rcpflow:{submitted.name}",
        ):
            assert f" {field} " in f" {shown} ", (field, shown)
    info = wait_finished(hook, job)
    assert (info.state, info.exit_code, info.source) == ("FAILED", 3, "rest")
    assert repr([NASTY]) in output(hook, info)
    for version, (other, submitted) in by_version.items():
        read = wait_finished(other, submitted)
        assert (read.state, read.exit_code, read.comment) == (
            "FAILED",
            4,
            f"rcpflow:rest-{version}",
        ), version
    sleeper = hook.submit(
        batch(jobs_dir, "rest-sleeper", [PY, "-c", "import time; time.sleep(300)"])
    )
    hook.cancel(sleeper.job_id)
    assert wait_finished(hook, sleeper).state == "CANCELLED"
    # a signal reaches the batch shell; v0.0.40+ sends it there only (scancel --batch), so the
    # tasks get it from the shell and save; v0.0.38 has no such flag: it signals srun too,
    # which kills the step (docs/slurm-versions.md; rcpflow itself never sends one)
    term = hook.submit(batch(jobs_dir, "rest-term", [PY, "-c", TERM_SAVES]))
    wait_output(hook, wait_state(hook, term, "RUNNING"), "READY")
    hook.cancel(term.job_id, signal="TERM")
    done = wait_finished(hook, term)
    assert "rcpflow: SIGTERM, passed on to the tasks" in output(hook, done)
    if hook.api() != LEGACY:
        assert (done.state, done.exit_code) == ("FAILED", 143), output(hook, done)
        assert "TERM seen, saving" in output(hook, done)
    bad = RestSlurmHook(rest, credentials=(getpass.getuser(), "not-a-token"))
    with pytest.raises(SlurmError) as caught:
        bad.ping()
    print(caught.value)
    # a job read with a refused token is an error, never a job Slurm forgot (22.05 says
    # "Unable to find JobId" then)
    pinned = RestSlurmHook(rest, credentials=(getpass.getuser(), "not-a-token"), api=hook.api())
    with pytest.raises(SlurmError) as caught:
        pinned.job(job.job_id)
    assert not isinstance(caught.value, JobForgotten), caught.value


class FakeRestd:
    """A slurmrestd serving `versions` (a ping answers UP; any other path 404, as slurmrestd's
    own text), the calls it got counted: `urlopen` stands in for urllib's."""

    def __init__(self, versions: Sequence[str]) -> None:
        self.versions = versions
        self.asked: list[str] = []

    def urlopen(self, request: urllib.request.Request, timeout: float) -> io.BytesIO:
        path = urllib.parse.urlsplit(request.full_url).path
        self.asked.append(path)
        version = path.split("/")[2]
        if version not in self.versions:
            text = io.BytesIO(
                b"Unable find requested URL. Please view /openapi/v3 for API reference."
            )
            raise urllib.error.HTTPError(request.full_url, 404, "Not Found", Message(), text)
        return io.BytesIO(json.dumps({"pings": [{"pinged": "UP"}], "errors": []}).encode())


def rest_settings() -> SlurmSettings:
    return SlurmSettings(
        working_dir="/w", log_dir="/l", transport="rest", rest_url="http://x", rest_conn_id="c"
    )


@pytest.mark.parametrize(
    ("served", "picked"),
    [
        (["v0.0.38"], "v0.0.38"),  # 22.05
        (["v0.0.39", "v0.0.40"], "v0.0.40"),  # 23.11
        (["v0.0.40", "v0.0.41", "v0.0.42"], "v0.0.42"),  # 24.11
        (["v0.0.41", "v0.0.42", "v0.0.43"], "v0.0.42"),  # 25.05
    ],
)
def test_the_rest_hook_speaks_the_newest_version_the_server_serves(
    monkeypatch: pytest.MonkeyPatch, served: list[str], picked: str
) -> None:
    server = FakeRestd(served)
    monkeypatch.setattr(urllib.request, "urlopen", server.urlopen)
    hook = RestSlurmHook(rest_settings(), credentials=("u", "t"))
    hook.ping()
    hook.ping()
    assert hook.api() == picked
    # asked once per hook: a ping per version, newest first, until one answers; then its own
    tried = [f"/slurm/{v}/ping" for v in SPOKEN[: SPOKEN.index(picked) + 1]]
    assert server.asked == [*tried, f"/slurm/{picked}/ping", f"/slurm/{picked}/ping"]


def test_a_slurmrestd_of_no_version_the_hook_speaks_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(urllib.request, "urlopen", FakeRestd(["v0.0.37", "v0.0.39"]).urlopen)
    with pytest.raises(SlurmError) as caught:
        RestSlurmHook(rest_settings(), credentials=("u", "t")).ping()
    assert str(caught.value) == (
        "slurmrestd at http://x serves none of the API versions rcpflow speaks "
        "(v0.0.42, v0.0.41, v0.0.40, v0.0.38)"
    )


def test_each_version_gets_the_job_as_sbatch_would(tmp_path: Path) -> None:
    """The submit body per version: what `sbatch_options` gives sbatch, in each one's names."""
    job = batch(
        tmp_path, "shaped", ["true"], nodes=2, ntasks_per_node=2, gres="gpu:a100:2",
        mem="2G", exclusive=True, partition="p", constraint="x&y",
    )  # fmt: skip
    exported = {"SITE_PROXY": "http://proxy:3128"}
    legacy = submit_body(job, "v0.0.38", exported)
    assert legacy["script"] == render_script(job)
    assert legacy["job"]["environment"]["SITE_PROXY"] == "http://proxy:3128"
    assert (legacy["job"]["nodes"], legacy["job"]["constraints"]) == ([2, 2], "x&y")
    for version in ("v0.0.40", "v0.0.41", "v0.0.42"):
        body = submit_body(job, version, exported)
        assert list(body) == ["job"], version  # the script inside the job
        props = body["job"]
        assert props["script"] == render_script(job)
        assert "SITE_PROXY=http://proxy:3128" in props["environment"]
        assert [e for e in props["environment"] if not e.startswith(("PATH=", "SITE_"))] == []
        assert props["comment"] == "rcpflow:shaped"
        assert props["standard_output"] == f"{tmp_path}/logs/shaped-%j.out"
        assert (props["minimum_nodes"], props["maximum_nodes"], props["tasks"]) == (2, 2, 4)
        assert props["time_limit"] == {"set": True, "infinite": False, "number": 10}
        assert props["memory_per_node"]["number"] == 2048
        assert props["tres_per_node"] == "gres/gpu:a100:2"
        assert (props["shared"], props["partition"], props["constraints"]) == (["none"], "p", "x&y")
        assert (props["kill_warning_signal"], props["kill_warning_flags"]) == (
            "TERM",
            ["BATCH_JOB"],
        )
        assert props["kill_warning_delay"]["number"] == 30
    assert cancel_query("v0.0.42", "TERM") == "?signal=TERM&flags=BATCH_JOB"  # scancel --batch
    assert (cancel_query("v0.0.38", "TERM"), cancel_query("v0.0.42", None)) == ("?signal=TERM", "")
    with pytest.raises(SlurmError, match="extra_sbatch_args cannot be sent through slurmrestd"):
        submit_body(batch(tmp_path, "x", ["true"], extra_sbatch_args=("--x=1",)), "v0.0.42", {})


def test_the_tail_of_a_long_output_is_its_end(tmp_path: Path) -> None:
    """What a failed job's task error quotes (`SlurmDriver.output_tail`): the file's last
    bytes, however long the output (no cluster: the CLI hook's shell, the REST hook's file)."""
    path = tmp_path / "job.out"
    path.write_text("".join(f"line {i}\n" for i in range(300_000)))  # ~3.4 MB
    rest = SlurmSettings(
        working_dir="/w", log_dir="/l", transport="rest", rest_url="http://x", rest_conn_id="c"
    )
    hooks = [
        SlurmHook(SlurmSettings(working_dir="/w", log_dir="/l")),
        RestSlurmHook(rest, credentials=("u", "t")),
    ]
    for hook in hooks:
        tail = hook.read_tail(str(path), 20)
        assert tail == " 299998\nline 299999\n", hook
        assert hook.read_tail(str(path), 10 << 20).endswith("line 299999\n")
        assert len(hook.read_tail(str(path), 10 << 20)) == 1 << 20  # bounded
        assert hook.read_tail(str(tmp_path / "none.out"), 20) == "", hook
