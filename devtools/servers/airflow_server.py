"""A private Airflow on 127.0.0.1 for the demo, `make ui` and the end-to-end tests: start,
drive, stop.

Its components (api-server, scheduler, dag-processor, triggerer, and one log server) are
separate processes, each the leader of its own group, stopped by the PIDs we hold
(`tasks.jobs.processes`; why SIGINT: docs/airflow.md). Every port is chosen free and bound to
127.0.0.1, so two of them on one machine never meet: Airflow 3.3's own log servers (started by
the scheduler and the triggerer) bind every interface at a fixed port with no host setting, so
those are skipped (``--skip-serve-logs``) and the same log-server app runs once under uvicorn on
loopback; the worker and trigger log ports both name it, and the hostname the task instances
record is 127.0.0.1, where it listens. Metadata DB: SQLite in AIRFLOW_HOME unless `env` sets
``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``; LocalExecutor; REST over the API's v2 routes (urllib).

    python -m devtools.servers.airflow_server --home DIR [--port N]   # up until Ctrl-C
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcpflow.files.captured import run_captured
from tasks.jobs.processes import Server, free_port, stop_processes

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer", "log-server")
USER = "admin"
HOST = "127.0.0.1"
# Airflow's own log servers bind 0.0.0.0 at a fixed port: ours replaces them (module doc).
_SKIP_SERVE_LOGS = ("scheduler", "triggerer")
LOG_SERVER_APP = "airflow.utils.serve_logs.log_server:get_app"
# The task states `failure_report` reports.
_NOT_WELL = frozenset({"failed", "upstream_failed", "up_for_retry"})
# The checkout this module runs from: devtools is no installed package (the images leave it
# out), so the components find `loopback_hostname` through their PYTHONPATH.
CHECKOUT = Path(__file__).resolve().parents[2]


# Airflow's own `[dag_processor] min_file_process_interval`.
AIRFLOW_REPARSE_S = 30
# How long one REST call may wait for its answer, and how often a read is asked (`_request`).
_REQUEST_TIMEOUT_S = 30.0
_READ_TRIES = 4


def _is_stall(exc: BaseException) -> bool:
    """A call the server did not answer in time, or a connection it dropped while busy: not an
    HTTP error (an answer), nor a refused connection (nothing listens: not up, or gone)."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return False
    return isinstance(reason, (TimeoutError, ConnectionError))


def _machine_load() -> str:
    """The load average and the memory available, as one line (what a stall report says)."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    available = next(
        (
            int(line.split()[1]) // 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemAvailable:")
        ),
        0,
    )
    return f"load {load}, {available} MiB available"


def loopback_hostname() -> str:
    """The ``[core] hostname_callable`` of a local Airflow: where its log server listens."""
    return HOST


class AirflowServerError(RuntimeError):
    """The local Airflow did not come up or answered an error; the message says which."""


@dataclass(frozen=True)
class ServerConfig:
    home: Path
    dags_folder: Path
    plugins_folder: Path
    port: int  # the API server's
    log_port: int = field(default_factory=free_port)  # the log server's
    parallelism: int = 4
    # How often the dag-processor parses each DAG file again, in seconds. Airflow's default (30)
    # is for editing DAGs while it runs; the demo, tests and benches never do, and the re-parses
    # were most of an idle Airflow's CPU (docs/airflow.md). `make ui` keeps the default.
    reparse_s: int = 600
    # Extra environment for every component (and so for the tasks and jobs they run).
    env: Mapping[str, str] = field(default_factory=dict)


def repo_config(home: Path, *, parallelism: int = 4, env: Mapping[str, str] = {}) -> ServerConfig:
    """An Airflow in `home` over this repository's dags/ and plugins/, at a free port, its
    tasks' JAX on the CPU; `env` adds to (or replaces) that environment."""
    from tasks.deployment import REPO_ROOT

    return ServerConfig(
        home=home,
        dags_folder=REPO_ROOT / "dags",
        plugins_folder=REPO_ROOT / "plugins",
        port=free_port(),
        parallelism=parallelism,
        env={"JAX_PLATFORMS": "cpu", **env},
    )


@dataclass(frozen=True)
class TimedRun:
    """One DAG run triggered and watched to its end: what a benchmark measures from."""

    run_id: str
    state: str
    trigger_ms: int  # wall clock, when it was triggered
    end_ms: int  # wall clock, when it was seen finished


class LocalAirflow(Server):
    """``with LocalAirflow(config) as af: af.trigger(...)``; stops on exit."""

    components: tuple[str, ...] = COMPONENTS

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.password = secrets.token_urlsafe(12)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._token: str | None = None
        self._airflow = str(Path(sys.executable).with_name("airflow"))

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.config.port}"

    def environment(self) -> dict[str, str]:
        c = self.config
        passwords = c.home / "passwords.json"
        return {
            **os.environ,
            # the components start `airflow ...` children by name
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(
                filter(None, (str(CHECKOUT), os.environ.get("PYTHONPATH")))
            ),
            "AIRFLOW_HOME": str(c.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(c.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(c.plugins_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(c.parallelism),
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(c.reparse_s),
            # The task supervisor reaps a finished task process only at its next select
            # timeout, this interval, when the process's sockets closed before it could be
            # reaped: 5 s (the default) of every second workload, 1 s now (docs/airflow.md).
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            # A task's calls to the execution API wait 30 s for their answer, not 5: at a load of
            # 20 (the suite's first minutes on 2 cores) one request on the API server's event
            # loop can hold every other for tens of seconds (docs/airflow.md), five tries of 5 s
            # fit inside that, and each call given up stays queued there (Airflow's advice for
            # high load).
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(c.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt"),
            "AIRFLOW__API__SECRET_KEY": self._secret("session"),
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.loopback_hostname",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(c.log_port),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(c.log_port),
            # off by default; should someone turn it on, not on every interface at 8974
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": HOST,
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(free_port()),
            **c.env,
        }

    def _secret(self, name: str) -> str:
        # One secret per home, shared by all components (they must agree on task tokens).
        path = self.config.home / f".{name}_secret"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(32))
        return path.read_text()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self, timeout_s: float = 180.0) -> None:
        c = self.config
        c.home.mkdir(parents=True, exist_ok=True)
        (c.home / "passwords.json").write_text(json.dumps({USER: self.password}))
        env = self.environment()
        logs = c.home / "component-logs"
        logs.mkdir(exist_ok=True)
        migrate = run_captured([self._airflow, "db", "migrate"], env=env, timeout_s=timeout_s)
        if migrate.returncode != 0:
            tail = migrate.stdout.decode(errors="replace")[-3000:]
            raise AirflowServerError(f"airflow db migrate failed:\n{tail}")
        for name in self.components:
            self.launch(name, env)
        self.wait_healthy(timeout_s)
        self.warm_execution_api()

    def warm_execution_api(self) -> None:
        """Ask the execution API once, before any task does. Airflow 3.3's execution API (a
        Cadwyn app) builds its versioned routers on its first request, on the API server's
        event loop: every request waits for it, 3.5 s on a quiet core and up to 45 s at a load
        of 20 (the first task's start, measured: docs/airflow.md). Here nothing waits on it."""
        self._request("GET", "/execution/health", auth=False)

    def launch(self, name: str, env: Mapping[str, str]) -> None:
        """Start component `name` (again), its output appended to its log file."""
        with open(self.log_file(name), "ab") as out:
            self.processes[name] = subprocess.Popen(
                self._command(name),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stoppable with all its children
            )

    def _command(self, component: str) -> list[str]:
        if component == "log-server":
            return [
                sys.executable, "-m", "uvicorn", LOG_SERVER_APP, "--factory",
                "--host", HOST, "--port", str(self.config.log_port), "--no-access-log",
            ]  # fmt: skip
        skip = ["--skip-serve-logs"] if component in _SKIP_SERVE_LOGS else []
        return [self._airflow, component, *skip]

    def log_file(self, component: str) -> Path:
        return self.config.home / "component-logs" / f"{component}.log"

    def check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = self.log_file(name).read_text(errors="replace")[-3000:]
                raise AirflowServerError(
                    f"airflow {name} exited with status {proc.returncode}:\n{tail}"
                )

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                health = self._request("GET", "/api/v2/monitor/health", auth=False)
                states = {k: v.get("status") for k, v in health.items() if isinstance(v, dict)}
                if states.get("metadatabase") == "healthy" and states.get("scheduler") == "healthy":
                    return
                last = str(states)
            except (OSError, AirflowServerError) as exc:
                last = str(exc)
            time.sleep(1.0)
        raise AirflowServerError(f"Airflow at {self.url} not healthy after {timeout_s}s: {last}")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGINT every component, then SIGKILL its group and every descendant after the grace
        period (task supervisors start their own sessions, outside the component's group)."""
        stop_processes(
            list(self.processes.values()),
            first=signal.SIGINT,
            grace_s=grace_s,
            group=True,
            with_descendants=True,
        )

    # ---- REST ----------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        """One REST call. A read (GET) the API server does not answer in time is asked again,
        up to `_READ_TRIES` times, as Airflow's own clients do (the task SDK's retries its
        execution-API calls): on an oversubscribed machine its one worker can fall behind for
        tens of seconds, which is not what a test that polls a run's state is about. Each stall
        is reported with the machine's load and free memory (`_report_stall`); a write is never
        repeated."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        tries = _READ_TRIES if method == "GET" else 1
        for attempt in range(1, tries + 1):
            try:
                with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT_S) as response:
                    text = response.read().decode()
                break
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:2000]
                raise AirflowServerError(f"{method} {path}: HTTP {exc.code}: {detail}") from exc
            except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
                if attempt == tries or not _is_stall(exc):
                    raise
                self._report_stall(
                    f"{time.strftime('%H:%M:%S')} Airflow API {self.url}: {method} {path} "
                    f"unanswered ({exc}), try {attempt} of {tries}; {_machine_load()}"
                )
        return json.loads(text) if text else None

    def _report_stall(self, line: str) -> None:
        """To stderr, and to ``component-logs/api-stalls.log`` beside the components' logs."""
        print(line, file=sys.stderr, flush=True)
        logs = self.config.home / "component-logs"
        if logs.is_dir():
            with open(logs / "api-stalls.log", "a") as out:
                out.write(line + "\n")

    def token(self) -> str:
        if self._token is None:
            answer = self._request(
                "POST", "/auth/token", {"username": USER, "password": self.password}, auth=False
            )
            self._token = answer["access_token"]
        return self._token

    def wait_for_dag(self, dag_id: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                self._request("GET", f"/api/v2/dags/{dag_id}")
                return
            except AirflowServerError as exc:
                if "HTTP 404" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def unpause(self, dag_id: str) -> None:
        self._request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: Mapping[str, Any], run_id: str | None = None) -> str:
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf)}
        if run_id is not None:
            body["dag_run_id"] = run_id
        answer = self._request("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)
        return str(answer["dag_run_id"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        quoted = urllib.parse.quote(run_id, safe="")
        return self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of the run, one per (task, map index).

        The API caps a page at 100 and orders by a key that moves: a retry gets a new id
        (uuid7) and the instance jumps to the end between two pages, read twice while another
        is missed. So the listing is read again until it holds each instance exactly once."""
        quoted = urllib.parse.quote(run_id, safe="")
        for _ in range(10):
            found: dict[tuple[str, int], dict[str, Any]] = {}
            read = 0
            while True:
                answer = self._request(
                    "GET",
                    f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances"
                    f"?limit=100&offset={read}&order_by=id",
                )
                page = list(answer["task_instances"])
                read += len(page)
                for ti in page:
                    found[(ti["task_id"], ti["map_index"])] = ti
                if not page or read >= answer["total_entries"]:
                    break
            if len(found) == answer["total_entries"]:
                return list(found.values())
        raise AirflowServerError(f"{dag_id} {run_id}: task instances kept moving while listed")

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, map_index: int = -1, try_number: int = 1
    ) -> str:
        """The task instance's log, one line per event (its ``event`` text and fields)."""
        quoted = urllib.parse.quote(run_id, safe="")
        answer = self._request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}/logs/{try_number}"
            f"?map_index={map_index}&full_content=true",
        )
        return "\n".join(json.dumps(line, sort_keys=True) for line in answer["content"])

    def failure_report(self, dag_id: str, run_id: str, tail: int = 25) -> str:
        """What a test prints when a run did not succeed: each task instance that failed, was
        cut off by one or waits to retry, the last `tail` lines of each of its tries' logs, and
        the scheduler's and triggerer's lines that name it (a state mismatch or a trigger's
        error is said there, not in the task's log)."""
        try:
            tis = self.task_instances(dag_id, run_id)
        except (AirflowServerError, OSError) as exc:
            return f"{dag_id} {run_id}: task instances unreadable: {exc}"
        bad = [t for t in tis if t["state"] in _NOT_WELL]
        lines = [f"{dag_id} {run_id}: {len(bad)} of {len(tis)} task instances did not succeed"]
        for ti in sorted(bad, key=lambda t: (t["task_id"], t["map_index"])):
            task, index, tries = ti["task_id"], ti["map_index"], max(1, ti["try_number"] or 1)
            lines.append(f"--- {task} [{index}]: {ti['state']} after try {tries}")
            if ti["state"] == "upstream_failed":
                continue
            for number in range(1, tries + 1):
                try:
                    log = self.task_log(dag_id, run_id, task, index, number).splitlines()
                except Exception as exc:  # the report must come out whatever the log's fate
                    log = [f"(log not read: {type(exc).__name__}: {exc})"]
                lines += [f"  try {number}: {line[:500]}" for line in log[-tail:]]
            for component in ("scheduler", "triggerer"):
                path = self.log_file(component)
                text = path.read_text(errors="replace") if path.exists() else ""
                named = [x for x in text.splitlines() if task in x and run_id in x]
                lines += [f"  {component}: {line[:500]}" for line in named[-tail:]]
        return "\n".join(lines)

    def ready(self, *dag_ids: str) -> None:
        """Wait until each DAG is parsed, and unpause it."""
        for dag_id in dag_ids:
            self.wait_for_dag(dag_id)
            self.unpause(dag_id)

    def timed_run(self, dag_id: str, conf: Mapping[str, Any], timeout_s: float) -> TimedRun:
        """Trigger `dag_id` once with `conf` (parsed and unpaused first) and wait for its end."""
        self.ready(dag_id)
        trigger_ms = time.time_ns() // 1_000_000
        run_id = self.trigger(dag_id, conf)
        state = self.wait_for_run(dag_id, run_id, timeout_s)
        return TimedRun(run_id, state, trigger_ms, time.time_ns() // 1_000_000)

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float, on_poll: Any = None) -> str:
        """Poll until the run finishes; returns its state. `on_poll()` is called each second."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            state = self.dag_run(dag_id, run_id)["state"]
            if on_poll is not None:
                on_poll()
            if state in ("success", "failed"):
                return str(state)
            time.sleep(1.0)
        raise AirflowServerError(f"{dag_id} run {run_id} not finished after {timeout_s}s")


def wait_until_interrupted(airflow: LocalAirflow, poll_s: float = 2.0) -> None:
    """Keep `airflow` up until Ctrl-C (KeyboardInterrupt) or SIGTERM; a component that dies
    ends the wait with its log's tail (AirflowServerError)."""
    signal.signal(signal.SIGTERM, _terminate)
    while True:
        airflow.check_alive()
        time.sleep(poll_s)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def print_login(airflow: LocalAirflow) -> None:
    print(f"  Airflow UI:  {airflow.url}", flush=True)
    print(f"  login:       {USER} / {airflow.password}", flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from tasks.deployment import REPO_ROOT

    parser = argparse.ArgumentParser(
        prog="python -m devtools.servers.airflow_server",
        description="Start a private Airflow on 127.0.0.1 over an Airflow home and keep it up "
        "until Ctrl-C; every process it started is stopped on the way out.",
    )
    parser.add_argument(
        "--home", type=Path, required=True, help="AIRFLOW_HOME (created if missing)"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="API server port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--dags-folder", type=Path, default=REPO_ROOT / "dags", help="default: this repo's dags/"
    )
    parser.add_argument(
        "--plugins-folder",
        type=Path,
        default=REPO_ROOT / "plugins",
        help="default: this repo's plugins/",
    )
    args = parser.parse_args(argv)
    config = ServerConfig(
        home=args.home.resolve(),
        dags_folder=args.dags_folder.resolve(),
        plugins_folder=args.plugins_folder.resolve(),
        port=args.port or free_port(),
        reparse_s=AIRFLOW_REPARSE_S,  # a DAG edited under `make ui` shows up as in a deployment
        env={"JAX_PLATFORMS": "cpu"},
    )
    airflow = LocalAirflow(config)
    print(f"Starting Airflow in {config.home} ...", flush=True)
    try:
        airflow.start()
        print_login(airflow)
        print("Airflow stays up until Ctrl-C.", flush=True)
        wait_until_interrupted(airflow)
    except KeyboardInterrupt:
        pass
    except AirflowServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        airflow.stop()  # before any print: a closed pipe makes print raise
        print("Airflow stopped.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
