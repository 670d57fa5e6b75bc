"""Writing and reading the MLPerf log (MLLOG) of a run.

Events are rendered by the official `mlperf_logging.mllog` API (never hand-built ``:::MLLOG``
strings) into memory and persisted through `rcpflow.files.storage`, so the log can live on a local
disk or on GCS, and the eval section that `rcpflow.verdict.finalize` writes can replace an earlier
one atomically. The training side writes no ``run_stop`` and no eval events: those belong to
finalize.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rcpflow import recipe
from rcpflow.files import jsonio, logtext
from rcpflow.files.storage import storage_for

MLLOG_PREFIX = logtext.TOKEN
# Keys only finalize may write: the deferred-evaluation section of the log.
EVAL_SECTION_KEYS = frozenset(
    {"eval_start", "eval_stop", "eval_accuracy", "tracked_stats", "run_stop"}
)


def is_eval_section(event: Event) -> bool:
    """Whether `event` belongs to the eval section finalize writes. ``tracked_stats`` is
    finalize's only when it holds ``validation_time`` alone: a trainer's own per-step
    ``tracked_stats`` (NeMo-RL logs loss, reward, timings) are training lines."""
    if event.key != "tracked_stats":
        return event.key in EVAL_SECTION_KEYS
    return isinstance(event.value, dict) and set(event.value) == {"validation_time"}


# Trims call-site file names in the event metadata to repository-relative ones, so the bytes of
# a log do not depend on where the project is checked out.
_ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class MLLogError(ValueError):
    """A log that cannot be read or that breaks the contract; the message names the line."""


def require_mlperf_logging() -> None:
    """Fail at start, with the fix in the message, when RCP logging is asked for but impossible."""
    try:
        importlib.import_module("mlperf_logging.mllog")
    except ImportError as e:
        raise RuntimeError(
            "RCP logging is on but the official `mlperf-logging` package is not importable "
            "(pip install 'mlperf-logging>=4.1.68'), or run with --no-rcp-logging"
        ) from e


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


LogKind = Literal["event", "start", "end"]  # mlperf_logging's calls: point in time, interval


class EventRenderer:
    """Renders events to MLLOG lines with the official MLLogger, without touching a file."""

    def __init__(self) -> None:
        from mlperf_logging.mllog import constants, mllog

        self.constants = constants
        # A private Logger instance (not from logging.getLogger) so nothing else sees our lines.
        logger = logging.Logger(f"rcpflow.records.mllog.{id(self)}")
        logger.propagate = False
        self._capture = _Capture()
        logger.addHandler(self._capture)
        self._mllogger = mllog.MLLogger(logger=logger, root_dir=_ROOT_DIR)

    def render(
        self,
        kind: LogKind,
        key: str,
        value: Any = None,
        metadata: Mapping[str, Any] | None = None,
        time_ms: int | None = None,
        caller_depth: int = 1,
    ) -> str:
        """One MLLOG line. The metadata's call site is `caller_depth` frames above this method
        (1: whoever called render), so it never depends on who called *that* code."""
        method = {
            "event": self._mllogger.event,
            "start": self._mllogger.start,
            "end": self._mllogger.end,
        }[kind]
        self._capture.lines.clear()
        method(
            key=key,
            value=value,
            metadata=dict(metadata) if metadata else None,
            time_ms=time_ms,
            stack_offset=1 + caller_depth,
        )
        lines = [line for line in self._capture.lines if line.startswith(MLLOG_PREFIX)]
        if len(lines) != 1:
            raise MLLogError(f"mlperf_logging did not encode event {key!r}: {self._capture.lines}")
        return lines[0]


@dataclass(frozen=True)
class SystemInfo:
    """What the 6.1 rules make every log disclose about the submission and the run's layout."""

    org: str = "rcpflow"
    platform: str = (
        "rcpflow-local-cpu"  # matches rcpflow.submission.package.local_system().system_name
    )
    status: str = "research"
    precision_linear: str = "fp32"
    precision_attn: str = "fp32"
    precision_comm: str = "fp32"
    tensor_parallelism: int = 1
    pipeline_parallelism: int = 1
    context_parallelism: int = 1
    expert_parallelism: int = 1
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    config_filename: str = "rcpflow-embedded-default"


@dataclass(frozen=True)
class Event:
    key: str
    value: Any
    time_ms: int
    event_type: str
    metadata: dict[str, Any] = field(default_factory=dict)
    line_no: int = 0


def parse(text: str, where: str = "MLLOG") -> list[Event]:
    """The MLLOG events in `text`, found as the official parser finds them (`rcpflow.files.logtext`:
    lines without ``:::MLLOG`` are ignored, as the checker does)."""
    events = []
    for line_no, line in enumerate(logtext.lines(text), start=1):
        event_json = logtext.payload(line)
        if event_json is None:
            continue
        try:
            d = jsonio.loads(event_json, where, first_line=line_no, strict=False)
            if not isinstance(d["key"], str) or not isinstance(d.get("metadata") or {}, dict):
                raise TypeError("key must be a string and metadata an object")
            events.append(
                Event(
                    key=d["key"],
                    value=d.get("value"),
                    time_ms=_time_ms(d["time_ms"]),
                    event_type=d["event_type"],
                    metadata=d.get("metadata") or {},
                    line_no=line_no,
                )
            )
        except jsonio.JSONInputError as e:
            raise MLLogError(f"{e} (not an MLLOG event)") from e
        except (ValueError, KeyError, TypeError) as e:
            raise MLLogError(f"{where}: line {line_no}: not an MLLOG event ({e})") from e
    return events


def _time_ms(value: Any) -> int:
    # float() as the checker reads it; a time that is no finite number cannot be ordered
    # (int() of Infinity would be an OverflowError).
    t = float(value)
    if not math.isfinite(t):
        raise ValueError(f"time_ms {value!r} is not a finite number")
    return int(t)


def run_start_ms(events: Sequence[Event]) -> int | None:
    starts = [e.time_ms for e in events if e.key == "run_start"]
    return starts[-1] if starts else None


def read_events(path: str) -> list[Event]:
    return parse(logtext.read(path), where=path)


def read_given_log(path: str, role: str) -> list[Event]:
    """The events of a log another program wrote; a missing one is an MLLogError naming it by
    its `role` too (what it was given for)."""
    try:
        return read_events(path)
    except FileNotFoundError as e:
        raise MLLogError(f"{path}: no such MLLOG ({role})") from e


class TrainingLog:
    """The training section of a run's MLLOG, persisted after every event.

    `append=True` continues an existing log (a trainer resumed after a crash); otherwise the
    file is started afresh.
    """

    def __init__(self, path: str, append: bool = False) -> None:
        require_mlperf_logging()
        self.path = path
        self._storage = storage_for(path)
        self._renderer = EventRenderer()
        self._lines: list[str] = []
        if append and self._storage.exists(path):
            self._lines = logtext.lines(logtext.read(path))

    @property
    def events(self) -> list[Event]:
        return parse("\n".join(self._lines), where=self.path)

    def log(
        self,
        kind: LogKind,
        key: str,
        value: Any = None,
        metadata: Mapping[str, Any] | None = None,
        time_ms: int | None = None,
    ) -> None:
        """One training event, mlperf_logging's `kind` of call (``event``, ``start``, ``end``),
        persisted with the rest."""
        if key in EVAL_SECTION_KEYS:
            raise MLLogError(f"{key!r} belongs to the eval section that `rcpflow finalize` writes")
        # depth 2: log <- the trainer's line that logged it
        self._lines.append(self._renderer.render(kind, key, value, metadata, time_ms, 2))
        self._storage.write_atomic(self.path, logtext.encode("\n".join(self._lines) + "\n"))

    def training_header(
        self,
        hp: recipe.Hyperparameters,
        seed: int,
        system: SystemInfo,
        train_samples: int,
        time_ms: int | None = None,
    ) -> None:
        """``cache_clear``, ``init_start``, submission keys, seed and hyperparameters.

        Order matters to the closed-division checker: ``global_batch_size`` must precede the
        keys it derives from it (learning rate, clip norm, generations, eval_accuracy), and
        ``num_prompts_per_step`` must precede ``num_generations_per_prompt``.
        """
        self.log("event", "cache_clear", True, time_ms=time_ms)
        self.log("start", "init_start", time_ms=time_ms)
        for key, value in (
            ("submission_benchmark", recipe.BENCHMARK),
            ("submission_org", system.org),
            ("submission_division", hp.division),
            ("submission_status", system.status),
            ("submission_platform", system.platform),
            ("seed", seed),
            ("global_batch_size", hp.global_batch_size),
            ("num_prompts_per_step", hp.num_prompts_per_step),
            ("num_generations_per_prompt", hp.num_generations_per_prompt),
            ("max_sequence_length", hp.max_sequence_length),
            ("eval_samples", hp.eval_samples),
            ("train_samples", train_samples),
            ("init_checkpoint_step", hp.init_checkpoint_step),
            ("max_steps", hp.max_steps),
            ("opt_name", recipe.OPTIMIZER),
            ("opt_base_learning_rate", hp.learning_rate),
            ("opt_adamw_beta_1", hp.adam_beta_1),
            ("opt_adamw_beta_2", hp.adam_beta_2),
            ("opt_adamw_epsilon", hp.adam_epsilon),
            ("opt_adamw_weight_decay", hp.weight_decay),
            ("opt_gradient_clip_norm", hp.gradient_clip_norm),
            ("opt_learning_rate_warmup_steps", hp.warmup_steps),
            ("opt_learning_rate_decay_schedule", hp.lr_schedule),
            ("generation_training_rollout_temperature", hp.train_temperature),
            ("generation_training_rollout_top_p", hp.train_top_p),
            ("generation_validation_rollout_temperature", hp.eval_temperature),
            ("generation_validation_rollout_top_p", hp.eval_top_p),
            ("gradient_accumulation_steps", system.gradient_accumulation_steps),
            ("lowest_numerical_precision_in_linear", system.precision_linear),
            ("lowest_numerical_precision_in_attn", system.precision_attn),
            ("lowest_numerical_precision_in_comm", system.precision_comm),
            ("tensor_parallelism", system.tensor_parallelism),
            ("pipeline_parallelism", system.pipeline_parallelism),
            ("context_parallelism", system.context_parallelism),
            ("expert_parallelism", system.expert_parallelism),
            ("micro_batch_size", system.micro_batch_size),
            ("config_filename", system.config_filename),
        ):
            self.log("event", key, value, time_ms=time_ms)

    def init_stop(self, time_ms: int | None = None) -> None:
        self.log("end", "init_stop", time_ms=time_ms)

    def run_start(self, time_ms: int | None = None) -> None:
        self.log("start", "run_start", time_ms=time_ms)

    def block_start(self, samples_count: int, step: int, time_ms: int | None = None) -> None:
        self.log(
            "start",
            "block_start",
            metadata={"samples_count": samples_count, "step": step},
            time_ms=time_ms,
        )

    def block_stop(self, samples_count: int, step: int, time_ms: int) -> None:
        """End of training, backdated to the last weight update (`time_ms` is required)."""
        self.log(
            "end",
            "block_stop",
            metadata={"samples_count": samples_count, "step": step},
            time_ms=time_ms,
        )
