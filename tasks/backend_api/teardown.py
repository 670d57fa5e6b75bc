"""The cancel and teardown rules every cluster backend follows (docs/design.md: never kill a
running training because the cluster did not answer; cancel what a verdict made useless; clean
up in a teardown). The run task records which cluster job it is about to create, before
creating it, and then what became of it: ``{"name", ..., "delete", "why"}``, `delete` None
(pending) until the task itself decided."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def should_delete(recorded: Mapping[str, Any], key: str = "delete") -> tuple[bool, str]:
    """Whether the teardown deletes (cancels) a cluster job the run task recorded, and why;
    `key` names the record's decision (GKE ``delete``, Slurm ``cancel``)."""
    if recorded.get(key) is None:
        return True, "the run task ended without deciding (marked by hand, or timed out)"
    return bool(recorded[key]), str(recorded["why"])
