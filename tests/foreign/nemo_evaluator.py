"""A NeMo-RL-shaped deferred evaluator for tests: what NeMo-RL's ``mlperf_grpo_deferred`` does to
its files (``../shared/reference/nemo-rl.md``), no rcpflow code, no model.

    MLPERF_MLLOG_FILE=LOG python tests/foreign/nemo_evaluator.py --checkpoint-root VIEW \
        --log-dir DIR [--threshold 0.69] [--accuracy A]

It reads every ``step_<digits>`` under VIEW sorted by step (rcpflow gives it a view holding one
checkpoint, as NeMo-RL's own driver does per checkpoint), requires ``current_step == N``, a
positive timestamp and consumed_samples, and ``policy/weights/``; per checkpoint it appends to
the MLLOG (official ``mlperf_logging`` API) ``eval_start {samples_count, step}``,
``eval_accuracy {samples_count}``, ``eval_stop {samples_count, step}`` with wall-clock times,
where samples_count = consumed_samples x 16; it stops at the first ``accuracy >= threshold``
(NeMo-RL's rule, not the checker's ``>``) with its own ``run_stop status=success`` backdated to
that checkpoint's weight update, else ``run_stop status=aborted`` at the last one. It keeps no
result file and no per-attempt record: a stdout line ``Deferred evaluation step N:
accuracy=...``. A FIXTURE: the accuracy is the share of the 251 tasks easier than the
checkpoint's skill (task i: difficulty (i + 0.5) / 251), or ``--accuracy``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

try:
    from nemo_trainer import WEIGHTS, mllogger  # run as a script: tests/foreign on sys.path
except ImportError:
    from foreign.nemo_trainer import WEIGHTS, mllogger

INSTANCES = 251
GENERATIONS = 16


def accuracy_of(skill: float) -> float:
    return sum(skill > (i + 0.5) / INSTANCES for i in range(INSTANCES)) / INSTANCES


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-root", required=True)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--threshold", type=float, default=0.69)
    p.add_argument("--accuracy", type=float, default=None, help="instead of the skill's")
    args = p.parse_args(argv)
    log_file = os.environ.get("MLPERF_MLLOG_FILE")
    if not log_file:
        print("MLPERF_MLLOG_FILE is not set", file=sys.stderr)
        return 2
    steps = sorted(
        int(m.group(1))
        for name in os.listdir(args.checkpoint_root)
        if (m := re.fullmatch(r"step_(\d+)", name))
    )
    if not steps:
        print(f"no step_<N> under {args.checkpoint_root}", file=sys.stderr)
        return 1
    log = mllogger(log_file)
    for i, step in enumerate(steps):
        folder = os.path.join(args.checkpoint_root, f"step_{step}")
        with open(os.path.join(folder, "training_info.json")) as f:
            info = json.load(f)
        ts, consumed = info["training_step_end_time_ms"], info["consumed_samples"]
        if info["current_step"] != step or ts <= 0 or consumed <= 0:
            print(f"step {step}: training_info.json does not add up", file=sys.stderr)
            return 1
        if not os.path.isdir(os.path.join(folder, "policy", "weights")):
            print(f"step {step}: no policy/weights/", file=sys.stderr)
            return 1
        os.makedirs(os.path.join(args.log_dir, f"step_{step}", "runtime"), exist_ok=True)
        samples = consumed * GENERATIONS
        log.start(key="eval_start", metadata={"samples_count": samples, "step": step})
        with open(os.path.join(folder, WEIGHTS, "common.pt")) as f:
            skill = json.load(f)["skill"]
        time.sleep(0.01)  # "validate()"
        acc = accuracy_of(skill) if args.accuracy is None else args.accuracy
        log.event(key="eval_accuracy", value=acc, metadata={"samples_count": samples})
        log.end(key="eval_stop", metadata={"samples_count": samples, "step": step})
        print(f"Deferred evaluation step {step}: accuracy={acc}", flush=True)
        last = i == len(steps) - 1
        if acc >= args.threshold or last:
            status = "success" if acc >= args.threshold else "aborted"
            meta = {"status": status, "samples_count": samples}
            log.end(key="run_stop", metadata=meta, time_ms=ts)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
