"""Checker verdicts persisted next to what they judged, so a report can be drawn from storage.

A failed task pushes no XCom, and the report must still say *why* a check failed; so each check
task writes its verdict as JSON (``<dir>/checks/<tool>.json``) before it passes or fails, and the
report reads those files back.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rcpflow.files.layout import check_verdict, checks_dir, is_gcs
from rcpflow.files.storage import storage_for

if TYPE_CHECKING:
    from rcpflow.submission.checkers import CheckResult

_OUTPUT_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Verdict:
    tool: str
    ok: bool
    subject: str  # what was checked (a log, a results folder, a submission folder)
    errors: tuple[str, ...]
    returncode: int
    tool_log: str
    output_tail: str
    score_minutes: float | None = None

    def to_json(self) -> str:
        d: dict[str, Any] = {
            "tool": self.tool,
            "ok": self.ok,
            "subject": self.subject,
            "errors": list(self.errors),
            "returncode": self.returncode,
            "tool_log": self.tool_log,
            "output_tail": self.output_tail,
            "score_minutes": self.score_minutes,
        }
        return json.dumps(d, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        d = json.loads(text)
        return cls(
            tool=d["tool"],
            ok=d["ok"],
            subject=d["subject"],
            errors=tuple(d["errors"]),
            returncode=d["returncode"],
            tool_log=d["tool_log"],
            output_tail=d["output_tail"],
            score_minutes=d["score_minutes"],
        )

    def headline(self) -> str:
        if self.ok:
            score = "" if self.score_minutes is None else f", score {self.score_minutes:.4f} min"
            return f"{self.tool}: PASS{score}"
        first = self.errors[0] if self.errors else f"exit status {self.returncode}"
        return f"{self.tool}: FAIL ({first})"


def verdict_path(folder: str, tool: str) -> str:
    return check_verdict(folder, tool)


def tool_log_dir(folder: str) -> str:
    """Where the checkers write their own logs: ``<folder>/checks`` locally; the tools need a
    local folder, so a temporary one for gs:// (the verdict JSON keeps their output's tail)."""
    if is_gcs(folder):
        return tempfile.mkdtemp(prefix="rcpflow-checks-")
    path = checks_dir(folder)
    os.makedirs(path, exist_ok=True)
    return path


def record(result: CheckResult, subject: str, folder: str) -> Verdict:
    """Persist a `rcpflow.submission.checkers.CheckResult` as ``<folder>/checks/<tool>.json``."""
    verdict = Verdict(
        tool=result.tool,
        ok=result.ok,
        subject=subject,
        errors=tuple(result.errors),
        returncode=result.returncode,
        tool_log=result.log_file,
        output_tail=result.output[-_OUTPUT_TAIL_CHARS:],
        score_minutes=result.score_minutes,
    )
    path = verdict_path(folder, result.tool)
    storage_for(path).write_atomic(path, verdict.to_json().encode())
    return verdict


def read_verdict(folder: str, tool: str) -> Verdict | None:
    path = verdict_path(folder, tool)
    storage = storage_for(path)
    if not storage.exists(path):
        return None
    return Verdict.from_json(storage.read_text(path))
