"""The ``run_stop`` a run's MLLOG already holds: which steps a written verdict depends on.

A run_stop at step N was decided from the summaries of every step up to N; `eval import` onto
one of them is refused unless reopened, and `rcpflow status` says when the next finalize would
rewrite a written verdict (docs/design.md, finalize).
"""

from __future__ import annotations

from dataclasses import dataclass

from rcpflow.records.manifest import ManifestRow
from rcpflow.records.mllog import read_events


@dataclass(frozen=True)
class WrittenRunStop:
    log_path: str
    line_no: int
    status: str
    step: int | None  # None: the run_stop states no usable samples_count (then every step counts)

    def describe(self) -> str:
        at = f"step {self.step}" if self.step is not None else "an unknown step"
        return f"{self.log_path} line {self.line_no}: run_stop status={self.status} at {at}"

    def depends_on(self, step: int) -> bool:
        return self.step is None or step <= self.step


def written_run_stop(log_path: str, row: ManifestRow) -> WrittenRunStop | None:
    """The last run_stop in `log_path` (the run of `row`), if any. An unreadable log raises
    `MLLogError`; a missing one is None."""
    try:
        events = read_events(log_path)
    except FileNotFoundError:
        return None
    stops = [e for e in events if e.key == "run_stop"]
    if not stops:
        return None
    stop = stops[-1]
    samples = stop.metadata.get("samples_count")
    step = (
        samples // row.global_batch_size
        if isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0
        else None
    )
    return WrittenRunStop(log_path, stop.line_no, str(stop.metadata.get("status")), step)
