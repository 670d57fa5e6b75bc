"""What to tell a user who gave the CLI a path that is not the kind it expects: a run folder
(one that holds ``mllog/``), a manifest or an MLLOG.

Each check returns one line, ``<path>: <what it is>; <what to do>`` (a missing path, a file
where a folder belongs, a submission folder or a folder of runs where a run belongs, a folder
inside a run), or None when the path may be what is expected and the command's own checks
follow. Suggested paths are written as the user wrote theirs (relative stays relative).
Local paths only: a ``gs://`` prefix is not a folder that exists or not, so it gets no hint.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from rcpflow.files.layout import MANIFEST_NAME, MLLOG_DIR, RunLayout, is_gcs

_SEED = re.compile(r"seed_(\d+)")
_RUN_FOLDER = "a run folder holds mllog/"


def _shown(given: str, path: str) -> str:
    return path if os.path.isabs(given) else os.path.relpath(path)


def _is_run(path: str) -> bool:
    return os.path.isdir(path) and os.path.exists(RunLayout(path).mllog_dir)


def _order(name: str) -> tuple[int, str]:
    m = _SEED.fullmatch(name)
    return (int(m.group(1)) if m else -1, name)


def _runs_in(folder: str) -> list[str]:
    """The run folders directly in `folder`, seed_1 before seed_2 before seed_10."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    paths = [os.path.join(folder, n) for n in sorted(names, key=_order)]
    return [p for p in paths if _is_run(p)]


def _enclosing_run(path: str) -> str | None:
    """The run folder `path` is inside of (not `path` itself), if any."""
    parent = os.path.dirname(path)
    while parent != path:
        if _is_run(parent):
            return parent
        path, parent = parent, os.path.dirname(parent)
    return None


def _did_you_mean(given: str, candidates: list[str], tail: tuple[str, ...] = ()) -> str:
    """``did you mean A (or B, C)?``: A in full, the others by their run folder's name."""
    first = _shown(given, os.path.join(candidates[0], *tail))
    others = [os.path.basename(c) for c in candidates[1:]]
    return f"did you mean {first}" + (f" (or {', '.join(others)})" if others else "") + "?"


def _runs_below(path: str) -> tuple[str, list[str]] | None:
    """What `path` is when it holds runs: a submission folder (``runs/seed_N``) or a folder of
    runs, with the runs."""
    runs = _runs_in(os.path.join(path, "runs"))
    if runs:
        return "a submission folder", runs
    runs = _runs_in(path)
    if runs:
        return "a folder of runs", runs
    return None


def _why_missing(given: str, path: str) -> str:
    """`` (<file> is a file, not a folder)`` when a missing `path` lies below a file."""
    parent = os.path.dirname(path)
    while parent != path and not os.path.lexists(parent):
        path, parent = parent, os.path.dirname(parent)
    if os.path.lexists(parent) and not os.path.isdir(parent):
        return f" ({_shown(given, parent)} is a file, not a folder)"
    return ""


def run_dir_problem(given: str) -> str | None:
    """Why `given` cannot be a run folder, with what to give instead; None if it may be one."""
    if not given or is_gcs(given):
        return None
    path = os.path.abspath(given)
    if _is_run(path):
        return None
    if not os.path.lexists(path):
        runs = _runs_in(os.path.dirname(path))
        hint = _did_you_mean(given, runs) if runs else f"give a run folder ({_RUN_FOLDER})"
        return f"{given}: does not exist{_why_missing(given, path)}; {hint}"
    run = _enclosing_run(path)
    if not os.path.isdir(path):
        if run is not None:
            mean = f"did you mean {_shown(given, run)} (the run folder it is in)?"
            return f"{given}: is a file, not a run folder; {mean}"
        return f"{given}: is a file, not a run folder ({_RUN_FOLDER})"
    if run is not None:
        mean = f"did you mean {_shown(given, run)}?"
        return f"{given}: is a folder inside a run, not a run folder; {mean}"
    below = _runs_below(path)
    if below is not None:
        kind, runs = below
        return f"{given}: is {kind}, not a run folder; {_did_you_mean(given, runs)}"
    return None


def _file_problem(given: str, what: str, pick: Callable[[str], str]) -> str | None:
    """Why `given` cannot be `what`, a file of a run's ``mllog/`` folder that `pick` names."""
    if not given or is_gcs(given):
        return None
    path = os.path.abspath(given)
    if not os.path.lexists(path):
        return f"{given}: does not exist{_why_missing(given, path)}; give {what}"
    if not os.path.isdir(path):
        return None
    if os.path.basename(path) == MLLOG_DIR and _is_run(os.path.dirname(path)):
        mean = _shown(given, os.path.join(path, pick(path)))
        return f"{given}: is a run's mllog folder, not {what}; did you mean {mean}?"
    if _is_run(path):
        mllog = RunLayout(path).mllog_dir
        mean = _shown(given, os.path.join(mllog, pick(mllog)))
        return f"{given}: is a run folder, not {what}; did you mean {mean}?"
    below = _runs_below(path)
    if below is not None:
        kind, runs = below
        tail = (MLLOG_DIR, pick(RunLayout(runs[0]).mllog_dir))
        return f"{given}: is {kind}, not {what}; {_did_you_mean(given, runs, tail)}"
    return None


def _first_log(mllog: str) -> str:
    """The lowest seed's ``seed_<n>.out`` in `mllog` (a placeholder when there is none)."""
    try:
        names = [n for n in os.listdir(mllog) if _SEED.fullmatch(n.removesuffix(".out"))]
    except OSError:
        names = []
    logs = sorted((n for n in names if n.endswith(".out")), key=lambda n: _order(n[:-4]))
    return logs[0] if logs else "seed_<n>.out"


def manifest_problem(given: str) -> str | None:
    """Why `given` cannot be a manifest (``RUN_DIR/mllog/eval_checkpoints.jsonl``), or None."""
    what = f"a manifest (RUN_DIR/mllog/{MANIFEST_NAME})"
    return _file_problem(given, what, lambda _mllog: MANIFEST_NAME)


def log_problem(given: str) -> str | None:
    """Why `given` cannot be an MLLOG (``RUN_DIR/mllog/seed_<n>.out``), or None."""
    return _file_problem(given, "an MLLOG (RUN_DIR/mllog/seed_<n>.out)", _first_log)
