"""NeMo-RL's own files, read and verified: its checkpoint tree and its deferred evaluator's log.

The reference implementation (NVIDIA NeMo-RL, ``../shared/reference/nemo-rl.md``) records no
manifest: each checkpoint is a folder ``ROOT/step_<N>/`` (written as ``tmp_step_<N>/`` and
renamed; ``old_step_<N>/`` is a replaced one) holding ``training_info.json`` with
``current_step`` (N), ``consumed_samples`` (prompts, not rollouts) and
``training_step_end_time_ms`` (the weight-update time), and the weights under
``policy/weights/``. Its deferred evaluator keeps no result file: it appends ``eval_start``,
``eval_accuracy`` (pass@4, with ``samples_count``), ``eval_stop`` and its own ``run_stop`` to
the MLLOG it is given. Everything here refuses with one line naming the step, file and field.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from rcpflow.files import jsonio
from rcpflow.files.layout import is_gcs, join
from rcpflow.files.storage import storage_for
from rcpflow.records.mllog import Event, MLLogError, read_given_log

INFO_FILE = "training_info.json"
CONFIG_FILE = "config.yaml"  # the whole run config, written with yaml.safe_dump
CONFIG_MAX_BYTES = 1024 * 1024
WEIGHTS_DIR = ("policy", "weights")
# The keys rcpflow reads from training_info.json, all integers (NeMo-RL makes them plain with
# `.item()`); the others it writes (total_valid_tokens, current_epoch, ...) are not read.
INFO_KEYS = ("current_step", "consumed_samples", "training_step_end_time_ms")
# NeMo-RL's training_info.json is about 200 bytes; the cap keeps a hostile file (/dev/zero, a
# huge one) from exhausting memory in the wait that polls the tree.
INFO_MAX_BYTES = 64 * 1024
# The names NeMo-RL writes (f"step_{N}"): ASCII digits, no leading zero. `\d` would also match
# Unicode digits, and `step_03` would be read as step 3 beside a real `step_3`.
_STEP_DIR = re.compile(r"step_(0|[1-9][0-9]*)")
_PARTIAL_DIR = re.compile(r"(tmp|old)_step_(0|[1-9][0-9]*)")


class NemoRLError(ValueError):
    """A NeMo-RL file that does not add up; the message names the step, the file and the field."""


@dataclass(frozen=True)
class NemoCheckpoint:
    """One committed ``step_<N>/`` as its ``training_info.json`` describes it."""

    step: int
    path: str  # ROOT/step_<N>
    consumed_samples: int
    timestamp_ms: int  # training_step_end_time_ms


@dataclass(frozen=True)
class CheckpointTree:
    """The folders of a checkpoint root: committed steps, and saves that are not checkpoints."""

    root: str
    steps: tuple[int, ...]  # step_<N>/, sorted
    partial: tuple[str, ...]  # tmp_step_<N>/ and old_step_<N>/ names, never checkpoints
    skipped: tuple[str, ...] = ()  # step-like folders that are not read, each with the reason


def checkpoint_root(root: str) -> str:
    return root.rstrip("/") if is_gcs(root) else root.rstrip("/") or "/"


def list_tree(root: str) -> CheckpointTree:
    """The ``step_<N>`` folders under `root` (local or ``gs://``); ``tmp_step_*`` and
    ``old_step_*`` are listed apart and never counted."""
    root = checkpoint_root(root)
    names = storage_for(root).subfolders(root)
    steps: list[int] = []
    skipped: list[str] = []
    for n in names:
        m = _STEP_DIR.fullmatch(n)
        if m is None:
            if n.startswith("step_"):  # step_03, step_\u0663: a stray folder, named, not read
                skipped.append(f"{n!a} (not a step name: step_<N>, N in ASCII digits)")
            continue
        outside = _outside(join(root, n), root)
        if outside:
            skipped.append(f"{n} ({outside})")
            continue
        steps.append(int(m.group(1)))
    partial = tuple(sorted(n for n in names if _PARTIAL_DIR.fullmatch(n)))
    return CheckpointTree(root, tuple(sorted(steps)), partial, tuple(skipped))


def _outside(path: str, inside: str) -> str:
    """Why local `path` does not resolve inside folder `inside` ("" when it does; gs:// has no
    links). A link out of the tree would read another run's (or any) files as this run's."""
    if is_gcs(path):
        return ""
    real, base = os.path.realpath(path), os.path.realpath(inside)
    if real == base or not real.startswith(base.rstrip(os.sep) + os.sep):
        return f"a link to {real}, outside {inside}"
    return ""


def _read_small(path: str, where: str, cap: int = INFO_MAX_BYTES) -> bytes:
    """`path`'s bytes: locally opened without following a link and without blocking (a FIFO),
    a regular file only; at most `cap` bytes (on gs:// checked once read)."""
    too_big = f"{where}: more than {cap} bytes"
    if is_gcs(path):
        try:
            data = storage_for(path).read_bytes(path)
        except FileNotFoundError as e:
            raise NemoRLError(f"{where}: no such file (not a NeMo-RL checkpoint?)") from e
        if len(data) > cap:
            raise NemoRLError(too_big)
        return data
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as e:
        raise NemoRLError(f"{where}: no such file (not a NeMo-RL checkpoint?)") from e
    except OSError as e:
        why = "a symbolic link, not a file" if e.errno == errno.ELOOP else e.strerror
        raise NemoRLError(f"{where}: {why}") from e
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise NemoRLError(f"{where}: a folder, not a file")
        if not stat.S_ISREG(mode):
            raise NemoRLError(f"{where}: not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= cap:
            chunk = os.read(fd, cap + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise NemoRLError(too_big)
        return b"".join(chunks)
    except OSError as e:
        raise NemoRLError(f"{where}: {e.strerror}") from e
    finally:
        os.close(fd)


def step_dir(root: str, step: int) -> str:
    return join(checkpoint_root(root), f"step_{step}")


def read_checkpoint(root: str, step: int, num_prompts_per_step: int) -> NemoCheckpoint:
    """``step_<N>/`` verified: its ``training_info.json`` has the three keys as integers,
    ``current_step`` == N, ``consumed_samples`` == N x `num_prompts_per_step` (NeMo-RL counts
    prompts), a positive timestamp, and ``policy/weights/`` holds something."""
    folder = step_dir(root, step)
    info_path = join(folder, INFO_FILE)
    where = f"step {step}: {info_path}"
    data = _read_small(info_path, where)
    try:
        info = jsonio.load_bytes(data, info_path)
    except jsonio.JSONInputError as e:
        raise NemoRLError(f"step {step}: {e}") from e
    if not isinstance(info, dict):
        raise NemoRLError(f"{where}: not a JSON object")
    for key in INFO_KEYS:
        if key not in info:
            raise NemoRLError(f"{where}: no field {key}")
        value = info[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise NemoRLError(f"{where}: field {key} {value!r} is not an integer")
    if info["current_step"] != step:
        raise NemoRLError(
            f"{where}: field current_step {info['current_step']} is not the folder's step {step}"
        )
    want = step * num_prompts_per_step
    consumed = info["consumed_samples"]
    if consumed != want:
        hint = ""
        if num_prompts_per_step and consumed % num_prompts_per_step == 0:
            hint = f" (a count of rollouts, {consumed // want}x the prompts?)" if want else ""
        raise NemoRLError(
            f"{where}: field consumed_samples {consumed} != step {step} x num_prompts_per_step "
            f"{num_prompts_per_step} = {want} (NeMo-RL counts prompts){hint}"
        )
    ts = info["training_step_end_time_ms"]
    if ts <= 0:
        raise NemoRLError(f"{where}: field training_step_end_time_ms {ts} is not positive")
    weights = join(folder, *WEIGHTS_DIR)
    outside = _outside(weights, folder)
    if outside and os.path.lexists(weights):
        raise NemoRLError(f"step {step}: {weights}/: {outside} (weights must be the step's own)")
    if not storage_for(weights).list(weights):
        raise NemoRLError(f"step {step}: {weights}/: no weights (policy/weights/ is empty)")
    return NemoCheckpoint(step, folder, consumed, ts)


_TOP_KEY = re.compile(r"\S[^:]*:.*")
_KEEP_TOP_K = re.compile(r"\s+keep_top_k:\s*(null|~|[0-9]+)?\s*")


def keep_top_k(root: str, step: int) -> tuple[bool, int | None]:
    """``checkpointing.keep_top_k`` in ``step_<N>/config.yaml`` as NeMo-RL's safe_dump writes it
    (block style, two-space indent): (True, k), (True, None) for null (keeps every
    checkpoint), or (False, None) when the file or the key is not there or not in that shape
    (then nothing can be told). A narrow reader: rcpflow's runtime has no YAML parser."""
    path = join(step_dir(root, step), CONFIG_FILE)
    try:
        text = _read_small(path, f"step {step}: {path}", CONFIG_MAX_BYTES).decode("utf-8")
    except (NemoRLError, UnicodeDecodeError):
        return False, None
    inside = False
    for line in text.splitlines():
        if _TOP_KEY.fullmatch(line):
            inside = line.rstrip() == "checkpointing:"
        elif inside and (m := _KEEP_TOP_K.fullmatch(line)):
            value = m.group(1)
            return True, int(value) if value and value.isdigit() else None
    return False, None


def check_order(
    checkpoints: Sequence[NemoCheckpoint], run_start: int, block_stop: int | None, root: str
) -> None:
    """Timestamps increase with the step, after `run_start` and not after the training's
    `block_stop` (the last weight update)."""
    prev: NemoCheckpoint | None = None
    for c in sorted(checkpoints, key=lambda c: c.step):
        where = f"step {c.step}: {join(c.path, INFO_FILE)}: field training_step_end_time_ms"
        if c.timestamp_ms < run_start:
            raise NemoRLError(
                f"{where} {c.timestamp_ms} is before the MLLOG's run_start {run_start} (a "
                "checkpoint of an earlier run?)"
            )
        if block_stop is not None and c.timestamp_ms > block_stop:
            raise NemoRLError(
                f"{where} {c.timestamp_ms} is after the training's block_stop {block_stop} "
                "(the last weight update)"
            )
        if prev is not None and c.timestamp_ms <= prev.timestamp_ms:
            raise NemoRLError(
                f"{where} {c.timestamp_ms} is not after step {prev.step}'s {prev.timestamp_ms} "
                f"(timestamps must increase with the step; {root})"
            )
        prev = c


def training_block_stop(events: Sequence[Event], run_start_line: int) -> int | None:
    """The time of the training's last ``block_stop`` after run_start (NeMo-RL's driver
    backdates it to the last weight update), None while training runs."""
    stops = [e for e in events if e.key == "block_stop" and e.line_no > run_start_line]
    return stops[-1].time_ms if stops else None


@dataclass(frozen=True)
class LoggedEval:
    """What NeMo-RL's deferred evaluator logged for one checkpoint."""

    samples_count: int
    accuracy: float
    eval_start_ms: int
    eval_stop_ms: int
    accuracy_line: int
    eval_samples: int | None  # the log's own eval_samples (None: not in this log)


def logged_eval(log_path: str, samples_count: int, step: int) -> LoggedEval:
    """The ``eval_accuracy`` whose ``samples_count`` is `samples_count` in the evaluator's log,
    with the ``eval_start``/``eval_stop`` of the same samples_count. Another samples_count only,
    none, two, or a value that is not a number in [0, 1] is refused, named. Everything else in
    the log (its own ``run_stop``, decided with ``>=``) is ignored."""
    try:
        events = read_given_log(log_path, "the evaluator's log")
    except MLLogError as e:
        raise NemoRLError(str(e)) from e
    accuracies = [e for e in events if e.key == "eval_accuracy"]
    mine = [e for e in accuracies if e.metadata.get("samples_count") == samples_count]
    where = f"{log_path}: step {step}"
    if not mine:
        others = sorted({str(e.metadata.get("samples_count")) for e in accuracies})
        seen = f"only samples_count {', '.join(others)}" if others else "none at all"
        raise NemoRLError(
            f"{where}: no eval_accuracy with samples_count {samples_count} ({seen}): not this "
            "checkpoint's evaluation"
        )
    if len(mine) > 1:
        lines = ", ".join(str(e.line_no) for e in mine)
        raise NemoRLError(
            f"{where}: {len(mine)} eval_accuracy with samples_count {samples_count} (lines "
            f"{lines}); which one is it?"
        )
    acc = mine[0]
    value = acc.value
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.0 <= value <= 1.0
    ):
        raise NemoRLError(
            f"{where}: eval_accuracy (line {acc.line_no}) value {value!r} is not a number in [0, 1]"
        )
    times = {}
    for key in ("eval_start", "eval_stop"):
        found = [
            e for e in events if e.key == key and e.metadata.get("samples_count") == samples_count
        ]
        if len(found) != 1:
            raise NemoRLError(
                f"{where}: {len(found)} {key} with samples_count {samples_count}; exactly one "
                "gives the eval time"
            )
        times[key] = found[0].time_ms
    if times["eval_stop"] < times["eval_start"]:
        raise NemoRLError(
            f"{where}: eval_stop {times['eval_stop']} is before eval_start {times['eval_start']}"
        )
    return LoggedEval(
        samples_count,
        float(value),
        times["eval_start"],
        times["eval_stop"],
        acc.line_no,
        logged_eval_samples(events, log_path),
    )


def logged_eval_samples(events: Sequence[Event], log_path: str) -> int | None:
    """The log's ``eval_samples`` (how many instances an evaluation covers); None when the log
    has none, refused when it has two values or one that is not a positive integer."""
    values = {repr(e.value): e for e in events if e.key == "eval_samples"}
    if not values:
        return None
    if len(values) > 1:
        raise NemoRLError(f"{log_path}: eval_samples logged with values {', '.join(values)}")
    (e,) = values.values()
    if isinstance(e.value, bool) or not isinstance(e.value, int) or e.value <= 0:
        raise NemoRLError(f"{log_path}: eval_samples (line {e.line_no}) {e.value!r} is not a count")
    return e.value


@dataclass(frozen=True)
class DriverRunStop:
    """A ``run_stop`` that rcpflow's finalize did not write (NeMo-RL's driver's)."""

    line_no: int
    status: object
    samples_count: object
    time_ms: int

    def describe(self) -> str:
        return (
            f"run_stop (line {self.line_no}, status {self.status}, samples_count "
            f"{self.samples_count}) written by another program (NeMo-RL's deferred evaluator?)"
        )

    def refusal(self, log_path: str, run_dir: str) -> str:
        """Why finalize (and an eval import of a step it decides) refuses the log: rcpflow never
        rewrites another program's run_stop, and --reopen does not change that."""
        return (
            f"{log_path}: {self.describe()}: finalize writes a run's only run_stop, with the "
            "checker's strict > and in step order, and never keeps another's; give the run a "
            f"log without it: `rcpflow run reset {run_dir}` and train again, or a clean copy of "
            "the training section"
        )


# The call site the official logger records for finalize's own events (repository-relative).
FINALIZE_FILES = frozenset({"rcpflow/verdict/finalize.py", "rcpflow/finalize.py"})


def foreign_run_stops(events: Sequence[Event]) -> list[DriverRunStop]:
    """``run_stop`` events whose call site is not rcpflow's finalize."""
    return [
        DriverRunStop(
            e.line_no, e.metadata.get("status"), e.metadata.get("samples_count"), e.time_ms
        )
        for e in events
        if e.key == "run_stop" and e.metadata.get("file") not in FINALIZE_FILES
    ]
