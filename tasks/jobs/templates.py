"""The deployment's ``[jobs]`` table: which command, environment and image run each job, and
where a foreign evaluate job leaves its result.

    [jobs.train]
    command = ["{python}", "/opt/trainer/train.py", "--out", "{run_dir}", "--seed", "{seed}"]
    env = { XLA_FLAGS = "..." }
    image = "registry/trainer:1"            # gke backend only
    secret_env = { HF_TOKEN = { secret = "hf", key = "token" } }   # gke backend only

    [jobs.evaluate]
    command = ["{python}", "/opt/eval/run.py", "--ckpt", "{checkpoint_path}", "--out", "/e"]
    result = { format = "tunix-tree", path = "/e" }

Left out, a table keeps today's toy job (`tasks.jobs.command.TRAIN_JOB` / `EVALUATE_JOB`), and an
evaluate job's result is rcpflow's own: the summary the job writes at
``{summary_dir}/summary.json``. Any other result format is one of ``rcpflow eval import``'s, read
from the rendered `path` after the job (``tunix-tree``: `path` is a tree
``DIR/step_<N>/<attempt>/summary.json`` and the attempt the job added is read). Everything is
checked when the file is parsed, so a placeholder a job cannot have fails at DAG-parse time
naming its key (``jobs.train.command[3]``); substitution is per argv item, never a shell.

Credentials are never values in the file: an ``env`` name that looks like one (SECRET,
PASSWORD, CREDENTIAL(S) in it, TOKEN or KEY as a part of it, e.g. HF_TOKEN) is refused;
``secret_env`` names a Kubernetes Secret and key per variable instead (a ``secretKeyRef``: the
value stays in the cluster, never in a JobSet that Airflow logs or stores).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Literal

from rcpflow.files.layout import RunLayout
from tasks.jobs.command import (
    EVALUATE_JOB,
    PLACEHOLDERS,
    TRAIN_JOB,
    JobCommand,
    JobCommandError,
    Role,
    check_template,
    fill,
)
from tasks.settings import SettingError

# "rcpflow": the job writes the step's summary itself; the others are `rcpflow eval import`'s
# source formats (rcpflow.verdict.eval_import.SOURCE_FORMATS), and a Tunix-style tree of them.
ResultFormat = Literal[
    "rcpflow",
    "rcpflow-summary",
    "tunix-summary",
    "rcpflow-attempts",
    "deepswe",
    "r2egym",
    "tunix-tree",
    "nemo-rl-mllog",
]
# "rcpflow": the trainer records the manifest itself (the recorder, `rcpflow manifest add`);
# "nemo-rl-checkpoints": rcpflow builds it from NeMo-RL's step_<N>/ tree at `path`
# (`rcpflow.trainer.nemo_rl_import`), and the job's MLPERF_MLLOG_FILE is the run's MLLOG.
TrainResultFormat = Literal["rcpflow", "nemo-rl-checkpoints"]
# What a train result path may name: it is read outside the job too (the checkpoint waits).
_TRAIN_RESULT_PLACEHOLDERS = frozenset({"run_dir", "seed", "checkpoint_dir"})
MLLOG_ENV = "MLPERF_MLLOG_FILE"
# A result path must name one step's result; these placeholders differ per step.
_PER_STEP = frozenset(
    {"step", "samples_count", "checkpoint_path", "checkpoint_timestamp_ms", "summary_dir"}
)
# Set by the backends themselves (tasks.backends.local, tasks.backends.gke.render).
# Every name pattern here is matched whole (fullmatch): `$` alone lets a trailing newline pass.
_RESERVED_ENV = re.compile(r"RCPFLOW_.*|PYTHONUNBUFFERED")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX; Kubernetes allows more, never less
# Names that usually hold a credential: SECRET, PASSWORD/PASSWD, CREDENTIAL(S) anywhere in the
# name, TOKEN and KEY as one of its _-separated parts (HF_TOKEN, API_KEY; not
# TOKENIZERS_PARALLELISM or MONKEY).
_SECRET_NAME = re.compile(
    r"(SECRET|PASSWORD|PASSWD|CREDENTIAL)|(^|_)(TOKENS?|(API)?KEYS?)(_|$)", re.IGNORECASE
)
# Kubernetes: a Secret's name is a DNS-1123 subdomain (at most 253); a key is [-._a-zA-Z0-9]+
# of at most 253, and not "." or ".." (IsConfigMapKey).
_SECRET_REF_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def _command(role: Role, argv: tuple[str, ...]) -> JobCommand:
    try:
        return JobCommand(role, argv)
    except JobCommandError as exc:
        key = "command" if exc.index is None else f"command[{exc.index}]"
        raise SettingError(key, str(exc)) from None


def check_env_name(table: str, name: str, reserved: bool = True) -> None:
    """`name` of the env table `table` is a POSIX variable name (and, when `reserved`, not one
    rcpflow sets itself); SettingError naming ``table.name`` otherwise. Every backend's rule."""
    if not ENV_NAME.fullmatch(name):
        shown = name if name.isprintable() else repr(name)  # a newline stays visible
        raise SettingError(f"{table}.{shown}", "is not an environment variable name")
    if reserved and _RESERVED_ENV.fullmatch(name):
        raise SettingError(f"{table}.{name}", "is set by rcpflow itself; choose another name")


def check_plain_env(table: str, env: Mapping[str, str], reserved: bool = True) -> None:
    """The names of an env table whose values are written out (a job's ``env``, the
    deployment's ``[job_env]``): variable names, none that looks like a credential (its value
    would be in every job's spec, log and XCom), and with `reserved` none of rcpflow's own (a
    job's env; ``[job_env]`` may set them for every local job, e.g. RCPFLOW_LEASE_TIMEOUT_S)."""
    for name in env:
        check_env_name(table, name, reserved)
        if _SECRET_NAME.search(name):
            raise SettingError(
                f"{table}.{name}",
                "looks like a credential: its value would be in every JobSet, log and XCom; "
                f"give it as a Secret reference instead: secret_env = {{ {name} = {{ secret = "
                '"<Secret name>", key = "<key>" } }'
                + (" in a [jobs.<kind>] table" if table == "job_env" else ""),
            )


def _check_env(env: Mapping[str, str], secret_env: Mapping[str, SecretKeyRef]) -> None:
    check_plain_env("env", env)
    for name in secret_env:
        check_env_name("secret_env", name)
        if name in env:
            raise SettingError(f"secret_env.{name}", "is also in env; give it once")


def _check_image(image: str | None) -> None:
    if image is not None and (not image or any(c.isspace() for c in image)):
        raise SettingError("image", f"{image!r} is not an image reference")


@dataclass(frozen=True)
class SecretKeyRef:
    """One variable of ``secret_env``: the key `key` of the Kubernetes Secret `secret` in the
    job's namespace (rendered as ``valueFrom.secretKeyRef``)."""

    secret: str = ""  # required: the defaults only let a table without it name the key
    key: str = ""

    def __post_init__(self) -> None:
        for name, value in (("secret", self.secret), ("key", self.key)):
            if not value:
                raise SettingError(name, "is required (secret_env = { VAR = { secret, key } })")
        if len(self.secret) > 253 or not _SECRET_REF_NAME.fullmatch(self.secret):
            raise SettingError("secret", f"{self.secret!r} is not a Kubernetes Secret name")
        # Kubernetes' rule for a Secret's key: [-._a-zA-Z0-9]+, not "." or "..", and not
        # starting with ".." (it would name a path above the Secret's volume).
        key = self.key
        if len(key) > 253 or not _SECRET_KEY.fullmatch(key) or key == "." or key.startswith(".."):
            raise SettingError(
                "key",
                f"{key!r} is not a Secret key ([-._a-zA-Z0-9]+, not '.', not starting with '..')",
            )


class _ResultLocation:
    """What EvalResult and TrainResult share: the format 'rcpflow' is rcpflow's own file (no
    path); any other format is imported from the path its template renders to."""

    format: str
    path: str

    def _path_to_check(self, own_file: str, needed: str) -> bool:
        """Whether there is a path template to check further (none for the format 'rcpflow')."""
        if self.format == "rcpflow":
            if self.path:
                raise SettingError(
                    "path", f"format 'rcpflow' is {own_file}; give no path (or name another format)"
                )
            return False
        if not self.path:
            raise SettingError("path", f"format {self.format!r} needs {needed}")
        return True

    @property
    def imported(self) -> bool:
        """Whether rcpflow imports the result (anything but its own file)."""
        return self.format != "rcpflow"

    def render(self, values: Mapping[str, str | int]) -> str:
        return fill(self.path, values)


@dataclass(frozen=True)
class EvalResult(_ResultLocation):
    """Where an evaluate job leaves its result, and in which format (see the module doc)."""

    format: ResultFormat = "rcpflow"
    path: str = ""  # a template of the evaluate placeholders ({python} aside)

    def __post_init__(self) -> None:
        own = "the summary the job writes at {summary_dir}/summary.json"
        if not self._path_to_check(own, "the path of the result"):
            return
        try:
            names = check_template("evaluate", self.path, PLACEHOLDERS["evaluate"] - {"python"})
        except JobCommandError as exc:
            raise SettingError("path", str(exc)) from None
        if self.format != "tunix-tree" and not names & _PER_STEP:
            raise SettingError(
                "path",
                f"{self.path!r} is the same file for every step; use {{step}} (or "
                "{summary_dir}) in it",
            )


@dataclass(frozen=True)
class TrainResult(_ResultLocation):
    """Where a train job leaves its checkpoints' record, and in which format."""

    format: TrainResultFormat = "rcpflow"
    path: str = ""  # nemo-rl-checkpoints: the checkpoint root, e.g. "{checkpoint_dir}"

    def __post_init__(self) -> None:
        own = "the manifest the trainer records itself"
        if not self._path_to_check(own, "the checkpoint root"):
            return
        try:
            check_template("train", self.path, _TRAIN_RESULT_PLACEHOLDERS)
        except JobCommandError as exc:
            raise SettingError("path", str(exc)) from None


@dataclass(frozen=True)
class _JobTable:
    """``[jobs.<role>]``: the command, its extra environment (values, and Secret references
    on GKE), its image."""

    role: ClassVar[Role]
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    image: str | None = None  # None: the [gke] table's image
    secret_env: Mapping[str, SecretKeyRef] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        _command(self.role, self.command)
        _check_env(self.env, self.secret_env)
        _check_image(self.image)

    @property
    def job_command(self) -> JobCommand:
        return JobCommand(self.role, self.command)


@dataclass(frozen=True)
class TrainJob(_JobTable):
    role: ClassVar[Role] = "train"
    command: tuple[str, ...] = TRAIN_JOB.argv
    result: TrainResult = field(default_factory=TrainResult)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.result.imported and MLLOG_ENV in self.env:
            raise SettingError(
                f"env.{MLLOG_ENV}", "is set by rcpflow to the run's MLLOG for this result format"
            )

    def result_env(self, run_dir: str, seed: int) -> dict[str, str]:
        """What the job's environment gets for its result format: NeMo-RL's trainer writes
        its MLLOG where ``MLPERF_MLLOG_FILE`` says, the run folder's."""
        if not self.result.imported:
            return {}
        return {MLLOG_ENV: RunLayout(run_dir).mllog(seed)}


@dataclass(frozen=True)
class EvaluateJob(_JobTable):
    role: ClassVar[Role] = "evaluate"
    command: tuple[str, ...] = EVALUATE_JOB.argv
    result: EvalResult = field(default_factory=EvalResult)


@dataclass(frozen=True)
class Jobs:
    """The ``[jobs]`` table."""

    train: TrainJob = field(default_factory=TrainJob)
    evaluate: EvaluateJob = field(default_factory=EvaluateJob)

    def secret_envs(self) -> list[str]:
        """``jobs.<role>.secret_env`` keys that are set (a GKE-only setting)."""
        return [
            f"{r}.secret_env"
            for r, j in (("train", self.train), ("evaluate", self.evaluate))
            if j.secret_env
        ]

    def images(self) -> dict[str, str]:
        """``jobs.<role>.image`` keys that are set, with their values."""
        found = {"train.image": self.train.image, "evaluate.image": self.evaluate.image}
        return {k: v for k, v in found.items() if v is not None}
