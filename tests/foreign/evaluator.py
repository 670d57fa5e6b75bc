"""A foreign evaluator for tests: reads `tests/foreign/trainer.py`'s checkpoints and writes what
Tunix's DeepSWE pipeline writes, at a Tunix-style path, without any rcpflow code.

    python tests/foreign/evaluator.py --checkpoint C/step-0005 --step 5 --output-root E
        -> E/step_5/<UTC stamp>-<8 hex>/summary.json            (Tunix's summary format)
           E/step_5/<UTC stamp>-<8 hex>/attempts/attempts.jsonl (DeepSWE per-attempt records)

A FIXTURE, not a model: the checkpoint's precomputed `skill` decides every outcome. Task i of
the 251 has difficulty (i + 0.5) / 251; its attempt a is solved when skill > difficulty + 0.05 a.
So pass@4 is the share of tasks easier than the skill and pass@1 is lower, and both are computed
here from the attempts, honestly: an attempts file and a summary that agree. As Tunix's tool does,
the summary carries no eval wall clock and its own `target_reached` (with >=); one attempt per
evaluation is an infrastructure failure (``valid: false``) retried with a new attempt_index, which
counts nowhere. ``--corrupt pass4`` writes a summary whose pass@4 its attempts do not give (for
tests that must see it refused).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import sys

INSTANCES = 251
ATTEMPTS = 4
SCHEMA = "canon.p46.deepswe-eval.trajectory.v4"
TARGET = 0.69


def outcomes(skill: float) -> list[list[bool]]:
    return [
        [skill > (i + 0.5) / INSTANCES + 0.05 * a for a in range(ATTEMPTS)]
        for i in range(INSTANCES)
    ]


def records(solved: list[list[bool]]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i, attempts in enumerate(solved):
        image = f"deepswe/task-{i:03d}:latest"
        for a, ok in enumerate(attempts):
            base = {
                "schema": SCHEMA,
                "task_key": image,
                "instance_id": f"task-{i:03d}",
                "docker_image": image,
                "sample_index": a,
                "elapsed_secs": 1.0,
                "trajectory": [],
            }
            attempt_index = 0
            if i == 7 and a == 1:  # a sandbox that died: retried, never counted
                out.append(
                    {**base, "attempt_index": 0, "status": "SANDBOX_ERROR", "reward": 0.0,
                     "solved": False, "valid": False, "validity_reason": "sandbox crashed"}
                )  # fmt: skip
                attempt_index = 1
            status = "SUCCEEDED" if ok or a % 2 == 0 else "MAX_STEPS_REACHED"
            out.append(
                {**base, "attempt_index": attempt_index, "status": status,
                 "reward": 1.0 if ok else 0.0, "solved": ok, "valid": True,
                 "validity_reason": None}
            )  # fmt: skip
    return out


def summary(
    solved: list[list[bool]], ckpt: dict[str, object], corrupt: bool = False
) -> dict[str, object]:
    expected = INSTANCES * ATTEMPTS
    resolved = sum(map(sum, solved))
    pass4 = sum(any(t) for t in solved) / INSTANCES  # n = k = 4: a task passes if any did
    unsolved_stopped = sum(1 for t in solved for a, ok in enumerate(t) if not ok and a % 2 == 1)
    return {
        "instances": INSTANCES,
        "attempts_per_instance": ATTEMPTS,
        "expected_attempts": expected,
        "completed_attempts": expected,
        "missing_attempts": 0,
        "error_attempts": 0,
        "resolved_attempts": resolved,
        "avg_at_k": resolved / expected,
        "pass_at_k": {"1": resolved / expected, "4": 1.0 if corrupt else pass4},
        "mean_reward": resolved / expected,
        "status_counts": {
            "MAX_STEPS_REACHED": unsolved_stopped,
            "SUCCEEDED": expected - unsolved_stopped,
        },
        "complete": True,
        "fatal_error": None,
        "rcp_logged": False,
        "target_accuracy": TARGET,
        "target_reached": pass4 >= TARGET,
        "checkpoint_step": ckpt["global_step"],
        "checkpoint_timestamp_ms": ckpt["timestamp_ms"],
        "samples_count": ckpt["samples_count"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--output-root", required=True)
    p.add_argument("--corrupt", choices=("pass4",))
    args = p.parse_args(argv)

    with open(os.path.join(args.checkpoint, "weights.json")) as f:
        ckpt = json.load(f)
    if ckpt["global_step"] != args.step:
        print(f"error: {args.checkpoint} is step {ckpt['global_step']}, not {args.step}")
        return 1
    solved = outcomes(float(ckpt["skill"]))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.join(args.output_root, f"step_{args.step}", f"{stamp}-{secrets.token_hex(4)}")
    os.makedirs(os.path.join(out, "attempts"))
    with open(os.path.join(out, "attempts", "attempts.jsonl"), "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records(solved))
    result = summary(solved, ckpt, corrupt=args.corrupt == "pass4")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(f"step {args.step}: pass_at_k {result['pass_at_k']} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
