"""`JobState`: a cluster job as one read saw it, in the lifecycle's terms, whatever the backend.
Each backend's adapter maps its own read into it (GKE: `gke.status.JobSetStatus.job_state`,
Slurm: `slurm.adapter.job_state`, local: `local_adapter.state`); the watch loop logs its
`line` when it changes (`watch_trigger.WatchTrigger.log_state`). The backend's own read stays
what its trigger events carry (their payloads do not change with this type)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobState:
    """`ended`: the job will not run again by itself (succeeded, failed, cancelled, lost);
    `line`: how the task log states it; `exit_code`: how it exited, where the backend tells
    (None: still running, or no code was recorded or read)."""

    ended: bool
    line: str
    exit_code: int | None = None
