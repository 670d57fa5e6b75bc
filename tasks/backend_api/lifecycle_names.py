"""Names of the job lifecycle that outlive a process, in one home: the XCom key of a run task's
job record, the phases the watch trigger's events have, the classpath under which the trigger
is stored in Airflow's database, the grace after a stop request, and the label of a
step's evaluation job. Airflow (or the cluster) stores each of them: renaming one strands a
running task, so `tests/tasks/backend_api/test_lifecycle.py` pins every value; none follows a
module move. (rcpflow has had no release: the names of earlier versions are not read.)"""

from __future__ import annotations

from datetime import timedelta

# XCom key of the record a run task keeps of its cluster job: the backend's reference to it
# plus `RECORD_DECISION` (None until the task decided; see `teardown.should_cancel`) and "why".
JOB_RECORD_KEY = "cluster_job"
RECORD_DECISION = "cancel"

# The phases of the watch trigger's event (one format for every driver:
# `watch_trigger.WatchTrigger.event`).
WATCHING = "watching"  # defer again with the event's ``kwargs``
STOPPED = "stopped"  # the job was cancelled `STOP_GRACE` after the run's stop request
ENDED = "ended"  # the job ended: the event's ``state`` says how (`job_state.JobState`)
# Reasons of a watching event.
UNREACHABLE = "Unreachable"  # the cluster has failed every read for the outage budget
STATE_CHANGED = "StateChanged"  # the watch's state changed: the next defer persists it
STOP_REQUEST = "StopRequest"  # reason of a stopped event

# The classpath of the watch trigger, as it is stored with a deferred task (it names its
# driver by the driver's registered name, `protocol.register`).
WATCH_TRIGGER = "tasks.backend_api.watch_trigger.WatchTrigger"

# How long a job may still run after the run's stop request before it is cancelled: the
# trainer reads the request itself and ends at its next step; this is the net behind it.
STOP_GRACE = timedelta(minutes=10)


# The job label of a run's training (its JobSet's or Slurm job's name has it): a retry, and an
# evaluation that waits for the training's allocation, find the job by it.
TRAIN_LABEL = "train"


def eval_label(step: int) -> str:
    """The job label of `step`'s evaluation in its DAG run: a backend names its job by it, and
    a retry finds the job an earlier try started by that name."""
    return f"eval-{step}"
