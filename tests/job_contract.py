"""The job contract's table in docs/exit-codes.md, which each backend's tests check its policy
against: per exit code (or "other"), what the backend does, in the table's words."""

from __future__ import annotations

import re

from repo_paths import REPO


def documented_actions(backend: str) -> dict[str, str]:
    """The `backend` column ("GKE", "Slurm") of the table: code (or "other") -> its words
    ("success", "restart, counted", ...)."""
    text = (REPO / "docs" / "exit-codes.md").read_text()
    section = text.split("## The job contract", 1)[1].split("\n## ", 1)[0]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|")
    ]
    header = rows[0]
    assert backend in header, header
    assert all(len(row) == len(header) for row in rows), rows  # no "|" inside a cell
    column = header.index(backend)
    return {row[0]: row[column] for row in rows if re.fullmatch(r"\d+|other", row[0])}
