"""Settings of the Slurm backend (the deployment's ``[slurm]`` table): how Airflow reaches the
cluster, and each job role's allocation. Pure standard library: read at DAG-parse time for free;
a bad value fails there, naming its key. docs/slurm.md has the why of each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from rcpflow.trainer import job_exit
from tasks.deployment import register_table
from tasks.jobs.command import Role

# The project's one rule for environment variable names (and rcpflow's reserved ones).
from tasks.jobs.templates import ENV_NAME, check_env_name
from tasks.settings import SettingError

Transport = Literal["local", "ssh", "rest"]

# docs/exit-codes.md: 2 (bad arguments) and 5 (invalid input) fail at once.
DEFAULT_FAIL_EXIT_CODES = job_exit.DEFAULT_FAIL_EXIT_CODES

# Slurm's names: partitions, accounts, QOS, reservations, features ([-_.A-Za-z0-9]).
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_.]*$")
# --constraint: features joined by & | , and brackets/counts (e.g. "a100&ib", "[rack1|rack2]").
_CONSTRAINT = re.compile(r"^[-A-Za-z0-9_.&|,\[\]*()]+$")
_GRES = re.compile(
    r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*(:[0-9]+)?(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*(:[0-9]+)?)*$"
)
_MEMORY = re.compile(r"^[0-9]+[KMGT]?$")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_FORMS = (
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# What rcpflow sets itself from the job, or from a setting of its own: an extra argument may not
# set these (the value is the setting to use instead, or why).
RESERVED_SBATCH_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        "--job-name": "rcpflow names the job (it identifies the job when its id is reused)",
        "-J": "rcpflow names the job",
        "--output": "the setting log_dir",
        "-o": "the setting log_dir",
        "--error": "the setting log_dir",
        "-e": "the setting log_dir",
        "--open-mode": "rcpflow appends across requeues",
        "--signal": "the setting signal_grace_s",
        "--requeue": "rcpflow requeues by the exit-code contract (docs/exit-codes.md)",
        "--no-requeue": "rcpflow requeues by the exit-code contract (docs/exit-codes.md)",
        "--parsable": "rcpflow reads the job id",
        "--wrap": "the job's command is the [jobs] template",
        "--chdir": "the setting working_dir",
        "-D": "the setting working_dir",
        "--export": "the job's env is [jobs.<role>].env; names to pass on: export_env",
        "--comment": "rcpflow's comment tells its jobs from others' of the same name",
        "--nodes": "the setting nodes",
        "-N": "the setting nodes",
        "--ntasks-per-node": "the setting ntasks_per_node",
        "--ntasks": "nodes x ntasks_per_node",
        "-n": "nodes x ntasks_per_node",
        "--partition": "the setting partition",
        "-p": "the setting partition",
        "--account": "the setting account",
        "-A": "the setting account",
        "--qos": "the setting qos",
        "-q": "the setting qos",
        "--time": "the setting time_limit",
        "-t": "the setting time_limit",
        "--gpus-per-node": "the setting gpus_per_node",
        "--gres": "the setting gres",
        "--cpus-per-task": "the setting cpus_per_task",
        "-c": "the setting cpus_per_task",
        "--mem": "the setting mem",
        "--constraint": "the setting constraint",
        "-C": "the setting constraint",
        "--reservation": "the setting reservation",
        "--container-image": "the setting container_image",
        "--container-mounts": "the setting container_mounts",
        "--array": "one job per allocation",
        "-a": "one job per allocation",
        "--dependency": "rcpflow orders the jobs",
        "-d": "rcpflow orders the jobs",
    }
)


def time_limit_seconds(value: str) -> int:
    """Seconds of an sbatch ``--time`` value; ValueError when it is none of Slurm's forms."""
    for pattern, units in _TIME_FORMS:
        found = pattern.fullmatch(value)
        if found:
            return sum(int(n) * _UNIT_S[u] for n, u in zip(found.groups(), units, strict=True))
    raise ValueError(value)


@dataclass(frozen=True)
class SecretRef:
    """One variable of ``secret_env``: its value is read on the cluster when the job starts,
    from the file `file` (its contents, a trailing newline dropped) or the variable `env` of
    the job's environment there; never written into the script, a log or an XCom."""

    file: str = ""
    env: str = ""

    def __post_init__(self) -> None:
        if bool(self.file) == bool(self.env):
            raise SettingError("", "give exactly one of file (a path on the cluster) or env")
        if self.file and (not self.file.startswith("/") or "\n" in self.file):
            raise SettingError("file", f"{self.file!r} is not an absolute path on the cluster")
        if self.env and not ENV_NAME.fullmatch(self.env):
            raise SettingError("env", f"{self.env!r} is not an environment variable name")


def _default_secret_env() -> Mapping[str, SecretRef]:
    return MappingProxyType({})


# The fields of a `SlurmJobShape` that are sbatch options of that name, the value as given.
_NAMED_OPTIONS = ("partition", "account", "qos", "constraint", "reservation", "gres")


@dataclass(frozen=True)
class SlurmJobShape:
    """One role's allocation and restart policy (``[slurm.train]``, ``[slurm.evaluate]``).

    `nodes` x `ntasks_per_node` processes, each started by ``srun`` (one process per task,
    `jax.distributed` from Slurm's layout); GPUs either as `gpus_per_node` or as `gres`
    (``gpu:4``), not both. `time_limit` is sbatch's ``--time``; the job gets
    ``--signal=B:TERM@<signal_grace_s>`` so the trainer saves before it. `max_restarts`
    counts restarts after a failure (docs/exit-codes.md); preemption, node failure and SIGTERM
    do not count. `extra_sbatch_args` are further ``--option=value`` items (one argument each,
    none of the options rcpflow sets). `container_image` (+ `container_mounts`, ``src:dst``)
    runs each task in a Pyxis container. `secret_env` maps a variable to a `SecretRef`.
    """

    partition: str = ""
    account: str = ""
    qos: str = ""
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int = 0
    gres: str = ""
    cpus_per_task: int = 1
    mem: str = ""
    time_limit: str = "60"
    constraint: str = ""
    reservation: str = ""
    exclusive: bool = False
    extra_sbatch_args: tuple[str, ...] = ()
    container_image: str = ""
    container_mounts: tuple[str, ...] = ()
    max_restarts: int = 0
    signal_grace_s: int = 60
    secret_env: Mapping[str, SecretRef] = field(default_factory=_default_secret_env)

    def __post_init__(self) -> None:
        for name in ("partition", "account", "qos", "reservation"):
            value = getattr(self, name)
            if value and not _SLURM_NAME.fullmatch(value):
                raise SettingError(name, f"{value!r} is not a Slurm name ([-_.A-Za-z0-9])")
        if self.constraint and not _CONSTRAINT.fullmatch(self.constraint):
            raise SettingError("constraint", f"{self.constraint!r} is not a feature expression")
        for name, minimum in (
            ("nodes", 1),
            ("ntasks_per_node", 1),
            ("gpus_per_node", 0),
            ("cpus_per_task", 1),
            ("max_restarts", 0),
            ("signal_grace_s", 1),
        ):
            if getattr(self, name) < minimum:
                raise SettingError(name, f"must be >= {minimum}, got {getattr(self, name)}")
        if self.gres and self.gpus_per_node:
            raise SettingError("gres", "give GPUs as gpus_per_node or as gres, not both")
        if self.gres and not _GRES.fullmatch(self.gres):
            raise SettingError("gres", f"{self.gres!r} is not a gres list (e.g. 'gpu:4')")
        if self.mem and not _MEMORY.fullmatch(self.mem):
            raise SettingError("mem", f"{self.mem!r} is not sbatch --mem (e.g. '0', '400G')")
        try:
            limit = time_limit_seconds(self.time_limit)
        except ValueError:
            raise SettingError(
                "time_limit",
                f"{self.time_limit!r} is not sbatch --time (minutes, MM:SS, HH:MM:SS, D-HH, "
                "D-HH:MM, D-HH:MM:SS)",
            ) from None
        if limit <= 0:
            raise SettingError("time_limit", "must be more than 0 (Slurm's 0 is no limit)")
        if self.signal_grace_s >= limit:
            raise SettingError(
                "signal_grace_s",
                f"{self.signal_grace_s} s is not less than time_limit={self.time_limit!r} "
                f"({limit} s): the job would be told to stop when it starts",
            )
        self._check_extra_args()
        if self.container_image and any(c.isspace() for c in self.container_image):
            raise SettingError("container_image", f"{self.container_image!r} has whitespace")
        if self.container_mounts and not self.container_image:
            raise SettingError("container_mounts", "mounts need a container_image")
        for i, mount in enumerate(self.container_mounts):
            src, sep, dst = mount.partition(":")
            if not sep or not src.startswith("/") or not dst.startswith("/") or "," in mount:
                raise SettingError(
                    f"container_mounts[{i}]", f"{mount!r} is not SRC:DST (absolute, no comma)"
                )
        for name in self.secret_env:
            check_env_name("secret_env", name)

    def _check_extra_args(self) -> None:
        for i, arg in enumerate(self.extra_sbatch_args):
            key = f"extra_sbatch_args[{i}]"
            if not arg.startswith("-"):
                raise SettingError(
                    key, f"{arg!r} is not one sbatch option (--name or --name=value)"
                )
            if any(c.isspace() or c in "'\"\\\0" for c in arg):
                raise SettingError(key, f"{arg!r}: one argument without whitespace or quotes")
            option = arg.split("=", 1)[0]
            if not arg.startswith("--") and len(option) > 2:
                raise SettingError(
                    key, f"{arg!r}: give a short option's value as its long form --name=value"
                )
            if not arg.startswith("--") and option != arg:
                raise SettingError(key, f"{arg!r}: give a short option as its long form")
            if option in RESERVED_SBATCH_OPTIONS:
                raise SettingError(
                    key, f"{option} is set by rcpflow: {RESERVED_SBATCH_OPTIONS[option]}"
                )

    @property
    def tasks(self) -> int:
        """How many processes the job runs."""
        return self.nodes * self.ntasks_per_node

    @property
    def time_limit_s(self) -> int:
        return time_limit_seconds(self.time_limit)

    def named_options(self) -> list[tuple[str, str]]:
        """The allocation's options that are a name or an expression as given, by their
        sbatch names, those set only; the same for a batch script and for slurmrestd."""
        return [(name, getattr(self, name)) for name in _NAMED_OPTIONS if getattr(self, name)]


def default_train_shape() -> SlurmJobShape:
    """Training: resumes from its newest checkpoint, so a crash restarts it (3 times); 10
    minutes between the signal and the time limit for the queued checkpoint saves."""
    return SlurmJobShape(time_limit="1-00:00:00", max_restarts=3, signal_grace_s=600)


def default_eval_shape() -> SlurmJobShape:
    """Evaluation: idempotent (a valid summary is reused), so a restart costs only time."""
    return SlurmJobShape(time_limit="4:00:00", max_restarts=2, signal_grace_s=60)


@dataclass(frozen=True)
class SlurmSettings:
    """How the backend reaches the cluster, and where the jobs run.

    transport: ``local`` runs sbatch/squeue/scontrol/scancel on the Airflow worker and
    triggerer; ``ssh`` runs them on a login node through the SSH provider's hook (`ssh_conn_id`);
    ``rest`` speaks to slurmrestd at `rest_url` (openapi v0.0.38 or v0.0.40+, the newest it
    serves) with the user name and JWT of the connection `rest_conn_id` (login, password).
    `working_dir` (the jobs' working folder) and `log_dir` (their output files) are paths on
    the cluster; `python` is ``{python}`` of the job templates there. A running job is read
    every `poll_interval_s` (well under Slurm's MinJobAge, 300 s by default, after which a
    finished job is forgotten unless accounting keeps it); a cluster that does not answer is
    retried with backoff up to `backoff_max_s` and never fails a running job: after
    `outage_budget_s` of failed reads the watch says so in the task log and goes on (the same
    three keys as ``[gke]``).
    `command_timeout_s` bounds one cluster command. `fail_exit_codes` fail a job at once.
    `eval_in_training_allocation`: evaluate every checkpoint after training, in the training
    job's own allocation (the reference's schedule), instead of one job per checkpoint.
    `export_env`: names of variables of the submitting side (the worker, or the login node
    over SSH) that the jobs get (sbatch ``--export=<names>``); none by default (``NIL``):
    a job's environment is its ``[jobs.<role>].env`` and ``secret_env`` only. Airflow's own
    (``AIRFLOW_*``) are refused.
    """

    transport: Transport = "local"
    ssh_conn_id: str = ""
    rest_url: str = ""
    rest_conn_id: str = ""
    working_dir: str = ""
    log_dir: str = ""
    python: str = "python3"
    poll_interval_s: float = 15.0
    backoff_max_s: float = 120.0
    outage_budget_s: float = 600.0
    command_timeout_s: float = 60.0
    run_retries: int = 2
    fail_exit_codes: tuple[int, ...] = DEFAULT_FAIL_EXIT_CODES
    eval_in_training_allocation: bool = False
    export_env: tuple[str, ...] = ()
    train: SlurmJobShape = field(default_factory=default_train_shape)
    evaluate: SlurmJobShape = field(default_factory=default_eval_shape)

    def __post_init__(self) -> None:
        if self.transport == "ssh" and not self.ssh_conn_id:
            raise SettingError("ssh_conn_id", "transport 'ssh' needs an Airflow SSH connection id")
        if self.transport == "rest":
            if not re.fullmatch(r"^https?://[^\s/]+(/[^\s]*)?$", self.rest_url):
                raise SettingError("rest_url", f"{self.rest_url!r} is not an http(s) URL")
            if not self.rest_conn_id:
                raise SettingError(
                    "rest_conn_id", "transport 'rest' needs a connection holding the user and JWT"
                )
        for name in ("working_dir", "log_dir"):
            value = getattr(self, name)
            if not value.startswith("/") or any(c in value for c in "\n\r\0"):
                raise SettingError(name, f"{value!r} is not an absolute path on the cluster")
        if not self.python or any(c.isspace() for c in self.python):
            raise SettingError("python", f"{self.python!r} is not a program name or path")
        if not 0 < self.poll_interval_s <= 100:
            raise SettingError(
                "poll_interval_s",
                f"must be in (0, 100], got {self.poll_interval_s}: a finished job is forgotten "
                "MinJobAge (300 s by default) after it ends",
            )
        for name in ("backoff_max_s", "outage_budget_s", "command_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingError(name, f"must be > 0, got {getattr(self, name)}")
        if self.run_retries < 0:
            raise SettingError("run_retries", f"must be >= 0, got {self.run_retries}")
        for i, name in enumerate(self.export_env):
            if not ENV_NAME.fullmatch(name):
                raise SettingError(f"export_env[{i}]", f"{name!r} is not a variable name")
            if name.upper().startswith("AIRFLOW"):
                raise SettingError(
                    f"export_env[{i}]", f"{name}: Airflow's variables never leave Airflow"
                )
        problem = job_exit.fail_exit_codes_problem(self.fail_exit_codes)
        if problem:
            raise SettingError("fail_exit_codes", problem)

    def shape(self, role: Role) -> SlurmJobShape:
        return {"train": self.train, "evaluate": self.evaluate}[role]


TABLE = "slurm"
register_table(TABLE, SlurmSettings)
