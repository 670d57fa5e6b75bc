"""Deployment settings: which backend runs the jobs, where runs are stored, the eval window.

DAG structure depends on these (a local subprocess task vs. a GKE JobSet group; the number of
evaluations at once), so they are read at parse time, cheaply: a small TOML file named by the
environment variable ``RCPFLOW_DEPLOYMENT``, else the embedded local default below. Relative
paths in a file resolve against that file's folder; in the embedded default, against the
repository root. Run-time choices (seeds, batch size, ...) are DAG Params, not settings.
"""

from __future__ import annotations

import functools
import os
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.gke.settings import GkeSettings

ENV_VAR = "RCPFLOW_DEPLOYMENT"
BACKENDS = ("local", "gke")
REPO_ROOT = Path(__file__).resolve().parents[1]

# The embedded default: everything on this machine, CPU JAX, runs under <repo>/runs.
DEFAULT_TOML = """
backend = "local"
storage_root = "runs"
eval_window = 1
submission_schedule = ""
train_timeout_minutes = 60
eval_timeout_minutes = 30
eval_retries = 0

[job_env]
JAX_PLATFORMS = "cpu"
"""


class DeploymentError(ValueError):
    """The deployment file is unusable; the message names the file and the key."""


@dataclass(frozen=True)
class Deployment:
    """Parse-time settings of one Airflow deployment of rcpflow."""

    source: str  # the file these came from, or "<embedded default>"
    backend: str = "local"
    storage_root: str = str(REPO_ROOT / "runs")
    # How many evaluate instances of one run at once (max_active_tis_per_dagrun):
    # 1 = strictly in step order, more = speculative (faster verdict, some wasted evaluation).
    eval_window: int = 1
    # Interpreter of local jobs; empty means the Airflow worker's own (its venv has tpu_jobs).
    python: str = ""
    # Cron expression or preset for mlperf_grpo_submission; empty = triggered only.
    submission_schedule: str = ""
    train_timeout_minutes: int = 60
    eval_timeout_minutes: int = 30
    eval_retries: int = 0
    # Extra environment of local jobs (e.g. JAX_PLATFORMS=cpu).
    job_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The [gke] table as tasks.gke reads it; None when the file has none.
    gke: GkeSettings | None = None

    @property
    def job_python(self) -> str:
        return self.python or sys.executable

    @property
    def schedule(self) -> str | None:
        return self.submission_schedule or None


def _check_type(source: str, key: str, value: Any, expected: type) -> None:
    # bool is an int in Python, never a valid count here
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise DeploymentError(
            f"{source}: {key} must be {expected.__name__}, got {type(value).__name__} {value!r}"
        )


def parse_deployment(text: str, *, source: str, base_dir: Path) -> Deployment:
    """Settings from TOML text; unknown keys and wrong types are errors naming the key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeploymentError(f"{source}: not valid TOML: {exc}") from exc
    known = {f.name: f for f in fields(Deployment) if f.name != "source"}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise DeploymentError(f"{source}: unknown key(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "job_env":
            _check_type(source, key, value, dict)
            for name, item in value.items():
                _check_type(source, f"job_env.{name}", item, str)
            values[key] = MappingProxyType(dict(value))
        elif key == "gke":
            _check_type(source, key, value, dict)
            from tasks.gke.settings import GkeSettings, GkeSettingsError

            try:
                values[key] = GkeSettings.from_mapping(value, where="gke")
            except GkeSettingsError as exc:
                raise DeploymentError(f"{source}: {exc}") from exc
        elif key in (
            "eval_window",
            "train_timeout_minutes",
            "eval_timeout_minutes",
            "eval_retries",
        ):
            _check_type(source, key, value, int)
            minimum = 0 if key == "eval_retries" else 1
            if value < minimum:
                raise DeploymentError(f"{source}: {key} must be >= {minimum}, got {value}")
            values[key] = value
        else:
            _check_type(source, key, value, str)
            values[key] = value
    backend = values.get("backend", "local")
    if backend not in BACKENDS:
        raise DeploymentError(f"{source}: backend must be one of {BACKENDS}, got {backend!r}")
    if "storage_root" in values:
        root = values["storage_root"]
        if not root:
            raise DeploymentError(f"{source}: storage_root must not be empty")
        if not root.startswith("gs://"):
            values["storage_root"] = str((base_dir / root).resolve())
        else:
            values["storage_root"] = root.rstrip("/")
    if values.get("python"):
        python = values["python"]
        values["python"] = str((base_dir / python).resolve()) if os.sep in python else python
    if backend == "gke" and values.get("gke") is None:
        raise DeploymentError(f"{source}: backend 'gke' needs a [gke] table")
    return Deployment(source=source, **values)


@functools.lru_cache(maxsize=4)
def _load(path: str | None) -> Deployment:
    if path is None:
        return parse_deployment(DEFAULT_TOML, source="<embedded default>", base_dir=REPO_ROOT)
    file = Path(path).expanduser().resolve()
    try:
        text = file.read_text()
    except OSError as exc:
        raise DeploymentError(f"{ENV_VAR}={path}: cannot read it: {exc}") from exc
    return parse_deployment(text, source=str(file), base_dir=file.parent)


def load_deployment() -> Deployment:
    """The deployment named by ``$RCPFLOW_DEPLOYMENT``, else the embedded local default."""
    return _load(os.environ.get(ENV_VAR) or None)
