"""Evaluation records in the foreign formats `rcpflow eval import` reads (DeepSWE attempt
records, R2E-Gym trajectories, Tunix summaries), shared by the import tests of tests/rcpflow."""

from __future__ import annotations

import json
from pathlib import Path

from devtools.synthetic_run import T0

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tunix"
SCHEMA = "canon.p46.deepswe-eval.trajectory.v4"
START, STOP = T0 + 3_600_000, T0 + 3_700_000


def solved_pattern(task: int) -> list[bool]:
    """Task i: samples solved by a fixed pattern (0..4 of the 4), 150 tasks solved at least once."""
    if task >= 150:
        return [False] * 4
    return [s < 1 + task % 4 for s in range(4)]


def deepswe_lines(tasks: range = range(251), retried: frozenset[int] = frozenset()) -> list[str]:
    """DeepSWE records; for tasks in `retried`, sample 0 first failed on infrastructure."""
    lines = []
    for t in tasks:
        image = f"r2e/task_{t:03d}:latest"
        for s, solved in enumerate(solved_pattern(t)):
            base = {
                "schema": SCHEMA,
                "task_key": image,
                "instance_id": f"task_{t:03d}",
                "docker_image": image,
                "sample_index": s,
                "elapsed_secs": 12.5,
                "trajectory": [],
            }
            if s == 0 and t in retried:
                lines.append(
                    json.dumps(
                        base
                        | {
                            "attempt_index": 0,
                            "status": "SANDBOX_ERROR",
                            "reward": 0.0,
                            "solved": False,
                            "valid": False,
                            "validity_reason": "pod lost",
                        }
                    )
                )
            status = "SUCCEEDED" if solved or s % 2 else "MAX_CONTEXT_LIMIT_REACHED"
            lines.append(
                json.dumps(
                    base
                    | {
                        "attempt_index": 1 if t in retried and s == 0 else 0,
                        "status": status,
                        "reward": 1.0 if solved else 0.0,
                        "solved": solved,
                        "valid": True,
                        "validity_reason": None,
                    }
                )
            )
    return lines


def r2egym_lines(retried: frozenset[int] = frozenset()) -> list[str]:
    lines = []
    for t in range(251):
        image = f"namanjain12/r2e_{t:03d}"
        for s, solved in enumerate(solved_pattern(t)):
            if s == 0 and t in retried:
                lines.append(
                    json.dumps(
                        {
                            "docker_image": image,
                            "reward": 0.0,
                            "exit_reason": "env_exception",
                            "output_patch": "",
                        }
                    )
                )
            lines.append(
                json.dumps(
                    {
                        "docker_image": image,
                        "reward": 1.0 if solved else 0.0,
                        "exit_reason": "agent",
                        "output_patch": "diff",
                        "test_output": "",
                        "trajectory_steps": [],
                        "max_steps": 40,
                    }
                )
            )
    return lines


def write_lines(path: Path, lines: list[str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def tunix_for(run, step: int, fixture: str, with_times: bool = True) -> dict:
    """A Tunix summary fixture made the summary of `run`'s checkpoint of `step`."""
    d = json.loads((FIXTURES / fixture).read_text())
    row = run.row(step)
    d.update(
        checkpoint_step=step,
        checkpoint_timestamp_ms=row.timestamp_ms,
        samples_count=row.samples_count,
    )
    if with_times:
        d.update(eval_start_ms=START + step, eval_stop_ms=STOP + step)
    return d
