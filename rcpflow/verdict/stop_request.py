"""The stop request: how the orchestrator tells a trainer that its run's verdict is decided.

With evaluation during training, the verdict can be known before ``max_steps``: a checkpoint
passes the target and every lower one was evaluated below it. Then `request_stop` writes
``<run_dir>/stop_request.json``, and the trainer, which checks `stop_requested` after each
step, ends cleanly (queued saves finished, rows written, ``block_stop`` at its last update).

What keeps a stop request safe:
- it is written only when the run's persisted summaries decide success (`decided_step`, the
  same walk as finalize's); anything else (a missing, invalid or unreadable summary below the
  passing step, no pass yet) writes nothing;
- it names the run (`rcpflow.records.run_identity.RunIdentity`: seed, batch size, validation start,
  max_steps and the MLLOG's ``run_start``), so a trainer of another run in the same folder
  ignores it;
- it names the passing step and its weight-update time, which the trainer must have committed:
  a stop never comes before the checkpoint that decided the run is recorded;
- writing it again gives the same bytes (idempotent), and a malformed file is never a stop.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass

from rcpflow.files import jsonio
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import read_if_present, storage_for
from rcpflow.records.manifest import ManifestError, ManifestRow, load
from rcpflow.records.mllog import MLLogError, read_events, run_start_ms
from rcpflow.records.run_identity import RunIdentity
from rcpflow.verdict.finalize import FinalizeInputError, decide

log = logging.getLogger(__name__)

# The file's format id, a literal that never follows a module move (a trainer started before an
# upgrade reads the request the upgraded orchestrator writes). Written: the id of the previous
# release, whose trainers read only it. Read as well: the id the releases before that wrote (it
# changed once, with a module move), so a trainer resuming a run finds their request too.
FORMAT = "rcpflow.verdict.stop_request.v1"
OLDER_FORMATS = ("rcpflow.stop_request.v1",)
READ_FORMATS = (FORMAT, *OLDER_FORMATS)


class StopRequestError(ValueError):
    """A stop request file is not one this module wrote; the message names the field."""


@dataclass(frozen=True)
class StopRequest:
    run: RunIdentity
    step: int  # the first passing checkpoint
    timestamp_ms: int  # its weight-update time (the run_stop finalize will write)
    reason: str

    def to_json(self) -> bytes:
        d = {"format": FORMAT, **asdict(self)}
        return (json.dumps(d, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> StopRequest:
        """Parse a stop request; StopRequestError naming the field when it is not one."""
        try:
            d = jsonio.load_bytes(data, where)  # depth-limited, strict: never a RecursionError
        except jsonio.JSONInputError as exc:
            raise StopRequestError(str(exc)) from exc
        if not isinstance(d, dict) or d.get("format") not in READ_FORMATS:
            raise StopRequestError(f"{where}: format is not one of {READ_FORMATS}")
        run = d.get("run")
        if not isinstance(run, dict) or set(run) != set(RunIdentity.__dataclass_fields__):
            raise StopRequestError(
                f"{where}: run must name {sorted(RunIdentity.__dataclass_fields__)}"
            )
        for key, value in [
            *run.items(),
            ("step", d.get("step")),
            ("timestamp_ms", d.get("timestamp_ms")),
        ]:
            if value is None and key == "run_start_ms":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise StopRequestError(f"{where}: {key} {value!r} is not an integer")
        if not isinstance(d.get("reason"), str):
            raise StopRequestError(f"{where}: reason is not a string")
        return cls(
            run=RunIdentity(**run),
            step=d["step"],
            timestamp_ms=d["timestamp_ms"],
            reason=d["reason"],
        )


def read(run_dir: str) -> StopRequest | None:
    """The stop request in `run_dir`, if there is one; StopRequestError when it is malformed."""
    path = RunLayout(run_dir).stop_request
    data = read_if_present(path)
    if data is None:
        return None
    return StopRequest.from_json(data, path)


# Problems already reported by `for_run`: a trainer asks after every step, and one bad file
# must not fill its log.
_REPORTED: set[str] = set()
_REPORTED_LOCK = threading.Lock()


def _warn_once(message: str) -> None:
    with _REPORTED_LOCK:
        if message in _REPORTED:
            return
        _REPORTED.add(message)
    log.warning("%s", message)


def for_run(run_dir: str, identity: RunIdentity) -> StopRequest | None:
    """The stop request in `run_dir` if it names this run; another run's or a malformed one is
    None (reported once): never a reason to stop. Never raises into the trainer: a file that
    cannot be read (a folder, too deep, storage down) is no stop either. Costs one existence
    check when there is none."""
    try:
        request = read(run_dir)
    except StopRequestError as exc:
        _warn_once(f"ignoring the stop request: {exc}")
        return None
    except Exception as exc:  # whatever reading raises, the trainer goes on
        what = " ".join(str(exc).split()) or type(exc).__name__
        _warn_once(f"ignoring the stop request in {run_dir}: {type(exc).__name__}: {what}")
        return None
    if request is None:
        return None
    if request.run != identity:
        _warn_once(
            f"ignoring the stop request in {run_dir}: it is for run {request.run}, not this "
            f"one {identity}"
        )
        return None
    return request


def decided_step(run_dir: str, rows: tuple[ManifestRow, ...]) -> ManifestRow | None:
    """The row of the first passing checkpoint when the persisted summaries decide success
    (every lower row has a valid summary below the target), else None."""
    try:
        verdict = decide(run_dir, rows)
    except FinalizeInputError as exc:  # an unreadable summary decides nothing
        log.info("verdict not decided: %s", exc)
        return None
    return verdict.end_row if verdict.status == "success" else None


def request_stop(run_dir: str) -> StopRequest | None:
    """Write the stop request if the run's verdict is decided; returns it (the one already
    there when it is for this run: same bytes), or None when nothing is decided (nothing
    written). A request left by another run in the folder is replaced."""
    layout = RunLayout(run_dir)
    try:
        manifest = load(layout.manifest)
    except ManifestError as exc:
        log.info("verdict not decided: %s", exc)
        return None
    if not manifest.rows:
        return None
    passed = decided_step(run_dir, manifest.rows)
    if passed is None:
        return None
    try:
        start = run_start_ms(read_events(passed.mllog_file))
    except (FileNotFoundError, MLLogError):
        start = None
    request = StopRequest(
        run=RunIdentity.of_row(passed, start),
        step=passed.step,
        timestamp_ms=passed.timestamp_ms,
        reason=f"step {passed.step} passed the target and every lower step was evaluated below it",
    )

    def keep_or_write(current: bytes | None) -> bytes:
        if current is not None:
            try:
                if StopRequest.from_json(current, layout.stop_request).run == request.run:
                    return current
            except StopRequestError:
                pass  # not a request: ours replaces it
        return request.to_json()

    written = storage_for(layout.stop_request).update(layout.stop_request, keep_or_write)
    return StopRequest.from_json(written, layout.stop_request)


def honoured_by(run_dir: str, rows: tuple[ManifestRow, ...]) -> StopRequest | None:
    """The stop request that explains a run whose rows end before max_steps: one for this run
    (identity from its rows and MLLOG) naming one of `rows` with its weight-update time."""
    if not rows:
        return None
    try:
        start = run_start_ms(read_events(rows[0].mllog_file))
    except (FileNotFoundError, MLLogError):
        start = None
    request = for_run(run_dir, RunIdentity.of_row(rows[0], start))
    if request is None:
        return None
    by_step = {r.step: r for r in rows}
    row = by_step.get(request.step)
    return request if row is not None and row.timestamp_ms == request.timestamp_ms else None


def current(run_dir: str) -> StopRequest | None:
    """The stop request that stands for the run now in `run_dir` (`honoured_by` its current
    manifest rows), if any: what an orchestrator may act on when the trainer does not."""
    try:
        rows = load(RunLayout(run_dir).manifest).rows
    except ManifestError:
        return None
    return honoured_by(run_dir, rows)
