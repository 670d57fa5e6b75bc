"""The official MLPerf checkers from `mlperf_logging`, run as subprocesses, as structured verdicts.

Compliance, RCP and package checkers and the result summarizer, each run as
``sys.executable -m mlperf_logging.<tool>`` (never a shell) in `log_dir`, with ``gs://`` inputs
copied there first. Each tool's own success rule, as measured: docs/design.md (the checkers).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.files.captured import run_captured
from rcpflow.files.layout import is_gcs
from rcpflow.files.storage import storage_for
from rcpflow.recipe import DIVISIONS

USAGE = "training"
DEFAULT_TIMEOUT_S = 600.0
PACKAGE_SUCCESS_LINE = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !"
TIMEOUT_RETURNCODE = 124  # as timeout(1) reports it

# The tools log through `logging` with this format (see each tool's __main__).
_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) - ?(.*)$")
_MESSAGE_SEPARATOR = "-" * 30


@dataclass(frozen=True)
class CheckResult:
    """What one run of one official tool said.

    `errors` are the tool's complaints, one line each (empty when `ok`); `output` is everything
    it printed; `log_file` is the log it wrote (for the summarizer: its captured output).
    `score_minutes` is set by `result_summary` only.
    """

    tool: str
    ok: bool
    returncode: int
    command: tuple[str, ...]
    log_file: str
    output: str
    errors: tuple[str, ...]
    score_minutes: float | None = None


def _log_dir(log_dir: str | None) -> str:
    if log_dir is None:
        return tempfile.mkdtemp(prefix="rcpflow-check-")
    if is_gcs(log_dir):
        raise ValueError(f"log_dir must be a local folder, not {log_dir!r}")
    path = os.path.abspath(log_dir)
    os.makedirs(path, exist_ok=True)
    return path


def _local(path: str, log_dir: str) -> str:
    """`path` itself if local, else a copy of the gs:// file or folder under `log_dir`/input."""
    if not is_gcs(path):
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        return os.path.abspath(path)
    storage = storage_for(path)
    target = os.path.join(log_dir, "input", path[len("gs://") :].rstrip("/"))
    if storage.exists(path):
        files = {path: target}
    else:
        root = path.rstrip("/")
        files = {p: os.path.join(target, p[len(root) + 1 :]) for p in storage.list(root)}
        if not files:
            raise FileNotFoundError(path)
    for src, dst in files.items():
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(storage.read_bytes(src))
    return target


def _fresh(path: str) -> str:
    # The tools open their logs in append mode (logging.basicConfig): start each run clean so
    # a log file holds this run only.
    if os.path.exists(path):
        os.unlink(path)
    return path


def _run(args: list[str], cwd: str, timeout_s: float) -> tuple[int, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # keep print() and logging in order
    try:
        proc = run_captured(args, cwd=cwd, env=env, timeout_s=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if e.stdout else ""
        return TIMEOUT_RETURNCODE, out + f"\nrcpflow: timed out after {timeout_s:.0f}s\n"
    return proc.returncode, proc.stdout.decode(errors="replace")


def _records(output: str) -> list[tuple[str, str]]:
    """(level, text) of each logging record; continuation lines stay with their record."""
    records: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        m = _RECORD.match(line)
        if m:
            records.append((m.group(1), [m.group(2).strip()]))
        elif records:
            records[-1][1].append(line)
        else:
            records.append(("PRINT", [line]))
    return [(level, "\n".join(lines)) for level, lines in records]


def _summarize_message(message: str) -> str:
    """One line for one compliance message: its headline and the failed test, not the dumps."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    head = lines[0]
    failed = [ln for ln in lines[1:] if ln.startswith("failed test:")]
    if head.startswith("CHECK for") and len(lines) > 1:
        head = f"{head} {lines[1]}"  # the offending log line
    return " | ".join([head, *failed])


def _traceback_error(output: str) -> list[str]:
    if "Traceback (most recent call last):" not in output:
        return []
    last = [ln for ln in output.splitlines() if ln.strip()][-1]
    return [f"crashed: {last.strip()}"]


def _errors(output: str, ignore: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The complaints in a tool's output: WARNING/ERROR records (compliance message blocks split
    per message, parse errors joined with their line) and a crash's exception line."""
    errors: list[str] = []
    pending_parse_line: str | None = None
    for level, text in _records(output):
        if level not in ("WARNING", "ERROR", "CRITICAL"):
            continue
        if text.startswith("^^"):
            errors.append(f"unparsable log line {pending_parse_line!r}: {text[2:].strip()}")
            pending_parse_line = None
            continue
        if text == "Found parsing errors:":
            continue
        if level == "WARNING" and text.startswith(":::MLLOG"):
            pending_parse_line = text
            continue
        for message in text.split(_MESSAGE_SEPARATOR):
            summary = _summarize_message(message)
            if summary and summary not in ignore:
                errors.append(summary)
    errors.extend(_traceback_error(output))
    return tuple(dict.fromkeys(errors))  # in order, without repeats


def _declared_division(log_file: str) -> str | None:
    from mlperf_logging.compliance_checker import mlp_parser

    loglines, _ = mlp_parser.parse_file(log_file, ruleset=recipe.RULESET)
    declared = [ll.value["value"] for ll in loglines if ll.key == "submission_division"]
    return declared[0] if declared else None


def _tool(name: str) -> list[str]:
    return [sys.executable, "-m", f"mlperf_logging.{name}"]


def compliance(
    log_path: str,
    division: str = "closed",
    log_dir: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> CheckResult:
    """The compliance checker (ruleset 6.1.0) on one MLLOG, for the given division."""
    if division not in DIVISIONS:
        raise ValueError(f"division must be one of {DIVISIONS}, not {division!r}")
    log_dir = _log_dir(log_dir)
    local = _local(log_path, log_dir)
    tool_log = _fresh(os.path.join(log_dir, f"compliance_{os.path.basename(local)}.log"))
    args = [
        *_tool("compliance_checker"),
        "--usage", USAGE,
        "--ruleset", recipe.RULESET,
        "--log_output", tool_log,
        local,
    ]  # fmt: skip
    returncode, output = _run(args, log_dir, timeout_s)
    ok = returncode == 0 and re.search(r"^INFO - SUCCESS$", output, re.MULTILINE) is not None
    errors = list(_errors(output, ignore=("FAILED",))) if not ok else []
    declared = _declared_division(local)
    if declared != division:
        ok = False
        errors.append(
            f"{log_path}: submission_division is {declared!r}, but the {division!r} rules "
            "were asked for"
        )
    return CheckResult(
        "compliance_checker", ok, returncode, tuple(args), tool_log, output, tuple(errors)
    )


def rcp(
    results_dir: str, log_dir: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> CheckResult:
    """The RCP checker (6.1.0 reference points) on a folder of ``result_*.txt`` files."""
    log_dir = _log_dir(log_dir)
    local = _local(results_dir, log_dir)
    tool_log = _fresh(os.path.join(log_dir, "rcp_checker.log"))
    args = [
        *_tool("rcp_checker"),
        "--rcp_usage", USAGE,
        "--rcp_version", recipe.RULESET,
        "--log_output", tool_log,
        local,
    ]  # fmt: skip
    returncode, output = _run(args, log_dir, timeout_s)
    ok = returncode == 0 and "RCP test PASSED" in output
    errors = _errors(output) if not ok else ()
    return CheckResult("rcp_checker", ok, returncode, tuple(args), tool_log, output, errors)


def package(
    org_dir: str, log_dir: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> CheckResult:
    """The package checker on a submission folder (``results/``, ``systems/``, ``benchmarks/``).

    It always exits 0; `ok` is whether it printed its success line.
    """
    log_dir = _log_dir(log_dir)
    local = _local(org_dir, log_dir)
    tool_log = _fresh(os.path.join(log_dir, "package_checker.log"))
    args = [*_tool("package_checker"), local, USAGE, recipe.RULESET, "--log_output", tool_log]
    returncode, output = _run(args, log_dir, timeout_s)
    ok = returncode == 0 and f"INFO - {PACKAGE_SUCCESS_LINE}" in output.splitlines()
    errors = _errors(output) if not ok else ()
    return CheckResult("package_checker", ok, returncode, tuple(args), tool_log, output, errors)


def _summarizer_score(summary_json: str) -> tuple[float | None, list[str]]:
    if not os.path.exists(summary_json):
        return None, [f"the result summarizer wrote no {os.path.basename(summary_json)}"]
    with open(summary_json) as f:
        rows = json.load(f)
    scores = [row.get(recipe.BENCHMARK) for row in rows]
    if len(scores) != 1:
        return None, [f"expected one system in the summary, found {len(scores)}"]
    score = scores[0]
    if not isinstance(score, int | float) or math.isnan(score):
        return None, [f"no {recipe.BENCHMARK} score (too many runs did not converge?)"]
    return float(score), []


def result_summary(
    org_dir: str, log_dir: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> CheckResult:
    """The result summarizer on a submission folder, with its score parsed: the olympic mean
    of the runs' time to train, in minutes (`score_minutes`)."""
    log_dir = _log_dir(log_dir)
    local = _local(org_dir, log_dir)
    csv_path = _fresh(os.path.join(log_dir, "result_summary.csv"))
    summary_json = _fresh(os.path.join(log_dir, "result_summary.json"))
    for stale in ("result_summary_detailed.csv", "result_summary_detailed.json"):
        _fresh(os.path.join(log_dir, stale))
    args = [*_tool("result_summarizer"), local, USAGE, recipe.RULESET, "--csv", csv_path]
    returncode, output = _run(args, log_dir, timeout_s)
    tool_log = os.path.join(log_dir, "result_summarizer.log")
    with open(tool_log, "w") as f:
        f.write(output)
    score, problems = _summarizer_score(summary_json) if returncode == 0 else (None, [])
    ok = returncode == 0 and score is not None
    errors: list[str] = []
    if not ok:
        # The summarizer prints its complaints (no logging format): keep the lines that say so.
        errors = [
            ln.strip()
            for ln in output.splitlines()
            if re.search(r"ERROR|failed|Dropping|not recorded", ln)
        ]
        errors += problems + _traceback_error(output)
    return CheckResult(
        "result_summarizer",
        ok,
        returncode,
        tuple(args),
        tool_log,
        output,
        tuple(dict.fromkeys(errors)),
        score,
    )
