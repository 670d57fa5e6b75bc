"""A private Slurm on 127.0.0.1 for tests and the demo: slurmctld and slurmd nodes (``n1``,
``n2``) as child processes, with their own munged (or ``auth/none``) and, as an option,
slurmrestd with JWT. Two versions: the host's Debian 12 packages (22.05; ``make
system-packages`` installs them) or Debian 13's 24.11 run inside a cached root folder
(`devtools.servers.slurm_root`), whose clients are put first on the cluster's PATH. Every file
lives under one temporary folder; everything is stopped by the PID we hold, after the jobs are
cancelled. Facts behind the config: ``../shared/reference/slurm-notes.md``, docs/slurm.md and
docs/slurm-versions.md.

``python -m devtools.servers.slurm_cluster [--version 24.11]`` starts one until Ctrl-C and prints
its ``SLURM_CONF``.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from devtools.servers import slurm_root
from tasks.jobs.processes import Server, free_port, stop_processes

AuthKind = Literal["munge", "none"]
# The host's Debian 12 packages, or Debian 13's in a root folder (`slurm_root`).
SlurmVersion = Literal["22.05", "24.11"]
VERSIONS: tuple[SlurmVersion, ...] = get_args(SlurmVersion)
# The Debian packages the harness needs (make system-packages installs them).
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
MUNGE_BINARIES = ("munged", "mungekey")
# The clients a 24.11 cluster puts first on its PATH (each runs inside the root).
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct", "srun", "salloc")
REST_USER = "slurm"  # slurmrestd refuses to run as root
_START_TIMEOUT_S = 60.0
_STOP_GRACE_S = 15.0
_CANCEL_WAIT_S = 30.0


class SlurmClusterError(RuntimeError):
    """The private Slurm could not be started; the message names the step and its log."""


def missing_binaries(
    rest: bool = False, auth: AuthKind = "munge", version: SlurmVersion = "22.05"
) -> list[str]:
    """The programs the harness needs that are not on PATH (sbin included); for 24.11, the
    host tools that build and enter its root (the root holds the rest)."""
    if version != "22.05":
        return slurm_root.missing_tools()
    wanted = [*BINARIES, *(MUNGE_BINARIES if auth == "munge" else ())]
    if rest:
        wanted.append("slurmrestd")
    return [name for name in wanted if _which(name) is None]


def _which(name: str) -> str | None:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return shutil.which(name, path=path)


@dataclass(frozen=True)
class NodeSpec:
    """One slurmd: its name in slurm.conf, CPUs and memory it declares."""

    name: str
    cpus: int = 4
    memory_mb: int = 4000


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


class SlurmCluster(Server):
    """Context manager: ``with SlurmCluster() as c: subprocess.run(["sbatch", ...],
    env={**os.environ, **c.env})``.

    `cpus` per node are declared, not detected (``SlurmdParameters=config_overrides``), so
    two nodes of 4 CPUs run on a 2-core machine. `min_job_age_s` is how long slurmctld keeps a
    finished job (then ``Invalid job id``). `rest` adds slurmrestd (JWT, `rest_url`,
    `rest_token`); it runs as the ``slurm`` user, which must exist (Debian's package adds it).
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec] = (NodeSpec("n1"), NodeSpec("n2")),
        *,
        auth: AuthKind = "munge",
        rest: bool = False,
        min_job_age_s: int = 300,
        kill_wait_s: int = 3,
        root: Path | None = None,
        version: SlurmVersion = "22.05",
        max_job_count: int | None = None,
    ) -> None:
        self.version: SlurmVersion = version
        self.max_job_count = max_job_count  # slurmctld's MaxJobCount (Slurm's default: 10000)
        # Debian 13's root folder holding 24.11 (None: the host's own Slurm).
        self.system_root: Path | None = None
        self.nodes = tuple(nodes)
        self.auth: AuthKind = auth
        self.rest = rest
        self.min_job_age_s = min_job_age_s
        self.kill_wait_s = kill_wait_s
        self._given_root = root
        self.root = Path()
        self.controller_port = 0
        self.rest_port = 0
        self._node_ports: dict[str, int] = {}
        self._munged: _Daemon | None = None
        self._controller: _Daemon | None = None
        self._slurmds: dict[str, _Daemon] = {}
        self._restd: _Daemon | None = None
        self._rest_versions: list[str] | None = None
        self._started = False

    # --- where things are -------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, ...) needs in its environment to reach this cluster;
        for 24.11 also PATH, its own clients first (a 24.11 slurmctld refuses 22.05's)."""
        env = {"SLURM_CONF": str(self.conf)}
        if self.system_root is not None:
            env["PATH"] = f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return env

    @property
    def bin_dir(self) -> Path:
        """The clients of a 24.11 cluster (wrappers that run the root's)."""
        return self.root / "bin"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def rest_url(self) -> str:
        if not self.rest:
            raise SlurmClusterError("this cluster was started without slurmrestd (rest=True)")
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def pids(self) -> dict[str, int]:
        """The PIDs of the daemons we started, by name."""
        daemons = [self._munged, self._controller, self._restd, *self._slurmds.values()]
        return {d.name: d.process.pid for d in daemons if d is not None}

    # --- start ------------------------------------------------------------------------------

    def start(self) -> None:
        missing = missing_binaries(self.rest, self.auth, self.version)
        if missing:
            raise SlurmClusterError(
                f"Slurm {self.version}: not installed: {', '.join(missing)} (make "
                "system-packages installs slurmctld slurmd slurm-client munge slurmrestd "
                "slurm-wlm-jwt-plugin debootstrap)"
            )
        if self.version != "22.05":
            try:
                self.system_root = slurm_root.ensure_root()
            except slurm_root.SlurmRootError as error:
                raise SlurmClusterError(f"Slurm {self.version}: {error}") from error
        root = self._given_root or Path(tempfile.mkdtemp(prefix="rcpflow-slurm-"))
        self.root = root
        # slurmrestd runs as another user: it must read the config (not the keys).
        root.chmod(0o755)
        for sub in ("state", "spool", "run", "log", "munge", "jobs"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "jobs").chmod(0o1777)
        if self.system_root is not None:
            self._write_clients(self.system_root)
        self.controller_port = free_port()
        self._node_ports = {n.name: free_port() for n in self.nodes}
        if self.rest:
            self.rest_port = free_port()
            self._make_jwt_key()
        if self.auth == "munge":
            self._start_munged()
        self.conf.write_text(self.render_config())
        self._started = True
        self.start_controller()
        for node in self.nodes:
            self._start_slurmd(node.name)
        self.wait_nodes_idle()
        if self.rest:
            self._start_restd()

    def render_config(self) -> str:
        """slurm.conf of this cluster (one file; clients find it through SLURM_CONF)."""
        root, user = self.root, getpass.getuser()
        lines = [
            "ClusterName=rcpflow",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.controller_port}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/run/slurmctld.pid",
            f"SlurmdPidFile={root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd-%n.log",
            "SlurmdParameters=config_overrides",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={root}/log/jobcomp.txt",
            "MailProg=/bin/true",
            "MpiDefault=none",
            "ReturnToService=2",
            f"MinJobAge={self.min_job_age_s}",
            f"KillWait={self.kill_wait_s}",
            *([f"MaxJobCount={self.max_job_count}"] if self.max_job_count else []),
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
        ]
        if self.auth == "munge":
            lines += [
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={root}/munge/munge.socket",
            ]
        else:
            lines += ["AuthType=auth/none", "CredType=cred/none"]
        if self.rest:
            lines += ["AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={root}/jwt_hs256.key"]
        for node in self.nodes:
            lines.append(
                f"NodeName={node.name} NodeHostname=localhost NodeAddr=127.0.0.1 "
                f"Port={self._node_ports[node.name]} CPUs={node.cpus} RealMemory={node.memory_mb} "
                "State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _write_clients(self, system_root: Path) -> None:
        self.bin_dir.mkdir(exist_ok=True)
        for program in CLIENTS:
            wrapper = self.bin_dir / program
            wrapper.write_text(slurm_root.client_wrapper(system_root, program))
            wrapper.chmod(0o755)

    def _argv(self, argv: Sequence[str], user: str | None = None) -> list[str]:
        """`argv` as this cluster's version runs it (inside the root for 24.11)."""
        if self.system_root is None:
            return list(argv)
        # By full path: the cluster's PATH, wrappers first, reaches the root too.
        program = argv[0] if argv[0].startswith("/") else self._need(argv[0])
        return slurm_root.enter_argv(self.system_root, [program, *argv[1:]], user=user)

    def _need(self, name: str) -> str:
        """The path of a Slurm or munge program of this cluster's version."""
        if self.system_root is None:
            return _need(name)
        found = slurm_root.program_path(self.system_root, name)
        if found is not None:
            return found
        raise SlurmClusterError(
            f"{name} is not in the Slurm {self.version} root {self.system_root}"
        )

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> _Daemon:
        log = self.log_dir / f"{name}.stdout"
        with log.open("ab") as out:
            process = subprocess.Popen(
                self._argv(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, **(env or {})},
                start_new_session=True,
            )
        return _Daemon(name, process, log)

    def _make_jwt_key(self) -> None:
        key = self.root / "jwt_hs256.key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)

    def _start_munged(self) -> None:
        munge = self.root / "munge"
        munge.chmod(0o755)  # munged refuses a socket folder others may write
        key = munge / "munge.key"
        self._check_run(self._argv([self._need("mungekey"), "-c", "-k", str(key)]), "mungekey")
        key.chmod(0o600)
        self._munged = self._spawn(
            "munged",
            [
                self._need("munged"),
                "-F",
                f"--key-file={key}",
                f"--socket={munge}/munge.socket",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
        )
        self._wait(lambda: (munge / "munge.socket").exists(), "munged: socket", self._munged)

    def start_controller(self) -> None:
        """Start slurmctld (again, after `stop_controller`: it keeps its jobs)."""
        if self._controller is not None and self._controller.process.poll() is None:
            return
        self._controller = self._spawn(
            "slurmctld", [self._need("slurmctld"), "-D", "-f", str(self.conf)]
        )
        self._wait(self.controller_answers, "slurmctld: answering", self._controller)

    def stop_controller(self) -> None:
        """Stop slurmctld (SIGTERM; its jobs keep running on the slurmd nodes)."""
        if self._controller is not None:
            stop_processes([self._controller.process], first=signal.SIGTERM, grace_s=_STOP_GRACE_S)

    def _start_slurmd(self, node: str) -> None:
        daemon = self._spawn(
            f"slurmd-{node}", [self._need("slurmd"), "-D", "-N", node, "-f", str(self.conf)]
        )
        self._slurmds[node] = daemon

    def _start_restd(self) -> None:
        # 22.05 serves the API by version (v0.0.38, which 24.11 dropped); 24.11 by plugin
        # (v0.0.40-v0.0.42 of openapi/slurmctld).
        plugin = "openapi/v0.0.38" if self.system_root is None else "openapi/slurmctld"
        argv = [
            self._need("slurmrestd"),
            "-f",
            str(self.conf),
            "-s",
            plugin,
            "-a",
            "rest_auth/jwt",
            f"127.0.0.1:{self.rest_port}",
        ]
        log = self.log_dir / "slurmrestd.stdout"
        env = {**os.environ, **self.env, "SLURM_JWT": "daemon"}
        with log.open("ab") as out:
            if self.system_root is not None:
                # The root's chroot drops to the user (unshare and mount need root first).
                process = subprocess.Popen(
                    self._argv(argv, user=REST_USER if os.geteuid() == 0 else None),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            else:
                account = pwd.getpwnam(REST_USER)
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    user=account.pw_uid if os.geteuid() == 0 else None,
                    group=account.pw_gid if os.geteuid() == 0 else None,
                    extra_groups=[] if os.geteuid() == 0 else None,
                )
        self._restd = _Daemon("slurmrestd", process, log)
        self._wait(self._rest_answers, "slurmrestd: answering", self._restd)

    def rest_token(self, lifespan_s: int = 3600) -> str:
        """A JWT for the current user, from slurmctld (``scontrol token``)."""
        out = self.client(
            "scontrol", "token", f"username={getpass.getuser()}", f"lifespan={lifespan_s}"
        )
        for line in out.splitlines():
            if line.startswith("SLURM_JWT="):
                return line.split("=", 1)[1].strip()
        raise SlurmClusterError(f"scontrol token printed no SLURM_JWT= line: {out!r}")

    def rest_api_versions(self) -> list[str]:
        """The versions of slurmctld's API this slurmrestd serves (``v0.0.38``, ...), read
        from its OpenAPI description."""
        import json
        import re
        import urllib.request

        if self._rest_versions is None:
            request = urllib.request.Request(
                f"{self.rest_url}/openapi/v3",
                headers={
                    "X-SLURM-USER-NAME": getpass.getuser(),
                    "X-SLURM-USER-TOKEN": self.rest_token(),
                },
            )
            with urllib.request.urlopen(request, timeout=30) as answer:
                paths = json.load(answer).get("paths", {})
            found = {m.group(1) for p in paths if (m := re.match(r"/slurm/(v[\d.]+)/", p))}
            self._rest_versions = sorted(found)
        return self._rest_versions

    # --- state ------------------------------------------------------------------------------

    def client(self, *argv: str, timeout_s: float = 30.0) -> str:
        """Run a Slurm client command against this cluster; its stdout (raises on failure)."""
        proc = subprocess.run(
            self._argv(argv),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr}")
        return proc.stdout

    def controller_answers(self) -> bool:
        try:
            self.client("scontrol", "ping", timeout_s=10)
        except (SlurmClusterError, subprocess.TimeoutExpired):
            return False
        return True

    def node_states(self) -> dict[str, str]:
        out = self.client("sinfo", "-h", "-N", "-o", "%N %T")
        states = {}
        for line in out.splitlines():
            name, _, state = line.strip().partition(" ")
            states[name] = state.strip()
        return states

    def wait_nodes_idle(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        names = {n.name for n in self.nodes}

        def idle() -> bool:
            try:
                states = self.node_states()
            except SlurmClusterError:
                return False
            return all(states.get(n, "").rstrip("*") in ("idle", "mixed") for n in names)

        self._wait(idle, "slurmd nodes: idle", None, timeout_s)

    def job_ids(self) -> list[str]:
        out = self.client("squeue", "-h", "-o", "%i")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _rest_answers(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.rest_url}/openapi", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answers (401 without a token)
        except OSError:
            return False

    def _wait(
        self,
        ready: Callable[[], bool],
        what: str,
        daemon: _Daemon | None,
        timeout_s: float = _START_TIMEOUT_S,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if daemon is not None and daemon.process.poll() is not None:
                raise SlurmClusterError(
                    f"{what}: {daemon.name} exited with {daemon.process.returncode}; "
                    f"log {daemon.log}:\n{_tail(daemon.log)}\n"
                    f"{_tail(self.log_dir / (daemon.name + '.log'))}"
                )
            if time.monotonic() > deadline:
                logs = "\n".join(f"{p}:\n{_tail(p)}" for p in sorted(self.log_dir.glob("*")))
                raise SlurmClusterError(f"{what}: not ready after {timeout_s:.0f} s\n{logs}")
            time.sleep(0.2)

    def _check_run(self, argv: Sequence[str], what: str) -> None:
        proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SlurmClusterError(f"{what}: exit {proc.returncode}: {proc.stderr.strip()}")

    # --- stop -------------------------------------------------------------------------------

    def cancel_all(self, timeout_s: float = _CANCEL_WAIT_S) -> None:
        """scancel every job and wait until slurmctld has none left running (their
        slurmstepd outlive slurmd: cancel before stopping the daemons)."""
        if not self.controller_answers():
            return
        ids = self.job_ids()
        if not ids:
            return
        with contextlib.suppress(SlurmClusterError, subprocess.TimeoutExpired):
            self.client("scancel", *ids)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.client("squeue", "-h", "-t", "PD,R,CG,S,CF,RQ,RS,SO", "-o", "%i")
            if not out.strip():
                return
            time.sleep(0.3)

    def stop(self) -> None:
        if not self._started:
            self._stop_daemons()
            return
        with contextlib.suppress(Exception):
            self.cancel_all()
        self._stop_daemons()

    def _stop_daemons(self) -> None:
        ordered = [
            self._restd,
            *self._slurmds.values(),
            self._controller,
            self._munged,
        ]
        procs = [d.process for d in ordered if d is not None]
        stop_processes(procs, first=signal.SIGTERM, grace_s=_STOP_GRACE_S)
        self._restd, self._controller, self._munged = None, None, None
        self._slurmds = {}
        self._started = False

    def cleanup(self) -> None:
        """Stop, then delete the temporary folder (only one this harness made)."""
        self.stop()
        if self._given_root is None and self.root != Path() and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)


def _need(name: str) -> str:
    found = _which(name)
    if found is None:
        raise SlurmClusterError(f"{name} is not installed")
    return found


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.servers.slurm_cluster",
        description="Run a private Slurm (slurmctld + slurmd n1, n2) on 127.0.0.1 until Ctrl-C.",
    )
    parser.add_argument("--auth", choices=("munge", "none"), default="munge")
    parser.add_argument("--rest", action="store_true", help="also slurmrestd with JWT")
    parser.add_argument("--cpus", type=int, default=4, help="CPUs each node declares")
    parser.add_argument(
        "--version", choices=VERSIONS, default="22.05", help="24.11: Debian 13's, in a root"
    )
    args = parser.parse_args(argv)
    nodes = [NodeSpec("n1", args.cpus), NodeSpec("n2", args.cpus)]
    cluster = SlurmCluster(nodes, auth=args.auth, rest=args.rest, version=args.version)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    with cluster:
        print(f"export SLURM_CONF={cluster.conf}", flush=True)
        if cluster.system_root is not None:
            print(f"export PATH={cluster.bin_dir}:$PATH  # Slurm {cluster.version}", flush=True)
        if args.rest:
            print(f"slurmrestd: {cluster.rest_url} (token: scontrol token)", flush=True)
        print(f"daemons: {cluster.pids}; logs under {cluster.log_dir}; Ctrl-C stops", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    cluster.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
