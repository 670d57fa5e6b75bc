"""Measured proportions rows built by hand (`devtools.bench.proportions_bench.ProportionRow`):
three seeds alike, each evaluation's phases stretched as the forecast's machine model says, for
the benches' sections re-rendered from saved measurements."""

from __future__ import annotations

from typing import Any

from devtools.bench import proportions_bench as pb

P = 19  # every seed passes at step 19 (validation from 18)


def seed(number: int, slows: tuple[float, float]) -> pb.SeedRun:
    """A seed evaluated after training, W=1: steps 18 and 19, each phase of the i-th evaluation
    `slows[i]` times its idle length (CPU alone: a task start 3 and 2 s, the job 1 s)."""
    tasks: list[dict[str, Any]] = []
    evaluations: list[list[float]] = []
    t = 10.0 + 60 * 1.85  # training over
    for index, step in enumerate((18, P)):
        slow = slows[index]
        start, eval_start = t + 1.0 * slow, t + 3.0 * slow
        queued = eval_start + 17.0 + 1.0 * slow
        stop = queued + 2.0 * slow
        tasks.append(
            {
                "task_id": "evaluation.checkpoint.wait",
                "map_index": index,
                "state": "success",
                "try_number": 1,
                "pid": None,
                "scheduled_when": None,
                "queued_when": None,
                "start_date": t,
                "end_date": t,
            }
        )
        tasks.append(
            {
                "task_id": "evaluation.checkpoint.evaluate",
                "map_index": index,
                "state": "success",
                "try_number": 1,
                "pid": 7,
                "scheduled_when": None,
                "queued_when": queued,
                "start_date": start,
                "end_date": stop + 0.2,
            }
        )
        evaluations.append([step, eval_start, stop])
        t = stop + 0.5
    return pb.SeedRun(
        seed=number, passing_step=P, start_s=10.0, verdict_s=evaluations[-1][2],
        ideal_s=10.0 + P * 1.85 + 17.0, eval_busy_s=40.0, wasted=0, steps_trained=60,
        task_start_s=[1.0 * slows[0]], free_skips=41, above=41, tasks=tasks,
        updates=[[k, 10.0 + k * 1.85] for k in range(1, 61)], evaluations=evaluations,
    )  # fmt: skip


def row(window: int, runnable: tuple[int, int]) -> pb.ProportionRow:
    """Three seeds alike, the machine's runnable processes `runnable[i]` during the i-th
    evaluation, each phase stretched as the model says on 2 cores."""
    slows = (max(1.0, runnable[0] / 2), max(1.0, runnable[1] / 2))
    seeds = tuple(seed(s, slows) for s in pb.SEEDS)
    second = seeds[0].tasks[2]["end_date"]  # the second evaluation's wait ended
    samples = tuple((float(t), 1.0, runnable[t >= second]) for t in range(300))
    return pb.ProportionRow("after_training", window, seeds, "1, 1, 1", samples)
